"""A dense index that also holds the model's other heads: one sub-index per head, one pass over the corpus.

``retrctl index --model M`` on a model with a sparse head (``train --heads dense,sparse``: SPLADE, or BGE-M3's lexical
head) and/or a colbert head (``train --heads dense,lexical,colbert``) builds every head it has by default
(``--heads`` picks a subset; dense is required; ``lexical`` = ``sparse``): ``Encoder.encode_heads`` runs the backbone
once per batch for the pooled vector, the term weights and the token vectors. The vectors go to faiss as in
``DenseIndex``, the sparse rows to ``terms.npy``/``weights.npy`` beside them (the layout of indexes/sparse.py), the
token vectors to ``colbert.tokens.npy``/``colbert.offsets.npy`` (indexes/multivector.py: fp16, flat + offsets), in
the same version, under the same docids. The manifest stays the dense backend's, with ``settings.heads`` naming the
heads, a ``sparse`` section (vocabulary, special tokens, query mode) so the sparse query side needs no model
(LightRetriever's token counts come from the tokenizer alone), and a ``colbert`` section (dim, token count, files).

Updates, resume and merges are ``DenseIndex``'s: each encoded chunk is one array, [vector | packed sparse row |
token count | fp16 token values as float32 lanes, padded to the chunk's longest doc], checkpointed and appended,
replaced and removed as a unit (``_append_vectors``, ``_apply``), so the heads cannot drift apart; rows of different
chunks may differ in width, as the plumbing takes rows one chunk or one row at a time.

``search`` without colbert ranks by each head asked for (``--heads``, default all) and fuses their lists with
``retrctl.fusion`` (``--fusion linear --norm minmax`` by default, each head's top ``--depth`` 100), so a search of
both heads equals ``retrctl fuse`` of the two single-head runs. With colbert it is BGE-M3's hybrid re-scoring
(Chen et al. 2024, arXiv:2402.03216, §3.2): candidates are the union of each ``--candidates`` head's top
``--depth`` (default: the other searched heads; ``all`` = every doc, a brute-force multi-vector search), each
re-scored exactly as s_rank = w_dense·s_dense + w_sparse·s_lex + w_colbert·s_mul over the searched heads (raw
scores: the stored vectors' inner product, the sparse dot product, MaxSim averaged over the query's tokens),
``--weights`` in dense,sparse,colbert order, default 1, 0.3, 1 (the paper's).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np

from retrctl import fusion
from retrctl.errors import UsageError
from retrctl.indexes import base, store
from retrctl.indexes.dense import DenseIndex
from retrctl.indexes.multivector import TokenStore, to_lanes
from retrctl.indexes.sparse import SparseSearch, pack, unpack
from retrctl.models import config

log = logging.getLogger("retrctl.index")
RANK_WEIGHTS = {"dense": 1.0, "sparse": 0.3, "colbert": 1.0}  # BGE-M3's s_rank weights (arXiv:2402.03216, §4)
TRAIN_HINT = {"sparse": "dense,sparse", "colbert": "dense,lexical,colbert"}


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


class HeadsIndex(SparseSearch, DenseIndex):
    search_knobs = (*DenseIndex.search_knobs, "heads", "fusion", "norm", "weights", "rrf_k", "depth", "candidates",
                    "sparse_search", "query_cut", "heap_factor")

    def __init__(self, encoder, index_type: str = "Flat", batch_size: int = 32, *, heads=config.INDEX_HEADS, top_k: int | None = None,
                 **settings):
        self.built = list(heads)  # the heads stored; ``heads`` (a search knob) are the ones searched
        self.heads = list(heads)
        self.fusion, self.norm, self.weights, self.rrf_k, self.depth = "linear", "minmax", None, 60.0, 100
        self.candidates = None  # with colbert: heads whose top --depth are re-scored, or "all"
        self.sparse_desc, self.top_k = None, top_k if "sparse" in self.built else None
        sp = getattr(encoder, "sparse", None)
        if sp is not None and "sparse" in self.built:
            sp.top_k = self.top_k = index_top_k(sp, top_k)
            self.sparse_desc = {"vocab": sp.vocab, "special_ids": sp.special_ids, "query": sp.query, "top_k": sp.top_k}
        cb = getattr(encoder, "colbert", None)
        self.colbert_dim = cb.out_dim if cb is not None and "colbert" in self.built else None
        self._last_parts: dict[str, dict] = {}  # query text -> its encoded heads, of the last hybrid search
        super().__init__(encoder, index_type, batch_size, **settings)

    @classmethod
    def for_heads(cls, encoder, heads, *, top_k: int | None = None, **settings) -> DenseIndex:
        """``DenseIndex.create`` for ``--heads`` other than the default of a dense-only model."""
        heads = parse_heads(heads, encoder)
        if heads == ["dense"]:
            return DenseIndex(encoder, **settings)
        for head in heads:
            if head != "dense" and getattr(encoder, head, None) is None:
                raise UsageError(f"--heads {','.join(heads)}: {getattr(encoder, 'source', 'the model')} has no {head} "
                                 f"head (train one with --heads {TRAIN_HINT[head]})")
        if "dense" not in heads:
            raise UsageError(f"--heads {','.join(heads)}: an index holds the dense head too (--heads dense,{','.join(heads)})"
                             + ("; the sparse head alone is --method sparse" if heads == ["sparse"] else ""))
        return cls(encoder, heads=heads, top_k=top_k, **settings)

    def config(self) -> dict:
        return {**super().config(), "heads": self.built, "top_k": self.top_k}

    def describe(self) -> str:
        parts = []
        if self.sparse_desc:
            parts.append(f"sparse top-{self.top_k}, queries by {self.sparse_desc['query']}")
        if self.colbert_dim:
            parts.append(f"colbert dim {self.colbert_dim}, {len(self._tokens.arrays()[0])} tokens")
        sizes = bytes_per_doc(self.version.path, self.version.manifest) if self.version is not None else {}
        size = f"; bytes per doc: {', '.join(f'{h} {b:.0f}' for h, b in sizes.items())}" if sizes else ""
        return f"{super().describe()}; heads {','.join(self.built)} ({'; '.join(parts)}){size}"

    # ------------------------------------------------------------ storage: the other heads beside the vectors

    def _clear(self) -> None:
        super()._clear()
        self._sparse: list[np.ndarray] = []
        self._tokens = TokenStore(self.colbert_dim or 0)
        self._rows_changed()

    def sparse_rows(self) -> np.ndarray:
        if not self._sparse:
            return np.zeros((0, 2 * (self.top_k or 0)), np.float32)
        self._sparse = [np.concatenate(self._sparse)] if len(self._sparse) > 1 else self._sparse
        return self._sparse[0].copy()

    def matrix(self):
        from retrctl.models.sparse import to_csr

        if self._csr is None:
            self._csr = to_csr(*unpack(self.sparse_rows()), self.sparse_desc["vocab"])
        return self._csr

    def _doc_vectors(self, texts: list[str]) -> np.ndarray:
        out = self.encoder.encode_heads(texts, "passage", self.batch_size, heads=tuple(self.built))
        parts = [out["dense"]]
        if "sparse" in self.built:
            parts.append(pack(*out["sparse"]))
        if "colbert" in self.built:
            parts.append(to_lanes(out["colbert"], self.colbert_dim))
        return np.concatenate(parts, axis=1)

    def _split(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """A chunk's rows → each head's columns: [dense | packed sparse | colbert lanes]."""
        out, at = {"dense": rows[:, : self.dim]}, self.dim
        if "sparse" in self.built:
            out["sparse"], at = rows[:, at : at + 2 * self.top_k], at + 2 * self.top_k
        if "colbert" in self.built:
            out["colbert"] = rows[:, at:]
        return out

    def _append_vectors(self, rows: np.ndarray) -> None:
        parts = self._split(rows)
        super()._append_vectors(np.ascontiguousarray(parts["dense"]))
        if "sparse" in parts:
            self._sparse.append(parts["sparse"])
            self._rows_changed()
        if "colbert" in parts:
            self._tokens.append_lanes(parts["colbert"])

    def _apply(self, replaced: dict, removed: list[int]) -> None:
        parts = {pos: self._split(v[None]) for pos, (_, v) in replaced.items()}
        if (replaced or removed) and "sparse" in self.built:
            rows = self.sparse_rows()
            for pos, p in parts.items():
                rows[pos] = p["sparse"][0]
            keep = np.ones(len(rows), dtype=bool)
            keep[removed] = False
            self._sparse = [rows[keep]]
            self._rows_changed()
        if (replaced or removed) and "colbert" in self.built:
            self._tokens.apply({pos: p["colbert"][0] for pos, p in parts.items()}, removed)
        super()._apply({pos: (h, parts[pos]["dense"][0]) for pos, (h, _) in replaced.items()}, removed)

    # ------------------------------------------------------------ search

    def _sparse_queries(self, queries: list[dict]) -> np.ndarray:
        from retrctl.models.sparse import token_counts

        texts = [q["query_text"] for q in queries]
        if self.sparse_desc["query"] == "tokens":  # the tokenizer alone: no model runs (any query encoder has one)
            return pack(*token_counts(self.encoder.tokenizer, texts, self.encoder.config.query_max_len,
                                      self.sparse_desc["special_ids"]))
        if getattr(self.encoder, "sparse", None) is None:
            raise UsageError("this index's sparse queries run the model's sparse head: search with --query-encoder full")
        return pack(*self.encoder.encode_sparse(texts, "query", self.batch_size))

    def _searched(self) -> list[str]:
        heads = parse_heads(self.heads)
        missing = [h for h in heads if h not in self.built]
        if missing:
            raise UsageError(f"--heads {','.join(heads)}: this index holds {','.join(self.built)}")
        if self.candidates is not None and "colbert" not in heads:
            raise UsageError(f"--candidates: only a search with the colbert head re-scores candidates; this one fuses "
                             f"{','.join(heads)}")
        return heads

    def search(self, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        heads = self._searched()
        if "colbert" in heads:
            return self._rescore(queries, heads, k)
        depth = max(k, self.depth) if len(heads) > 1 else k
        runs = []
        if "dense" in heads:
            runs.append(super().search(queries, depth))
        if "sparse" in heads:
            scores, docids = self.search_rows(self.matrix(), self._sparse_queries(queries), depth, self._order_key(), self.docids)
            runs.append({q["query_id"]: [(d, float(s)) for d, s in zip(ids, row, strict=False)]
                         for q, ids, row in zip(queries, docids, scores, strict=True)})
        if len(runs) == 1:
            return runs[0]
        try:
            return fusion.fuse(runs, method=self.fusion, k=self.rrf_k, weights=self.weights, norm=self.norm, hits=k)
        except ValueError as e:
            raise UsageError(str(e)) from None

    def score(self, query: dict, docids) -> dict[str, float]:
        """With colbert searched, s_rank (what the hybrid search ranks by); the dense score when only the dense head is
        searched; a fused rank has no per-doc score to give."""
        heads = self._searched()
        if "colbert" not in heads:
            return super().score(query, docids) if heads == ["dense"] else {}
        docids = [d for d in docids if d in self._pos]
        if not docids:
            return {}
        part = self._last_parts.get(query["query_text"], {})
        if not set(heads) <= part.keys():
            part = self._encode_parts([query], set(heads))[0]
        rows = np.array([self._pos[d] for d in docids], np.int64)
        return dict(zip(docids, self._s_rank(part, rows, heads, self._rank_weights(heads)).tolist(), strict=True))

    # ------------------------------------------------------------ the hybrid re-scoring (BGE-M3)

    def _candidate_heads(self, heads: list[str]) -> list[str]:
        """The heads whose top --depth are re-scored; [] = every doc."""
        if self.candidates is None:
            return [h for h in heads if h != "colbert"]
        if self.candidates == "all":
            return []
        try:
            cands = config.parse_heads(self.candidates)
        except ValueError:
            raise UsageError(f"--candidates {self.candidates}: choose from dense, sparse (comma-separated) or all") from None
        if "colbert" in cands:
            raise UsageError("--candidates colbert: token vectors have no candidate index here (no PLAID centroids); "
                             "give dense, sparse or all")
        missing = [h for h in cands if h not in self.built]
        if missing:
            raise UsageError(f"--candidates {self.candidates}: this index holds {','.join(self.built)}")
        return cands

    def _rank_weights(self, heads: list[str]) -> list[float]:
        if (self.fusion, self.norm, self.rrf_k) != ("linear", "minmax", 60.0):
            raise UsageError("--fusion/--norm/--rrf-k: a search with colbert ranks by the weighted sum of raw scores "
                             "(--weights), not by fusion")
        if self.weights is None:
            return [RANK_WEIGHTS[h] for h in heads]
        w = [float(x) for x in self.weights]
        if len(w) != len(heads) or not all(math.isfinite(x) for x in w):
            raise UsageError(f"--weights {','.join(f'{x:g}' for x in w)}: give one finite weight per head searched, in "
                             f"{','.join(heads)} order")
        return w

    def _encode_parts(self, queries: list[dict], need: set[str]) -> list[dict]:
        """Each query's heads in ``need`` from one pass of the model (token-count sparse queries run none)."""
        if "colbert" in need and getattr(self.encoder, "colbert", None) is None:
            raise UsageError("this index's colbert queries run the model's colbert head: search with --query-encoder full")
        by_tokens = "sparse" in need and self.sparse_desc["query"] == "tokens"
        model_heads = tuple(h for h in config.INDEX_HEADS if h in need and not (h == "sparse" and by_tokens))
        out = self.encoder.encode_heads([q["query_text"] for q in queries], "query", self.batch_size, heads=model_heads)
        if "sparse" in need:
            out["sparse"] = self._sparse_queries(queries) if by_tokens else pack(*out["sparse"])
        return [{h: out[h][i] for h in need} for i in range(len(queries))]

    def _rescore(self, queries: list[dict], heads: list[str], k: int) -> dict[str, list[tuple[str, float]]]:
        cands, weights = self._candidate_heads(heads), self._rank_weights(heads)
        parts = self._encode_parts(queries, set(heads) | set(cands))
        self._last_parts = {q["query_text"]: p for q, p in zip(queries, parts, strict=True)}  # for score (mine)
        found = [set() for _ in queries]
        depth = max(k, self.depth)
        for head in cands:
            if head == "dense":
                _, lists = self.search_vectors(np.stack([p["dense"] for p in parts]), depth)
            else:
                _, lists = self.search_rows(self.matrix(), np.stack([p["sparse"] for p in parts]), depth,
                                            self._order_key(), self.docids)
            for seen, ids in zip(found, lists, strict=True):
                seen.update(self._pos[d] for d in ids)
        key, every = self._order_key(), np.arange(len(self), dtype=np.int64)
        out = {}
        for q, part, seen in zip(queries, parts, found, strict=True):
            rows = np.array(sorted(seen), np.int64) if cands else every
            s = self._s_rank(part, rows, heads, weights)
            top = base.top_k(s, key[rows], k)
            out[q["query_id"]] = [(self.docids[rows[t]], float(s[t])) for t in top]
        return out

    def _s_rank(self, part: dict, rows: np.ndarray, heads: list[str], weights: list[float]) -> np.ndarray:
        total = np.zeros(len(rows), np.float32)
        for head, w in zip(heads, weights, strict=True):
            if head == "dense":
                total += w * (self.vectors_at(rows) @ part["dense"])
            elif head == "sparse":
                from retrctl.models.sparse import to_csr

                q = to_csr(*unpack(part["sparse"][None]), self.sparse_desc["vocab"])
                total += w * (self.matrix()[rows] @ q.T).toarray()[:, 0]
            else:
                total += w * self._tokens.maxsim(part["colbert"], rows)
        return total

    # ------------------------------------------------------------ files

    def manifest(self) -> dict:
        out = super().manifest()
        if "sparse" in self.built:
            nnz = int(self.matrix().nnz) if len(self) else 0
            out["sparse"] = {**self.sparse_desc, "nonzeros": nnz, "files": {"terms": "terms.npy", "weights": "weights.npy",
                                                                            **self._seismic_files}}
        if "colbert" in self.built:
            out["colbert"] = self._tokens.manifest()
        return out

    _seismic_files: dict = {}

    def write_files(self, directory: Path) -> None:
        if "sparse" in self.built:
            terms, weights = unpack(self.sparse_rows())
            np.save(directory / "terms.npy", terms)
            np.save(directory / "weights.npy", weights)
            self._seismic_files = self.write_seismic(directory, self.matrix())
        if "colbert" in self.built:
            self._tokens.write(directory)
        super().write_files(directory)  # faiss, docids, and the manifest last
        sizes = bytes_per_doc(directory, json.loads((directory / base.MANIFEST).read_text()))
        log.info("index size per doc: %s", ", ".join(f"{h} {b:.0f} bytes" for h, b in sizes.items()))

    @classmethod
    def load(cls, directory, encoder=None, device=None, query_encoder: str = "full", **overrides) -> HeadsIndex:
        idx = super().load(directory, encoder=encoder, device=device, query_encoder=query_encoder, **overrides)
        path, manifest = idx.version.path, idx.version.manifest
        if "sparse" in idx.built:
            idx.sparse_desc = {k: v for k, v in manifest["sparse"].items() if k not in ("files", "nonzeros")}
            arrays = []
            for name in ("terms", "weights"):
                f = path / manifest["sparse"]["files"][name]
                with base.reading(f):
                    arrays.append(np.load(f))
                if arrays[-1].shape != (len(idx), idx.top_k):
                    raise store.damaged(f, f"shape {arrays[-1].shape} for {len(idx)} ids")
            idx._sparse = [pack(*arrays)]
            idx.find_seismic(path, manifest["sparse"]["files"])
        if "colbert" in idx.built:
            idx._tokens = TokenStore.read(path, manifest["colbert"], len(idx))
            idx.colbert_dim = idx._tokens.dim
        return idx

    @classmethod
    def merge(cls, parts: list[HeadsIndex]) -> HeadsIndex:
        if any(getattr(p, "built", ["dense"]) != parts[0].built or p.colbert_dim != parts[0].colbert_dim for p in parts):
            raise ValueError("cannot merge indexes of different heads or colbert dims")
        if any(p.top_k != parts[0].top_k for p in parts):
            raise ValueError("cannot merge indexes that keep different numbers of sparse terms")
        out = super().merge(parts)
        out.sparse_desc, out.colbert_dim = parts[0].sparse_desc, parts[0].colbert_dim
        out._sparse, out._csr = [np.concatenate([p.sparse_rows() for p in parts])], None
        out._tokens = TokenStore.joined([p._tokens for p in parts])
        return out


def bytes_per_doc(directory: Path, manifest: dict) -> dict[str, float]:
    """Each head's files in a version, in bytes per doc (the doc ids, shared, counted in none)."""
    files = manifest["files"]
    heads = {"dense": [files["faiss"], files.get("vectors")]}
    for head in ("sparse", "colbert"):
        if head in manifest:
            heads[head] = list(manifest[head]["files"].values())
    n = max(manifest.get("doc_count") or 0, 1)
    return {h: sum((directory / f).stat().st_size for f in names if f and (directory / f).is_file()) / n
            for h, names in heads.items()}


DenseIndex.multi_head = HeadsIndex
