"""Skipping removed sub-layers of a loaded decoder, in memory.

A pruned model dir stores a removed sub-layer as zeros in a stock config (surgery.py says why): a sub-layer whose
projections are all zero adds exactly 0 to the residual stream, so replacing it by ``Skipped`` gives the same
hidden states with less compute. ``config.retrctl_pruned`` lists them ({"mlp": [block, ...], "attention":
[block, ...]}, blocks numbered as in this model). No code file is shipped in the dir: loading it never asks for
``trust_remote_code``, and the skip is retrctl's own, in-process choice (inference only: a skipped sub-layer has no
weights to save).
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
