"""Searching several heads of one index: a dense index built from a model with a sparse and/or colbert head holds
each head's store (indexes/dense.py), and its search is this module's, over those stores.

``retrctl index --model M`` on a model with a sparse head (``train --heads dense,sparse``: SPLADE, or BGE-M3's lexical
head) and/or a colbert head (``train --heads dense,lexical,colbert``) builds every head it has by default
(``--heads`` picks a subset; dense is required; ``lexical`` = ``sparse``): ``Encoder.encode_heads`` runs the backbone
once per batch for the pooled vector, the term weights and the token vectors. The vectors go to the faiss store, the
sparse rows to ``terms.npy``/``weights.npy`` beside them (the layout of indexes/sparse.py), the token vectors to
``colbert.tokens.npy``/``colbert.offsets.npy`` (indexes/multivector.py: fp16, flat + offsets), in the same version,
under the same docids. The manifest stays the dense backend's, with ``settings.heads`` naming the heads, a ``sparse``
section (vocabulary, special tokens, query mode) so the sparse query side needs no model (LightRetriever's token
counts come from the tokenizer alone), and a ``colbert`` section (dim, token count, files).

``search`` without colbert ranks by each head asked for (``--heads``, default all) and fuses their lists with
``retrctl.fusion`` (``--fusion linear --norm minmax`` by default, each head's top ``--depth`` 100), so a search of
both heads equals ``retrctl fuse`` of the two single-head runs. With colbert it is BGE-M3's hybrid re-scoring
(Chen et al. 2024, arXiv:2402.03216, §3.2): candidates are the union of each ``--candidates`` head's top
``--depth`` (default: the other searched heads; ``all`` = every doc, a brute-force multi-vector search), each
re-scored exactly as s_rank = w_dense·s_dense + w_sparse·s_lex + w_colbert·s_mul over the searched heads (raw
scores: the stored vectors' inner product, the sparse dot product, MaxSim averaged over the query's tokens),
``--weights`` in dense,sparse,colbert order, default 1, 0.3, 1 (the paper's).

A ``bm25`` head (``index --heads dense,bm25``: the corpus's BM25 beside the model's heads, the bm25 backend's store)
is one more list to fuse: a search of dense and bm25 equals ``retrctl fuse`` of the dense and bm25 backends' runs
at the same settings. `index` may record the fusion flags (``--fusion``, ``--norm``, ``--weights``, …) as the
index's search defaults (``search_defaults``: weights kept per head), so a recipe's chosen weight needs no flag at
search time; flags given to `search` win.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from retrctl import fusion
from retrctl.errors import UsageError
from retrctl.indexes import base
from retrctl.indexes.sparse import pack
from retrctl.models import config

log = logging.getLogger("retrctl.index")
RANK_WEIGHTS = {"dense": 1.0, "sparse": 0.3, "colbert": 1.0}  # BGE-M3's s_rank weights (arXiv:2402.03216, §4)
TRAIN_HINT = {"sparse": "dense,sparse", "colbert": "dense,lexical,colbert"}

HEADS_TO_INDEX = base.Flag("heads", f"{config.HEADS_HELP} [default: every head the model has]")
ONE_HEAD = ("--{flag}: this {backend} index has one head (index it with --heads dense,bm25, or with a model trained "
            "with --heads dense,sparse)")


# the fusion flags (--fusion --norm --weights --rrf-k --depth) are the shared ones of fuse and eval (retrctl/stage.py);
# `search` sets them on an index that takes them (``FUSION_KNOBS``) and refuses them, with ONE_HEAD, elsewhere
FUSION_KNOBS = ("fusion", "norm", "weights", "rrf_k", "depth")
SEARCH_FLAGS = (
    base.Flag("heads", f"{config.HEADS_HELP} [default: every head the index holds]", refused=ONE_HEAD),
    base.Flag("candidates", "With colbert: the heads whose top --depth are re-scored (dense, sparse, comma-separated), "
              "or all (every doc, brute force). [default: the other heads searched; colbert alone: all]", refused=ONE_HEAD),
)


def parse_heads(value, encoder=None) -> list[str]:
    try:
        return config.parse_heads(value, getattr(encoder, "sparse", None) is not None,
                                  getattr(encoder, "colbert", None) is not None)
    except ValueError as e:
        raise UsageError(str(e)) from None


def index_top_k(sp, top_k: int | None) -> int:
    """Terms kept per doc: ``--sparse-top-k``, else the head's; a lexical head keeping all (0) weighs only the doc's
    own tokens, so the longer length cap keeps every one; SPLADE's expansion over the vocabulary needs a cut."""
    k = top_k or sp.top_k
    if not k and sp.weights == "lexical":
        k = max(sp.config.query_max_len, sp.config.passage_max_len)
    if not k:
        raise UsageError("a sparse index keeps each doc's top-k terms: give --sparse-top-k N")
    return k


