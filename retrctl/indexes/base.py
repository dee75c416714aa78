"""The Index interface every backend implements; `search`, `mine` and `index` use only this.

An index directory always holds ``index.json`` (the manifest: format version, backend, its settings, doc
count, encoder description for dense backends) and the backend's files; doc ids and per-doc content hashes
are stored as Parquet, vectors as arrays, never pickles. ``open_index(dir)`` reads the manifest to pick
the class.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

FORMAT_VERSION = 1


class Index:
    """Backends subclass this. ``name`` is the key in ``retrctl.indexes.BACKENDS``."""

    name = "base"

    def build(self, docs: Iterable[dict]) -> None:
        """Index doc records ({docid, title, text}) from a stream."""
        raise NotImplementedError

    def add(self, docs: Iterable[dict]) -> None:
        """Add or replace docs (by docid)."""
        raise NotImplementedError

    def remove(self, docids: Iterable[str]) -> None:
        raise NotImplementedError

    def save(self, directory: str | Path) -> None:
        raise NotImplementedError

    @classmethod
    def load(cls, directory: str | Path) -> Index:
        raise NotImplementedError

    def search(self, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        """query records ({query_id, query_text}) -> {query_id: [(docid, score)] best first}.

        Ties are broken by docid so every backend returns the same order for equal scores.
        """
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError
