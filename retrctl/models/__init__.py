"""The one model loader and encoder:

- ``config``: ``EncoderConfig`` and the load options, each setting declared once (flags derive from it); no torch.
- ``loading``: shipped names, GGUF conversion, sentence-transformers dirs (read and write), ``resolve``, the cache dir.
- ``backbone``: tokenizing (cuts counted, EOS for eos pooling), attention mode, the pad-token fix and padding helper.
- ``heads``: the ``Head`` interface (each head saves and reloads itself: ``save`` / ``load``) and ``DenseHead``
  (pooling, Matryoshka truncation, normalization).
- ``sparse``: ``SparseHead`` (SPLADE term weights through the input embeddings) and token-count queries.
- ``colbert``: ``ColbertHead`` (BGE-M3's multi-vector head); ``lookup``: LightRetriever's token-lookup table.
- ``encoder``: ``Encoder`` (a query side and a passage side over one backbone) and its ``forward``/``encode``/``save``
  (``SAVED_HEADS``: the heads ``save`` and ``load`` hand their own folders to).

Callers import every name from ``retrctl.models`` (models saved by any retrctl load through it); names are
loaded on first use, so importing the package (the CLI building its flags) does not import torch.
"""

from __future__ import annotations

import importlib

from retrctl.models.config import DTYPES, POOLING, EncoderConfig, LoadOptions  # noqa: F401  (torch-free)
from retrctl.models.loading import SHIPPED, cache_dir, gguf_to_hf, locate_shipped, resolve  # noqa: F401

_LAZY = {  # name -> submodule (these import torch)
    "Encoder": "encoder", "Side": "encoder",
    "Head": "heads", "DenseHead": "heads", "HEADS": "heads", "pool": "heads", "SparseHead": "sparse",
    "ensure_pad_token": "backbone", "pad_ids": "backbone", "is_decoder": "backbone", "Tokens": "backbone",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DTYPES", "POOLING", "SHIPPED", "EncoderConfig", "LoadOptions", "cache_dir", "gguf_to_hf", "locate_shipped",
           "resolve", *_LAZY]
