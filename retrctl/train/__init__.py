"""Training an encoder, one package with no import circle:

- ``config``: ``TrainConfig`` (its encoder settings come from ``retrctl/models/config.py``), what a resume may change.
- ``data``: groups validated and fingerprinted, seeded per-epoch sampling, length-grouped global batches.
- ``losses``: InfoNCE with cross-process negatives, false-negative masking, Matryoshka, distillation, GradCache.
- ``checkpoint``: the output directory's checks, checkpoints loaded without running code, RNG states.
- ``engines``: plain torch or DeepSpeed ZeRO 0-3 behind one interface.
- ``loop``: ``Trainer``, built by ``Trainer.build`` (from a model name or an ``Encoder``, teacher scores from the
  groups or an online teacher), then trained by ``fit``.

Imports run one way: loop → engines → checkpoint → config; data and losses import none of them.
``from retrctl.train import Trainer, TrainConfig`` loads the submodule on first use.
"""

from __future__ import annotations

import importlib

_LAZY = {"TrainConfig": "config", "resume_conflicts": "config", "RESUME_MAY_CHANGE": "config",
         "Trainer": "loop", "build_encoder": "model", "prepare": "model", "check_output": "checkpoint",
         "GroupSource": "data", "Batches": "data", "Example": "data"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
