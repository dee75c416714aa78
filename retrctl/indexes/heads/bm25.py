"""The bm25 head: the corpus's BM25 beside the model's heads (`index --heads dense,bm25`), the bm25 backend's
``bm25_store.BM25Store`` fed the texts of the chunks the model encodes.

Its statistics are recomputed from the stored tokens after every change, so updates and merges equal a fresh build,
and its search alone equals the bm25 backend's at the same settings (``settings.bm25``: the variant, from the bm25
backend's flags). Its raw scores share no scale with the model's heads, so it never joins a colbert re-scoring.
Its files sit in a folder of their own within a version (``bm25/``).
"""

from __future__ import annotations

import numpy as np

from retrctl.indexes.bm25 import INDEX_FLAGS, bm25_settings, held_settings, keep_tokens
from retrctl.indexes.bm25_store import FILES, BM25Store
from retrctl.indexes.heads.base import Head

DIR = "bm25"


class BM25Head(Head):
    name = "bm25"
    backend = "bm25"
    index_flags = INDEX_FLAGS

    def __init__(self, encoder, settings: dict):
        self.variant = BM25Store(**(settings.get("bm25") or {})).settings()

    @classmethod
    def settings_from(cls, options: dict) -> dict:
        return {"bm25": bm25_settings(**{f.name: options[f.name] for f in INDEX_FLAGS if f.name in options})}

    def settings(self) -> dict:
        return {"bm25": self.variant}

    @classmethod
    def content(cls, settings: dict) -> dict:
        held = settings.get("bm25")
        return {"bm25": None if held is None else held_settings(held)}

    @classmethod
    def update_options(cls, settings: dict, options: dict) -> dict:
        held = settings.get("bm25")
        return options if held is None else keep_tokens(options, held)

    def new_store(self, idx) -> BM25Store:
        return BM25Store(**self.variant)

    def section(self, store: BM25Store) -> dict:
        return {**store.manifest(), "files": {k: f"{DIR}/{v}" for k, v in FILES.items()}}

    def write(self, store: BM25Store, directory, n: int) -> None:
        store.write(directory / DIR, n)

    def read(self, idx, directory, manifest: dict, n: int) -> BM25Store:
        return BM25Store.read(directory / DIR, self.variant, n)

    def describe(self, store: BM25Store) -> str:
        return store.variant()

    def run(self, idx, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        found = idx.search_store(self.name, [q["query_text"] for q in queries], k)
        return {q["query_id"]: hits for q, hits in zip(queries, found, strict=True)}

    def score(self, idx, query: dict, docids) -> dict[str, float]:
        found = idx.positions(docids)
        rows = np.fromiter(found.values(), np.int64, count=len(found))
        return dict(zip(found, idx.stores[self.name].scores_at(query["query_text"], rows).tolist(), strict=True))
