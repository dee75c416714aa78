"""Searching several heads of one index (indexes/heads/): their lists fused, or candidates re-scored by s_rank.

``search`` without a head that re-scores ranks by each head asked for (``--heads``, default all: ``Head.run``) and
fuses their lists with ``retrctl.fusion`` (``--fusion linear --norm minmax`` by default, each head's top ``--depth``
100), so a search of two heads equals ``retrctl fuse`` of the two single-head runs (the bm25 head's and the dense
head's: of the bm25 and dense backends' runs at the same settings).

With colbert it is BGE-M3's hybrid re-scoring (Chen et al. 2024, arXiv:2402.03216, §3.2): candidates are the union
of each ``--candidates`` head's top ``--depth`` (default: the other searched heads; ``all`` = every doc, a
brute-force multi-vector search), each re-scored exactly as s_rank = w_dense·s_dense + w_sparse·s_lex +
w_colbert·s_mul over the searched heads (raw scores: ``Head.raw_scores``, from one pass of the model over the
queries), ``--weights`` in the heads' order, default each head's ``rank_weight`` (1, 0.3, 1: the paper's).

`index` may record the fusion flags (``--fusion``, ``--norm``, ``--weights``, …) as the index's search defaults
(``search_defaults``: weights kept per head), so a recipe's chosen weight needs no flag at search time; flags given
to `search` win.

``idx`` is a ``dense.HeadsIndex``: its heads (``held``), stores, encoder and search knobs are read through its
public attributes and methods.
"""

from __future__ import annotations

import math

import numpy as np

from retrctl import fusion
from retrctl.errors import UsageError
from retrctl.indexes import base
from retrctl.indexes.heads.base import names
from retrctl.models.config import HEADS_HELP

ONE_HEAD = ("--{flag}: this {backend} index has one head (index it with --heads dense,bm25, or with a model trained "
            "with --heads dense,sparse)")

# the fusion flags (--fusion --norm --weights --rrf-k --depth) are the shared ones of fuse and eval (retrctl/stage.py);
# `search` sets them on an index that takes them (``FUSION_KNOBS``) and refuses them, with ONE_HEAD, elsewhere
FUSION_KNOBS = ("fusion", "norm", "weights", "rrf_k", "depth")
NOT_FUSED = ("--fusion/--norm/--rrf-k: a search with colbert ranks by the weighted sum of raw scores (--weights), not "
             "by fusion")
SEARCH_FLAGS = (
    base.Flag("heads", f"{HEADS_HELP} [default: every head the index holds]", refused=ONE_HEAD),
    base.Flag("candidates", "With colbert: the heads whose top --depth are re-scored (dense, sparse, comma-separated), "
              "or all (every doc, brute force). [default: the other heads searched; colbert alone: all]", refused=ONE_HEAD),
)


def _searched(idx) -> list[str]:
    asked = names(idx.heads)
    if not asked or any(h not in idx.held for h in asked):
        raise UsageError(f"--heads {','.join(asked)}: this index holds {','.join(idx.built)}")
    heads = [h for h in idx.built if h in asked]
    if idx.candidates is not None and not _rescoring(idx, heads):
        raise UsageError(f"--candidates: only a search with a head that re-scores (colbert) takes candidates; this one "
                         f"fuses {','.join(heads)}")
    return heads


def _rescoring(idx, heads: list[str]) -> bool:
    return any(idx.held[h].rescores for h in heads)


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
    if _rescoring(idx, idx.built):
        if set(out) - {"weights", "depth"}:
            raise UsageError(NOT_FUSED)
    else:
        fusion.check(len(idx.built), out.get("fusion", fusion.METHOD), out.get("rrf_k", fusion.RRF_K),
                     None if weights is None else list(weights.values()), out.get("norm", fusion.NORM), out.get("depth"))
    return out


def _weights(idx, heads: list[str]) -> list[float] | None:
    """The weights of the heads searched: ``--weights`` as given, or those the index recorded per head."""
    if isinstance(idx.weights, dict):
        return [float(idx.weights[h]) for h in heads]
    return idx.weights


def search(idx, queries: list[dict], k: int) -> tuple[dict[str, list[tuple[str, float]]], dict[str, dict]]:
    """``idx``'s search over the heads ``idx.heads`` names: one head's list, their fused lists, or the candidates
    re-scored by s_rank. Also returns each query's encoded heads by query text (a re-scoring's; else none), which
    ``score`` takes back."""
    heads = _searched(idx)
    if _rescoring(idx, heads):
        return _rescore(idx, queries, heads, k)
    if len(heads) == 1:
        return idx.held[heads[0]].run(idx, queries, k), {}
    weights = fusion.check(len(heads), idx.fusion, idx.rrf_k, _weights(idx, heads), idx.norm)  # UsageError
    read = fusion.read_by(weights)  # a head weighted 0 is not searched: the fusion leaves its list out
    depth = max(k, idx.depth)
    runs = [idx.held[h].run(idx, queries, depth) if i in read else {} for i, h in enumerate(heads)]
    if idx.remove_query:  # the query's own doc leaves each list before fusion scales it, as in `fuse` of such runs
        runs = [{q: [(d, s) for d, s in hits if d != q] for q, hits in run.items()} for run in runs]
    try:
        return fusion.fuse(runs, method=idx.fusion, k=idx.rrf_k, weights=weights, norm=idx.norm, hits=k), {}
    except ValueError as e:
        raise UsageError(str(e)) from None


