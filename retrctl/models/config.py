"""Encoder settings, declared once: flags, TrainConfig and saved models derive from here. No torch here: the
CLI builds its flags from this module and ``retrctl --help`` must not import torch.

``EncoderConfig`` is what a saved model records (``retrctl.json``, exactly its fields, in this order). Each field's
metadata says what the rest of the tree derives from it:

- ``flag``/``help``/``choices``/``min``: the shared CLI flag (``options.OPTIONS["encoder"]``, ``encoder_overrides``)
  and the matching ``TrainConfig`` field (``with_encoder_flags``); a field without ``flag`` is not a flag.
- ``side``: which side's vectors the setting changes: "query", "passage", "both", or None (scoring only). An index
  warns when a setting its doc vectors depend on (``PASSAGE_KEYS``) is overridden.

``LoadOptions`` (dtype, device) are flags too, but say how to run a model, not what it computes, so a saved model
does not record them.
"""

from __future__ import annotations

import dataclasses

POOLING = ("mean", "cls", "eos", "last")
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _setting(default, *, side: str | None = "both", flag: str | None = None, help: str = "", choices=None, min=None):
    return dataclasses.field(default=default, metadata={"side": side, "flag": flag, "help": help, "choices": choices, "min": min})


@dataclasses.dataclass
class EncoderConfig:
    """What an encoder needs besides its weights; saved as retrctl.json (exactly these keys)."""

    pooling: str = _setting("mean", flag="--pooling", choices=POOLING, help="Pooling (default: the model's own).")
    normalize: bool = _setting(True)
    query_prompt: str = _setting("", side="query", flag="--query-prompt", help="Prefix for queries, e.g. 'query: '.")
    passage_prompt: str = _setting("", side="passage", flag="--passage-prompt", help="Prefix for passages, e.g. 'passage: '.")
    query_max_len: int = _setting(256, side="query", flag="--query-max-len", min=1,
                                  help="Query length cap in tokens (default: the model's own).")
    passage_max_len: int = _setting(256, side="passage", flag="--passage-max-len", min=1,
                                    help="Passage length cap in tokens (default: the model's own).")
    bidirectional: bool = _setting(False, flag="--bidirectional/--causal",
                                   help="Bidirectional attention for decoders (default: the model's own).")
    mcls: int | None = _setting(None, flag="--mcls", min=1,
                                help="BGE-M3's MCLS for long texts: a CLS token inserted every N tokens (at inference), "
                                     "the vector the mean of the CLS tokens' states.")
    dims: int | None = _setting(None)  # Matryoshka: truncate to the first `dims` then renormalize
    temperature: float | None = _setting(None, side=None)  # recorded by train, so similarity scales stay known

    def __post_init__(self):
        if self.pooling not in POOLING:
            raise ValueError(f"pooling must be one of {POOLING}, got {self.pooling!r}")

    @classmethod
    def from_settings(cls, settings: dict) -> EncoderConfig:
        """From a saved retrctl.json or manifest dict, keys this config does not know ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in settings.items() if k in known})

    def prompt(self, kind: str) -> str:
        return self.query_prompt if kind == "query" else self.passage_prompt

    def max_len(self, kind: str) -> int:
        return self.query_max_len if kind == "query" else self.passage_max_len


@dataclasses.dataclass
class LoadOptions:
    """How to run a model (flags, never saved with it)."""

    dtype: str | None = _setting(None, side=None, flag="--dtype", choices=tuple(DTYPES), help="Compute dtype.")
    device: str | None = _setting(None, side=None, flag="--device", help="Device (default: cuda when present, else cpu).")


HEAD_ALIASES = {"lexical": "sparse"}  # BGE-M3's lexical head is stored and searched as the model's sparse head

# flags that train, index and search each take, described once (their defaults differ by stage)
HEADS_HELP = ("The heads, comma-separated: dense, sparse (SPLADE: term weights through the tied input embeddings), "
              "lexical (BGE-M3: a learned weight per token; sparse in an index), colbert (BGE-M3's multi-vector head) "
              "and, in an index, the corpus's bm25. train: the heads trained, each with its own contrastive loss (e.g. "
              "dense,lexical,colbert); index: the heads stored, each a sub-index from the same pass, dense required "
              "(e.g. dense,bm25); search: the heads searched, their lists fused, or re-scored with colbert.")
QUERY_ENCODER_HELP = ("The query encoder: full (the transformer) or token-lookup (LightRetriever: each query token's "
                      "vector from a table, averaged; no transformer). train: token-lookup also trains the table (each "
                      "token encoded with the prompt alone, a KL term to the full encoder) and ships it in the model "
                      "dir; search: auto uses the table when the model ships one, else the full model.")
SPARSE_TOP_K_HELP = ("Terms kept per encoded doc by the sparse head: train saves it with the head (0 = all); index may "
                     "keep fewer.")

SETTINGS = tuple(f.name for f in dataclasses.fields(EncoderConfig))  # every key of retrctl.json / a manifest's encoder
PASSAGE_KEYS = tuple(f.name for f in dataclasses.fields(EncoderConfig) if f.metadata["side"] in ("both", "passage"))
SETTING_FLAGS = tuple(f.name for f in dataclasses.fields(EncoderConfig) if f.metadata["flag"])  # what a model records
ENCODER_FLAGS = (*SETTING_FLAGS, *(f.name for f in dataclasses.fields(LoadOptions)))  # the shared encoder flags


def passage_differences(a: dict, b: dict, heads: bool = False) -> list[str]:
    """The settings passage vectors depend on (``PASSAGE_KEYS`` and the dim; with ``heads``, the sparse and colbert
    heads' settings too) in which two encoder descriptions differ: vectors made under one stand for the other's only
    when this is empty (and the weights are the same). The model's path, its query side and its score scale (the
    temperature train records) are not among them."""
    keys = (*PASSAGE_KEYS, "dim", *(("sparse", "colbert") if heads else ()))
    return [k for k in keys if a.get(k) != b.get(k)]


def flag_fields() -> list[dataclasses.Field]:
    """The fields behind the shared encoder flags, in flag order."""
    fields = [*dataclasses.fields(EncoderConfig), *dataclasses.fields(LoadOptions)]
    return [f for f in fields if f.metadata["flag"]]


def with_encoder_flags(after: str):
    """Class decorator (under ``@dataclass``): insert one optional field per encoder flag after field ``after``,
    default None (= the model's own), so a config that sets encoder flags (TrainConfig) does not list them again."""

    def deco(cls):
        own = dict(cls.__dict__.get("__annotations__", {}))
        if after not in own:
            raise TypeError(f"{cls.__name__} has no field {after!r}")
        annotations = {}
        for name, kind in own.items():
            annotations[name] = kind
            if name == after:
                for f in flag_fields():
                    base = f.type if isinstance(f.type, str) else f.type.__name__
                    annotations[f.name] = base if base.endswith("| None") else f"{base} | None"
                    setattr(cls, f.name, dataclasses.field(default=None, metadata={"help": f.metadata["help"]}))
        cls.__annotations__ = annotations
        return cls

    return deco
