"""The dense head: the model's pooled vector per doc in a faiss store (indexes/faiss_store.py).

It is the index's own head: its store's settings (faiss factory, IVF training sample, seed) and its manifest keys
(``files.faiss``, ``dim``, ``metric``, …) are the dense index's top-level ones, so it has no section of its own.
Its search is the index's plain vector search, queries by the index's query encoder (a query tower when one is
recorded).
"""

from __future__ import annotations

import numpy as np

from retrctl.indexes.faiss_store import FaissStore
from retrctl.indexes.heads.base import Head


class DenseHead(Head):
    name = "dense"
    encoded = True
    rank_weight = 1.0  # BGE-M3's s_rank weight (arXiv:2402.03216, §4)

    def new_store(self, idx) -> FaissStore:
        return FaissStore(idx.dim, idx.index_type, train_size=idx.train_size, seed=idx.seed)

    def columns(self, out: dict) -> np.ndarray:
        return out["dense"]

    def alone(self, encoder, texts: list[str], batch_size: int) -> np.ndarray:
        return encoder.encode(texts, kind="passage", batch_size=batch_size)  # any encoder has it (ONNX, token lookup)

    def section(self, store) -> None:
        return None

    @classmethod
    def files(cls, manifest: dict) -> list:
        return [manifest["files"]["faiss"], manifest["files"].get("vectors")]

    def read(self, idx, directory, manifest: dict, n: int) -> FaissStore:
        return FaissStore.read(directory, manifest["files"], n, idx.index_type, train_size=idx.train_size, seed=idx.seed)

    def run(self, idx, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        return idx.dense_search(queries, k)

    def score(self, idx, query: dict, docids) -> dict[str, float]:
        return idx.dense_score(query, docids)

    def raw_scores(self, idx, part, rows: np.ndarray) -> np.ndarray:
        return idx.vectors_at(rows) @ part