def score(idx, query: dict, docids, part: dict) -> dict[str, float]:
    """With a re-scoring head searched, s_rank (what the hybrid search ranks by; ``part``: the query's encoded heads
    from the last search, if it had them); one head's own score when it is searched alone; a fused rank has no
    per-doc score to give."""
    heads = _searched(idx)
    if not _rescoring(idx, heads):
        return idx.held[heads[0]].score(idx, query, docids) if len(heads) == 1 else {}
    found = idx.positions(docids)
    if not found:
        return {}
    if not set(heads) <= part.keys():
        part = _encode_parts(idx, [query], set(heads))[0]
    rows = np.array(list(found.values()), np.int64)
    return dict(zip(found, _s_rank(idx, part, rows, heads, _rank_weights(idx, heads)).tolist(), strict=True))


# ------------------------------------------------------------ the hybrid re-scoring (BGE-M3)


def _candidate_heads(idx, heads: list[str]) -> list[str]:
    """The heads whose top --depth are re-scored; [] = every doc."""
    if idx.candidates is None:
        return [h for h in heads if not idx.held[h].rescores]
    if idx.candidates == "all":
        return []
    cands = names(idx.candidates)
    if not cands or any(h not in idx.held for h in cands):
        raise UsageError(f"--candidates {idx.candidates}: this index holds {','.join(idx.built)}")
    rescoring = [h for h in cands if idx.held[h].rescores]
    if rescoring:
        others = [h for h in idx.built if not idx.held[h].rescores]
        raise UsageError(f"--candidates {','.join(rescoring)}: it only re-scores, with no candidate search of its own "
                         f"(colbert: no PLAID centroids); give {', '.join(others)} or all")
    return [h for h in idx.built if h in cands]


def _rank_weights(idx, heads: list[str]) -> list[float]:
    if (idx.fusion, idx.norm, idx.rrf_k) != (fusion.METHOD, fusion.NORM, fusion.RRF_K):  # the defaults: none given
        raise UsageError(NOT_FUSED)
    if idx.weights is None:
        return [idx.held[h].rank_weight for h in heads]
    w = [float(x) for x in _weights(idx, heads)]
    if len(w) != len(heads) or not all(math.isfinite(x) for x in w):
        raise UsageError(f"--weights {','.join(f'{x:g}' for x in w)}: give one finite weight per head searched, in "
                         f"{','.join(heads)} order")
    return w


def _encode_parts(idx, queries: list[dict], need: set[str]) -> list[dict]:
    """Each query's heads in ``need`` from one pass of the model (a head whose queries need no model runs none)."""
    heads = [idx.held[h] for h in idx.built if h in need]
    for head in heads:
        head.check_queries(idx)
    model_heads = tuple(head.name for head in heads if head.encoded_queries(idx))
    out = idx.encoder.encode_heads([q["query_text"] for q in queries], "query", idx.batch_size, heads=model_heads)
    parts = {head.name: head.query_parts(idx, queries, out) for head in heads}
    return [{h: p[i] for h, p in parts.items()} for i in range(len(queries))]


def _rescore(idx, queries: list[dict], heads: list[str], k: int) -> tuple[dict, dict]:
    cands, weights = _candidate_heads(idx, heads), _rank_weights(idx, heads)
    parts = _encode_parts(idx, queries, set(heads) | set(cands))
    found = [set() for _ in queries]
    depth = max(k, idx.depth)
    for head in cands:
        _, lists = idx.held[head].candidates(idx, [p[head] for p in parts], depth)
        for seen, ids in zip(found, lists, strict=True):
            seen.update(idx.positions(ids).values())
    key, every = idx.order_key(), np.arange(len(idx), dtype=np.int64)
    out = {}
    for q, part, seen in zip(queries, parts, found, strict=True):
        rows = np.array(sorted(seen), np.int64) if cands else every
        s = _s_rank(idx, part, rows, heads, weights)
        top = base.top_k(s, key[rows], k)
        out[q["query_id"]] = [(idx.docids[rows[t]], float(s[t])) for t in top]
    return out, {q["query_text"]: p for q, p in zip(queries, parts, strict=True)}


def _s_rank(idx, part: dict, rows: np.ndarray, heads: list[str], weights: list[float]) -> np.ndarray:
    total = np.zeros(len(rows), np.float32)
    for head, w in zip(heads, weights, strict=True):
        total += w * idx.held[head].raw_scores(idx, part[head], rows)
    return total
