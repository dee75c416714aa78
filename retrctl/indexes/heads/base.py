"""``Head``: what one head of a dense index is — how its doc rows are made, which store keeps them, what its manifest
section and settings say, how it reopens, and how it is searched alone, fused, or inside a re-scoring.

A head is a class in its own module of this package and one entry in ``retrctl.indexes.heads.HEADS``. The index
(indexes/dense.py) holds one instance per head it stores (``idx.held``, by name) beside that head's store
(``idx.stores[name]``), and asks the instance for everything head-specific, so it never names a head; a method that
needs the docs, the encoder or a search knob is handed the index. The instance holds the head's own settings
(``settings()``: its keys in the manifest's ``settings``) and description (its manifest section).

Rows: an ``encoded`` head's rows are columns of the chunk row the model's one pass yields (``columns`` of
``Encoder.encode_heads``' output, or ``alone`` when it is the only one encoded); any other head's store reads the
docs' texts (``reads_text``: ``rows(texts)``), as the bm25 head's does. The store's interface is
indexes/encoded.py's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from retrctl.errors import UsageError
from retrctl.indexes.base import Flag
from retrctl.models.config import HEAD_ALIASES


def names(value) -> list[str]:
    """``--heads``/``--candidates`` (a comma-separated string or a list) as head names, aliases resolved."""
    return [HEAD_ALIASES.get(h.strip(), h.strip()) for h in (value.split(",") if isinstance(value, str) else value)
            if h.strip()]


class Head:
    """One head of a dense index. Subclasses set the class attributes and override what they do differently."""

    name = ""
    index_flags: tuple[Flag, ...] = ()  # the `index` options its settings come from (``settings_from``)
    search_flags: tuple[Flag, ...] = ()  # the `search` options it reads (``knobs``)
    knobs: dict = {}  # search settings its store reads off the index, with their defaults
    encoded = False  # its doc rows come from the model's pass (else its store reads the texts)
    model_attr: str | None = None  # the encoder attribute holding it, where a model may lack it
    train_hint = ""  # `train --heads` value that trains a model with it
    backend: str | None = None  # the index backend that holds this head alone (`index --method`), named in errors
    rank_weight: float | None = None  # its default weight in a re-scoring's s_rank; None: its raw scores share no scale
    rescores = False  # no search of its own: a search with it re-scores the other heads' candidates
    unset: dict = {}  # what a multi-head index's settings record for it when it is not held

    def __init__(self, encoder, settings: dict):
        """From the encoder (None when there is none) and the index's settings (``settings()``'s keys among them)."""

    @classmethod
    def in_model(cls, encoder) -> bool:
        """Whether ``encoder`` has this head (an index built without --heads holds every head its model has)."""
        return cls.encoded and (cls.model_attr is None or getattr(encoder, cls.model_attr, None) is not None)

    @classmethod
    def settings_from(cls, options: dict) -> dict:
        """Its settings from `index`'s options (those given, by flag name)."""
        return {}

    def settings(self) -> dict:
        """Its keys in the index's settings (the constructor's arguments)."""
        return {}

    @classmethod
    def content(cls, settings: dict) -> dict:
        """What its stored rows depend on, from an index's settings (held or not: both sides of a comparison)."""
        return {}

    @classmethod
    def update_options(cls, settings: dict, options: dict) -> dict:
        """`index`'s options (those given) for an update of an index holding ``settings``: its stored settings an
        update keeps when their flag is not given."""
        return options

    def merge_key(self):
        """What must agree between the parts of a merge."""
        return self.settings()

    # ------------------------------------------------------------ rows and files

    def new_store(self, idx):
        raise NotImplementedError

    def columns(self, out: dict) -> np.ndarray:
        """An encoded head's columns of the chunk rows, from ``Encoder.encode_heads``' output."""
        raise NotImplementedError

    def alone(self, encoder, texts: list[str], batch_size: int) -> np.ndarray:
        """Its columns when it is the only head encoded."""
        return self.columns(encoder.encode_heads(texts, "passage", batch_size, heads=(self.name,)))

    def section(self, store) -> dict | None:
        """Its section of the manifest (``manifest[name]``; None: it has none)."""
        return store.manifest()

    @classmethod
    def files(cls, manifest: dict) -> list | None:
        """Its files in a version, from the manifest; None where the version does not hold it."""
        return list(manifest[cls.name]["files"].values()) if cls.name in manifest else None

    def write(self, store, directory: Path, n: int) -> None:
        store.write(directory, n)

    def read(self, idx, directory: Path, manifest: dict, n: int):
        """Its store in the version ``directory`` (``n`` docs), its description taken from ``manifest``."""
        raise NotImplementedError

    def describe(self, store) -> str | None:
        """A few words for the index's log line."""
        return None

    # ------------------------------------------------------------ search

    def run(self, idx, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        """Its own top ``k`` per query (one list a multi-head search fuses); a head that ``rescores`` has none."""
        raise NotImplementedError

    def score(self, idx, query: dict, docids) -> dict[str, float]:
        """What ``run`` scores each given doc (mine's margin reference), or {} where it cannot say."""
        return {}

    def encoded_queries(self, idx) -> bool:
        """Whether its query side runs in the model's pass over the queries (``query_parts`` reads it)."""
        return self.encoded

    def check_queries(self, idx) -> None:
        if self.model_attr and self.encoded_queries(idx) and getattr(idx.encoder, self.model_attr, None) is None:
            raise UsageError(f"this index's {self.name} queries run the model's {self.name} head: search with "
                             "--query-encoder full")

    def query_parts(self, idx, queries: list[dict], out: dict):
        """Its encoded queries, one item per query, from the model's pass over them (``out``)."""
        return out[self.name]

    def candidates(self, idx, parts: list, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """Its top ``k`` for encoded queries (``query_parts``' items), the candidates a re-scoring takes."""
        return idx.search_store(self.name, np.stack(parts), k)

    def raw_scores(self, idx, part, rows: np.ndarray) -> np.ndarray:
        """Its raw score of one encoded query with the docs at ``rows`` (a term of s_rank)."""
        raise NotImplementedError
