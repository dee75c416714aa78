"""A dense index that also holds the model's sparse head: one sub-index per head, one pass over the corpus.

``retrctl index --model M`` on a model with a sparse head (``train --heads dense,sparse``) builds both by default
(``--heads dense`` for the vectors alone): ``Encoder.encode_heads`` runs the backbone once per batch for the
pooled vector and the SPLADE term weights, the vectors go to faiss as in ``DenseIndex`` and the sparse rows to
``terms.npy``/``weights.npy`` beside them (the layout of indexes/sparse.py), in the same version, under the same
docids. The manifest stays the dense backend's, with ``settings.heads`` naming the heads and a ``sparse`` section
(vocabulary, special tokens, query mode) so the sparse query side needs no model: LightRetriever's token counts
come from the tokenizer alone, so a token-lookup dense side plus the sparse side search with no transformer.

Updates, resume and merges are ``DenseIndex``'s: each encoded chunk is one array, [vector | packed sparse row],
checkpointed and appended, replaced and removed as a unit (``_append_vectors``, ``_apply``), so the heads cannot
drift apart. ``search`` ranks by each head asked for (``--heads``, default all) and fuses their lists with
``retrctl.fusion`` (``--fusion linear --norm minmax`` by default, each head's top ``--depth`` 100), so a search of
both heads equals ``retrctl fuse`` of the two single-head runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from retrctl import fusion
from retrctl.errors import UsageError
from retrctl.indexes import base, store
from retrctl.indexes.dense import DenseIndex
from retrctl.indexes.sparse import SparseSearch, pack, unpack
from retrctl.models import config


def parse_heads(value, encoder=None) -> list[str]:
    try:
        return config.parse_heads(value, getattr(encoder, "sparse", None) is not None)
    except ValueError as e:
        raise UsageError(str(e)) from None


class HeadsIndex(SparseSearch, DenseIndex):
    search_knobs = (*DenseIndex.search_knobs, "heads", "fusion", "norm", "weights", "rrf_k", "depth", "sparse_search",
                    "query_cut", "heap_factor")

    def __init__(self, encoder, index_type: str = "Flat", batch_size: int = 32, *, heads=config.INDEX_HEADS, top_k: int | None = None,
                 **settings):
        self.built = list(heads)  # the heads stored; ``heads`` (a search knob) are the ones searched
        self.heads = list(heads)
        self.fusion, self.norm, self.weights, self.rrf_k, self.depth = "linear", "minmax", None, 60.0, 100
        self.sparse_desc = None
        sp = getattr(encoder, "sparse", None)
        if sp is not None:
            sp.top_k = top_k or sp.top_k
            self.sparse_desc = {"vocab": sp.vocab, "special_ids": sp.special_ids, "query": sp.query, "top_k": sp.top_k}
        self.top_k = top_k or (sp.top_k if sp is not None else None)
        super().__init__(encoder, index_type, batch_size, **settings)

    @classmethod
    def for_heads(cls, encoder, heads, *, top_k: int | None = None, **settings) -> DenseIndex:
        """``DenseIndex.create`` for ``--heads`` other than the default of a dense-only model."""
        heads = parse_heads(heads, encoder)
        if heads == ["dense"]:
            return DenseIndex(encoder, **settings)
        if getattr(encoder, "sparse", None) is None:
            raise UsageError(f"--heads {','.join(heads)}: {getattr(encoder, 'source', 'the model')} has no sparse head "
                             "(train one with --heads dense,sparse)")
        if "dense" not in heads:
            raise UsageError("--heads sparse alone is --method sparse")
        return cls(encoder, heads=heads, top_k=top_k, **settings)

    def config(self) -> dict:
        return {**super().config(), "heads": self.built, "top_k": self.top_k}

    def describe(self) -> str:
        return f"{super().describe()}; heads {','.join(self.built)} (sparse top-{self.top_k}, queries by {self.sparse_desc['query']})"

    # ------------------------------------------------------------ storage: the sparse rows beside the vectors

    def _clear(self) -> None:
        super()._clear()
        self._sparse: list[np.ndarray] = []
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
        out = self.encoder.encode_heads(texts, "passage", self.batch_size, heads=("dense", "sparse"))
        return np.concatenate([out["dense"], pack(*out["sparse"])], axis=1)

    def _append_vectors(self, rows: np.ndarray) -> None:
        super()._append_vectors(np.ascontiguousarray(rows[:, : self.dim]))
        self._sparse.append(rows[:, self.dim :])
        self._rows_changed()

    def _apply(self, replaced: dict, removed: list[int]) -> None:
        if replaced or removed:
            rows = self.sparse_rows()
            for pos, (_, v) in replaced.items():
                rows[pos] = v[self.dim :]
            keep = np.ones(len(rows), dtype=bool)
            keep[removed] = False
            self._sparse = [rows[keep]]
            self._rows_changed()
        super()._apply({pos: (h, v[: self.dim]) for pos, (h, v) in replaced.items()}, removed)

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

    def search(self, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        heads = parse_heads(self.heads)
        missing = [h for h in heads if h not in self.built]
        if missing:
            raise UsageError(f"--heads {','.join(heads)}: this index holds {','.join(self.built)}")
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
        """The dense score when only the dense head is searched; a fused rank has no per-doc score to give."""
        return super().score(query, docids) if parse_heads(self.heads) == ["dense"] else {}

    # ------------------------------------------------------------ files

    def manifest(self) -> dict:
        nnz = int(self.matrix().nnz) if len(self) and self.sparse_desc else 0
        return {**super().manifest(), "sparse": {**(self.sparse_desc or {}), "nonzeros": nnz,
                                                 "files": {"terms": "terms.npy", "weights": "weights.npy",
                                                           **self._seismic_files}}}

    _seismic_files: dict = {}

    def write_files(self, directory: Path) -> None:
        terms, weights = unpack(self.sparse_rows())
        np.save(directory / "terms.npy", terms)
        np.save(directory / "weights.npy", weights)
        self._seismic_files = self.write_seismic(directory, self.matrix())
        super().write_files(directory)  # faiss, docids, and the manifest last

    @classmethod
    def load(cls, directory, encoder=None, device=None, query_encoder: str = "full", **overrides) -> HeadsIndex:
        idx = super().load(directory, encoder=encoder, device=device, query_encoder=query_encoder, **overrides)
        path, manifest = idx.version.path, idx.version.manifest
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
        return idx

    @classmethod
    def merge(cls, parts: list[HeadsIndex]) -> HeadsIndex:
        if any(p.top_k != parts[0].top_k for p in parts):
            raise ValueError("cannot merge indexes that keep different numbers of sparse terms")
        out = super().merge(parts)
        out.sparse_desc = parts[0].sparse_desc
        out._sparse, out._csr = [np.concatenate([p.sparse_rows() for p in parts])], None
        return out


DenseIndex.multi_head = HeadsIndex
