"""The heads a dense index may hold, one module each, registered in ``HEADS``; the index is a composition of them.

A dense index (indexes/dense.py) stores one head or several: the model's pooled vector (``dense``, always), its
sparse term weights (``sparse``: SPLADE, or BGE-M3's lexical head), its token vectors (``colbert``), the corpus's BM25
(``bm25``). ``retrctl index --model M`` holds every head the model has (``Head.in_model``); ``--heads`` picks a subset
or adds a head the model has not (``dense,bm25``). One pass of the model per chunk of docs yields every encoded head's
rows, checkpointed together and split among the heads' stores (indexes/encoded.py), so the heads cannot drift
apart; the manifest's ``settings.heads`` names them and each head writes its own section.

A search ranks by the heads ``--heads`` names (default all) and fuses their lists, or, with a head that only
re-scores (colbert), re-scores candidates by BGE-M3's s_rank: indexes/heads/search.py.

A new head is one module here with a ``base.Head`` subclass and one line in ``HEADS`` (tests/toy_head.py is a whole
one): `index --heads` and `search --heads` accept it, `index` and `search` offer its flags, and the index builds,
updates, merges, saves, reopens and searches it through the ``Head`` interface without naming it.
"""

from __future__ import annotations

from pathlib import Path

from retrctl.errors import UsageError
from retrctl.indexes.base import Flag
from retrctl.indexes.heads.base import Head, names
from retrctl.indexes.heads.bm25 import BM25Head
from retrctl.indexes.heads.colbert import ColbertHead
from retrctl.indexes.heads.dense import DenseHead
from retrctl.indexes.heads.sparse import SparseHead
from retrctl.models.config import HEADS_HELP

# registry order is the order of the encoded row's columns, of the manifest's sections and of the lists fused
HEADS: dict[str, type[Head]] = {"dense": DenseHead, "sparse": SparseHead, "colbert": ColbertHead, "bm25": BM25Head}

HEADS_TO_INDEX = Flag("heads", f"{HEADS_HELP} [default: every head the model has]")


class declared:
    """A class attribute that is ``own`` followed by what each registered head declares (``of(head class)``), read
    at each access, so a head registered later brings its flags and knobs."""

    def __init__(self, own: tuple, of):
        self.own, self.of = tuple(own), of

    def __get__(self, obj, owner=None) -> tuple:
        return (*self.own, *(x for head in HEADS.values() for x in self.of(head)))


def parse(value, encoder=None) -> list[str]:
    """``--heads`` as a list in registry order; None = every head the model has. ``UsageError`` for a bad name."""
    if value is None:
        return [name for name, head in HEADS.items() if head.in_model(encoder)]
    got = names(value)
    if not got or any(h not in HEADS for h in got):
        raise UsageError(f"--heads {','.join(got)}: choose from {', '.join(HEADS)} (comma-separated)")
    return [h for h in HEADS if h in got]


def to_index(encoder, value, required: str) -> list[str]:
    """``--heads`` checked against the model: each head it names exists, ``required`` (the index's own) among them,
    and a head that re-scores by raw scores is not stored beside one whose scores share no scale."""
    chosen = parse(value, encoder)
    rescoring = [h for h in chosen if HEADS[h].rescores]
    unscaled = [h for h in chosen if HEADS[h].rank_weight is None]
    if rescoring and unscaled:
        scaled = [h for h, head in HEADS.items() if head.rank_weight is not None and not head.rescores]
        raise UsageError(f"--heads {','.join(chosen)}: a search with {rescoring[0]} re-scores by raw scores, which "
                         f"{unscaled[0]}'s scale does not share; index {unscaled[0]} beside {' and '.join(scaled)} (or "
                         f"index it apart and fuse the runs)")
    for h in chosen:
        if HEADS[h].model_attr and getattr(encoder, HEADS[h].model_attr, None) is None:
            raise UsageError(f"--heads {','.join(chosen)}: {getattr(encoder, 'source', 'the model')} has no {h} "
                             f"head (train one with --heads {HEADS[h].train_hint})")
    if required not in chosen:
        alone = HEADS[chosen[0]].backend if len(chosen) == 1 else None
        raise UsageError(f"--heads {','.join(chosen)}: an index holds the {required} head too (--heads "
                         f"{required},{','.join(chosen)})" + (f"; the {chosen[0]} head alone is --method {alone}"
                                                             if alone else ""))
    return chosen


def bytes_per_doc(directory: Path, manifest: dict) -> dict[str, float]:
    """Each head's files in a version, in bytes per doc (the doc ids, shared, counted in none)."""
    n = max(manifest.get("doc_count") or 0, 1)
    files = {name: head.files(manifest) for name, head in HEADS.items()}
    return {h: sum(_size(directory / f) for f in found if f) / n for h, found in files.items() if found is not None}


def _size(path: Path) -> int:
    """A file's bytes, or every file's under a folder (bm25s's save is one)."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.is_file() else 0


__all__ = ["HEADS", "HEADS_TO_INDEX", "Head", "bytes_per_doc", "declared", "parse", "to_index"]
