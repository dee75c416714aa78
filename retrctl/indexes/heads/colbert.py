"""The colbert head: BGE-M3's multi-vector head, each doc's token vectors in a ``multivector.TokenStore`` (fp16,
flat + offsets), scored by MaxSim.

It has no candidate search of its own (no PLAID centroids): a search with it re-scores the other heads' candidates,
or every doc (indexes/heads/search.py). Its columns of the chunk row are ``to_lanes``' variable width, the rest of
the row (its store's ``width`` is None).
"""

from __future__ import annotations

import numpy as np

from retrctl.indexes.heads.base import Head
from retrctl.indexes.multivector import TokenStore, to_lanes


class ColbertHead(Head):
    name = "colbert"
    encoded = True
    model_attr = "colbert"
    train_hint = "dense,lexical,colbert"
    rank_weight = 1.0  # BGE-M3's s_rank weight (arXiv:2402.03216, §4)
    rescores = True

    def __init__(self, encoder, settings: dict):
        cb = getattr(encoder, "colbert", None)
        self.dim = cb.out_dim if cb is not None else None

    def merge_key(self):
        return self.dim

    def new_store(self, idx) -> TokenStore:
        return TokenStore(self.dim or 0)

    def columns(self, out: dict) -> np.ndarray:
        return to_lanes(out["colbert"], self.dim)

    def read(self, idx, directory, manifest: dict, n: int) -> TokenStore:
        store = TokenStore.read(directory, manifest[self.name], n)
        self.dim = store.dim
        return store

    def describe(self, store: TokenStore) -> str:
        return f"colbert dim {self.dim}, {len(store.arrays()[0])} tokens"

    def raw_scores(self, idx, part, rows: np.ndarray) -> np.ndarray:
        return idx.stores[self.name].maxsim(part, rows)