def _sparse_queries(idx, queries: list[dict]) -> np.ndarray:
    """The queries as packed sparse rows: token counts from the tokenizer, or the model's sparse head."""
    from retrctl.models.sparse import token_counts

    texts = [q["query_text"] for q in queries]
    if idx.sparse_desc["query"] == "tokens":  # the tokenizer alone: no model runs (any query encoder has one)
        return pack(*token_counts(idx.encoder.tokenizer, texts, idx.encoder.config.query_max_len,
                                  idx.sparse_desc["special_ids"]))
    if getattr(idx.encoder, "sparse", None) is None:
        raise UsageError("this index's sparse queries run the model's sparse head: search with --query-encoder full")
    return pack(*idx.encoder.encode_sparse(texts, "query", idx.batch_size))


def _sparse_search(idx, qrows: np.ndarray, k: int):
    st = idx.stores["sparse"]
    return st.search(qrows, k, idx.order_key(), idx.docids, **idx.search_knob_values(st))


def _searched(idx) -> list[str]:
    heads = parse_heads(idx.heads)
    missing = [h for h in heads if h not in idx.built]
    if missing:
        raise UsageError(f"--heads {','.join(heads)}: this index holds {','.join(idx.built)}")
    if idx.candidates is not None and "colbert" not in heads:
        raise UsageError(f"--candidates: only a search with the colbert head re-scores candidates; this one fuses "
                         f"{','.join(heads)}")
    return heads


def search_defaults(idx, defaults: dict) -> dict:
    """The fusion flags `index` records (``fusion``, ``norm``, ``rrf_k``, ``depth``, ``weights``), checked against
    the heads ``idx`` holds: ``weights`` as {head: weight}, from a list in the heads' order."""
    out = {k: v for k, v in defaults.items() if v is not None}
    unknown = set(out) - set(FUSION_KNOBS)
    if unknown:
        raise UsageError(f"search defaults {', '.join(sorted(unknown))}: only {', '.join(FUSION_KNOBS)} are recorded")
    weights = out.get("weights")
    if weights is not None and not isinstance(weights, dict):
        weights = fusion.complement([float(x) for x in weights], len(idx.built))
        if len(weights) != len(idx.built):
            raise UsageError(f"--weights {','.join(f'{x:g}' for x in weights)}: give one weight per head indexed, in "
                             f"{','.join(idx.built)} order")
        weights = out["weights"] = dict(zip(idx.built, (float(x) for x in weights), strict=True))
    if weights is not None and set(weights) != set(idx.built):
        raise UsageError(f"search defaults: weights for {','.join(weights)}, but this index holds {','.join(idx.built)}")
    if "colbert" in idx.built:
        if set(out) - {"weights", "depth"}:
            raise UsageError("--fusion/--norm/--rrf-k: a search with colbert ranks by the weighted sum of raw scores "
                             "(--weights), not by fusion")
    else:
        fusion.check(len(idx.built), out.get("fusion", fusion.METHOD), out.get("rrf_k", fusion.RRF_K),
                     None if weights is None else list(weights.values()), out.get("norm", fusion.NORM), out.get("depth"))
    return out


