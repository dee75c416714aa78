"""Skipping removed sub-layers of a loaded decoder, in memory.

A pruned model dir stores a removed sub-layer as zeros in a stock config (surgery.py says why): a sub-layer whose
projections are all zero adds exactly 0 to the residual stream, so replacing it by ``Skipped`` gives the same
hidden states with less compute. ``config.retrctl_pruned`` lists them ({"mlp": [block, ...], "attention":
[block, ...]}, blocks numbered as in this model). No code file is shipped in the dir: loading it never asks for
``trust_remote_code``, and the skip is retrctl's own, in-process choice: ``Encoder.load(..., inference=True)`` (the
index, search, mine and qgen loads) applies it, so a pruned model encodes at its pruned cost everywhere in retrctl.
Inference only: a skipped sub-layer has no weights, so training loads keep the zeros (they stay zero under
training: no gradient reaches a zeroed sub-layer) and ``Encoder.save`` refuses a skipped model.
"""

from __future__ import annotations

import torch


class Skipped(torch.nn.Module):
    """A removed sub-layer: adds nothing to the residual stream (``residual + 0``), computes nothing."""

    def __init__(self, attention: bool):
        super().__init__()
        self.attention = attention

    def forward(self, hidden_states=None, *args, **kwargs):
        zero = hidden_states.new_zeros(())
        return (zero, None) if self.attention else zero


def skip(model, pruned: dict) -> list[str]:
    """Replace the listed sub-layers of a loaded decoder (``model.layers``) by ``Skipped``; returns the weight-name
    patterns (relative to ``model``) that no longer have a parameter."""
    patterns = []
    for kind, attr in (("mlp", "mlp"), ("attention", "self_attn")):
        for i in pruned.get(kind, []):
            setattr(model.layers[i], attr, Skipped(attention=kind == "attention"))
            patterns.append(rf"layers\.{i}\.{attr}\.")
    return patterns


def skip_removed(model) -> list[str]:
    """Skip the sub-layers listed in the loaded decoder's ``config.retrctl_pruned`` (none for other models)."""
    pruned = getattr(getattr(model, "config", None), "retrctl_pruned", None) or {}
    return skip(model, pruned) if pruned else []


def has_skipped(model) -> bool:
    return any(isinstance(m, Skipped) for m in model.modules())
