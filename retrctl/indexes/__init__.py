"""Index backends: ``BACKENDS`` maps a manifest's "backend" to its class; ``open_index(dir)`` opens any index.

An index directory holds immutable versions behind one pointer (retrctl.indexes.store): ``open_index`` resolves
the pointer once and the backend reads only that version, so an update running meanwhile cannot mix versions.

Each backend describes itself (retrctl.indexes.base.Index): whether it needs an encoder, the `index` flags it
takes (``create``), what the stored data depends on (``content_settings``, which decides whether an update may
reuse a version), how it reopens from its manifest (``load``), its run tag and log line, and how it scores a
query against given docs (``score``), and the command-line flags it takes (``index_flags``, ``search_flags``). The
stages ask it and never branch on its name, so a new backend is one module here and one entry in ``BACKENDS``:
`retrctl index --method` lists it from there, and `index`/`search` offer its flags (``declared_flags``).

The dense backend is itself a composition of heads (the vectors, a model's sparse and colbert heads, the corpus's
BM25), each one module of ``retrctl.indexes.heads`` and one entry in ``HEADS``, the same way: a head's flags join
the dense backend's.
"""

from __future__ import annotations

from pathlib import Path

from retrctl.indexes import store
from retrctl.indexes.base import Flag, Index, read_manifest
from retrctl.indexes.bm25 import BM25Index
from retrctl.indexes.dense import DenseIndex, HeadsIndex
from retrctl.indexes.fused import FusedIndex
from retrctl.indexes.heads import HEADS
from retrctl.indexes.sparse import SparseIndex
from retrctl.indexes.store import Version, resolve

BACKENDS: dict[str, type[Index]] = {"dense": DenseIndex, "sparse": SparseIndex, "bm25": BM25Index, "fused": FusedIndex}
DEFAULT_BACKEND = "dense"  # `index --method` when not given and -o holds no index yet


def declared_flags(command: str) -> dict[str, Flag]:
    """The flags the registered backends declare for `retrctl index` (``command="index"``: ``index_flags``) or
    `retrctl search` (``"search"``: ``search_flags``), by name, in registry order; the first declaration of a name
    serves every backend that takes it."""
    out: dict[str, Flag] = {}
    for backend in BACKENDS.values():
        for flag in backend.index_flags if command == "index" else backend.search_flags:
            out.setdefault(flag.name, flag)
    return out


def open_index(directory: str | Path | Version, **kw) -> Index:
    """Open a saved index (a directory, or a ``Version`` already resolved); ``kw`` (encoder=, device=, encoder
    overrides, ``with_encoder=False``: no encoder loaded, for what reads only the stored files) go to the backend's
    ``load``, which ignores what it has no use for. ``index.version`` tells which
    version was opened (and its manifest)."""
    from retrctl.records import RecordError

    def load(version: Version) -> Index:
        backend = version.manifest.get("backend")
        if backend not in BACKENDS:
            raise RecordError(version.path / store.MANIFEST, None, "backend", f"unknown backend {backend!r} ({', '.join(BACKENDS)})")
        return BACKENDS[backend].load(version, **kw)

    return store.open_consistent(directory, load)


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "HEADS", "BM25Index", "DenseIndex", "Flag", "FusedIndex", "HeadsIndex", "Index", "SparseIndex", "Version",
           "declared_flags", "open_index", "read_manifest", "resolve"]
