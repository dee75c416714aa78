"""Index backends: ``BACKENDS`` maps a manifest's "backend" to its class; ``open_index(dir)`` opens any index."""

from __future__ import annotations

from pathlib import Path

from retrctl.indexes.base import Index, read_manifest
from retrctl.indexes.bm25 import BM25Index
from retrctl.indexes.dense import DenseIndex

BACKENDS: dict[str, type[Index]] = {"dense": DenseIndex, "bm25": BM25Index}


def open_index(directory: str | Path, **kw) -> Index:
    """Open a saved index; ``kw`` (encoder=, device=, encoder overrides) go to dense backends."""
    from retrctl.records import RecordError

    backend = read_manifest(directory).get("backend")
    if backend not in BACKENDS:
        raise RecordError(Path(directory) / "index.json", None, "backend", f"unknown backend {backend!r} ({', '.join(BACKENDS)})")
    return BACKENDS[backend].load(directory, **kw)


__all__ = ["BACKENDS", "BM25Index", "DenseIndex", "Index", "open_index"]