def _weights(idx, heads: list[str]) -> list[float] | None:
    """The weights of the heads searched: ``--weights`` as given, or those the index recorded per head."""
    if isinstance(idx.weights, dict):
        return [float(idx.weights[h]) for h in heads]
    return idx.weights


def search(idx, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
    """``idx``'s search over the heads ``idx.heads`` names: one head's list, their fused lists, or, with colbert,
    the candidates re-scored by s_rank."""
    heads = _searched(idx)
    if "colbert" in heads:
        return _rescore(idx, queries, heads, k)
    depth = max(k, idx.depth) if len(heads) > 1 else k
    runs = []
    if "dense" in heads:
        runs.append(idx.dense_search(queries, depth))
    if "sparse" in heads:
        scores, docids = _sparse_search(idx, _sparse_queries(idx, queries), depth)
        runs.append({q["query_id"]: [(d, float(s)) for d, s in zip(ids, row, strict=False)]
                     for q, ids, row in zip(queries, docids, scores, strict=True)})
    if "bm25" in heads:
        found = idx.stores["bm25"].search([q["query_text"] for q in queries], depth, idx.order_key(), idx.docids)
        runs.append({q["query_id"]: hits for q, hits in zip(queries, found, strict=True)})
    if len(runs) == 1:
        return runs[0]
    try:
        return fusion.fuse(runs, method=idx.fusion, k=idx.rrf_k, weights=_weights(idx, heads), norm=idx.norm, hits=k)
    except ValueError as e:
        raise UsageError(str(e)) from None


def score(idx, query: dict, docids) -> dict[str, float]:
    """With colbert searched, s_rank (what the hybrid search ranks by); the head's score when only the dense or the
    bm25 head is searched; a fused rank has no per-doc score to give."""
    heads = _searched(idx)
    if heads == ["bm25"]:
        found = {d: idx._pos[d] for d in docids if d in idx._pos}
        rows = np.fromiter(found.values(), np.int64, count=len(found))
        return dict(zip(found, idx.stores["bm25"].scores_at(query["query_text"], rows).tolist(), strict=True))
    if "colbert" not in heads:
        return idx.dense_score(query, docids) if heads == ["dense"] else {}
    docids = [d for d in docids if d in idx._pos]
    if not docids:
        return {}
    part = idx._last_parts.get(query["query_text"], {})
    if not set(heads) <= part.keys():
        part = _encode_parts(idx, [query], set(heads))[0]
    rows = np.array([idx._pos[d] for d in docids], np.int64)
    return dict(zip(docids, _s_rank(idx, part, rows, heads, _rank_weights(idx, heads)).tolist(), strict=True))


# ------------------------------------------------------------ the hybrid re-scoring (BGE-M3)


def _candidate_heads(idx, heads: list[str]) -> list[str]:
    """The heads whose top --depth are re-scored; [] = every doc."""
    if idx.candidates is None:
        return [h for h in heads if h != "colbert"]
    if idx.candidates == "all":
        return []
    try:
        cands = config.parse_heads(idx.candidates)
    except ValueError:
        raise UsageError(f"--candidates {idx.candidates}: choose from dense, sparse (comma-separated) or all") from None
    if "colbert" in cands:
        raise UsageError("--candidates colbert: token vectors have no candidate index here (no PLAID centroids); "
                         "give dense, sparse or all")
    missing = [h for h in cands if h not in idx.built]
    if missing:
        raise UsageError(f"--candidates {idx.candidates}: this index holds {','.join(idx.built)}")
    return cands


def _rank_weights(idx, heads: list[str]) -> list[float]:
    if (idx.fusion, idx.norm, idx.rrf_k) != (fusion.METHOD, fusion.NORM, fusion.RRF_K):  # the defaults: none given
        raise UsageError("--fusion/--norm/--rrf-k: a search with colbert ranks by the weighted sum of raw scores "
                         "(--weights), not by fusion")
    if idx.weights is None:
        return [RANK_WEIGHTS[h] for h in heads]
    w = [float(x) for x in _weights(idx, heads)]
    if len(w) != len(heads) or not all(math.isfinite(x) for x in w):
        raise UsageError(f"--weights {','.join(f'{x:g}' for x in w)}: give one finite weight per head searched, in "
                         f"{','.join(heads)} order")
    return w


def _encode_parts(idx, queries: list[dict], need: set[str]) -> list[dict]:
    """Each query's heads in ``need`` from one pass of the model (token-count sparse queries run none)."""
    if "colbert" in need and getattr(idx.encoder, "colbert", None) is None:
        raise UsageError("this index's colbert queries run the model's colbert head: search with --query-encoder full")
    by_tokens = "sparse" in need and idx.sparse_desc["query"] == "tokens"
    model_heads = tuple(h for h in config.MODEL_HEADS if h in need and not (h == "sparse" and by_tokens))
    out = idx.encoder.encode_heads([q["query_text"] for q in queries], "query", idx.batch_size, heads=model_heads)
    if "sparse" in need:
        out["sparse"] = _sparse_queries(idx, queries) if by_tokens else pack(*out["sparse"])
    return [{h: out[h][i] for h in need} for i in range(len(queries))]


def _rescore(idx, queries: list[dict], heads: list[str], k: int) -> dict[str, list[tuple[str, float]]]:
    cands, weights = _candidate_heads(idx, heads), _rank_weights(idx, heads)
    parts = _encode_parts(idx, queries, set(heads) | set(cands))
    idx._last_parts = {q["query_text"]: p for q, p in zip(queries, parts, strict=True)}  # for score (mine)
    found = [set() for _ in queries]
    depth = max(k, idx.depth)
    for head in cands:
        if head == "dense":
            _, lists = idx.search_vectors(np.stack([p["dense"] for p in parts]), depth)
        else:
            _, lists = _sparse_search(idx, np.stack([p["sparse"] for p in parts]), depth)
        for seen, ids in zip(found, lists, strict=True):
            seen.update(idx._pos[d] for d in ids)
    key, every = idx.order_key(), np.arange(len(idx), dtype=np.int64)
    out = {}
    for q, part, seen in zip(queries, parts, found, strict=True):
        rows = np.array(sorted(seen), np.int64) if cands else every
        s = _s_rank(idx, part, rows, heads, weights)
        top = base.top_k(s, key[rows], k)
        out[q["query_id"]] = [(idx.docids[rows[t]], float(s[t])) for t in top]
    return out


def _s_rank(idx, part: dict, rows: np.ndarray, heads: list[str], weights: list[float]) -> np.ndarray:
    total = np.zeros(len(rows), np.float32)
    for head, w in zip(heads, weights, strict=True):
        if head == "dense":
            total += w * (idx.vectors_at(rows) @ part["dense"])
        elif head == "sparse":
            total += w * idx.stores["sparse"].dot(part["sparse"], rows)
        else:
            total += w * idx.stores["colbert"].maxsim(part["colbert"], rows)
    return total


def bytes_per_doc(directory: Path, manifest: dict) -> dict[str, float]:
    """Each head's files in a version, in bytes per doc (the doc ids, shared, counted in none)."""
    files = manifest["files"]
    heads = {"dense": [files["faiss"], files.get("vectors")]}
    for head in ("sparse", "colbert", "bm25"):
        if head in manifest:
            heads[head] = list(manifest[head]["files"].values())
    n = max(manifest.get("doc_count") or 0, 1)
    return {h: sum(_size(directory / f) for f in names if f) / n for h, names in heads.items()}


def _size(path: Path) -> int:
    """A file's bytes, or every file's under a folder (bm25s's save is one)."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.is_file() else 0
