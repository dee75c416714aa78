"""Skipping removed sub-layers of a loaded decoder, in memory.

A pruned model dir stores a removed sub-layer as zeros in a stock config (surgery.py says why): a sub-layer whose
projections are all zero adds exactly 0 to the residual stream, so replacing it by ``Skipped`` gives the same
hidden states with less compute. ``config.retrctl_pruned`` lists them ({"mlp": [block, ...], "attention":
[block, ...]}, blocks numbered as in this model). No code file is shipped in the dir: loading it never asks for
``trust_remote_code``, and the skip is retrctl's own, in-process choice: ``Encoder.load(..., inference=True)`` (the
index, search, mine and qgen loads) applies it, so a pruned model encodes at its pruned cost everywhere in retrctl.
Inference only: a skipped sub-layer has no weights, so training loads keep the zeros (they stay zero under
training: no gradient reaches a zeroed sub-layer) and ``Encoder.save`` refuses a skipped model.

Self-slimmed MLPs (prune --slim-mlp) keep their masked neurons as zeros too (their gate/up rows and down columns),
listed as each block's kept width in ``config.retrctl_pruned["mlp_width"]``; ``slice_neurons`` rebuilds such an
MLP's three projections from its nonzero neurons only, which is exact: a zero neuron adds Act(0)·0 = 0.
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


@torch.no_grad()
def slice_neurons(mlp) -> int:
    """Rebuild a gated MLP's projections from its neurons that are not all zero; returns the width kept."""
    live = (mlp.gate_proj.weight.ne(0).any(1) | mlp.up_proj.weight.ne(0).any(1) | mlp.down_proj.weight.ne(0).any(0))
    idx = torch.nonzero(live).flatten()
    if len(idx) == len(live):
        return len(idx)
    for name, rows in (("gate_proj", True), ("up_proj", True), ("down_proj", False)):
        old = getattr(mlp, name)
        new = torch.nn.Linear(len(idx) if not rows else old.in_features, len(idx) if rows else old.out_features,
                              bias=old.bias is not None, device=old.weight.device, dtype=old.weight.dtype)
        new.weight.copy_(old.weight[idx] if rows else old.weight[:, idx])
        if old.bias is not None:
            new.bias.copy_(old.bias[idx] if rows else old.bias)
        setattr(mlp, name, new)
    mlp.retrctl_sliced = True
    return len(idx)


def skip_removed(model) -> list[str]:
    """Skip the sub-layers listed in the loaded decoder's ``config.retrctl_pruned`` (none for other models) and
    slice its slimmed MLPs to their kept neurons; returns the name patterns of what changed."""
    pruned = getattr(getattr(model, "config", None), "retrctl_pruned", None) or {}
    if not pruned:
        return []
    patterns = skip(model, pruned)
    for i, width in enumerate(pruned.get("mlp_width") or []):
        mlp = model.layers[i].mlp
        if not isinstance(mlp, Skipped) and width < mlp.down_proj.in_features:
            slice_neurons(mlp)
            patterns.append(rf"layers\.{i}\.mlp\.")
    return patterns


def has_skipped(model) -> bool:
    return any(isinstance(m, Skipped) or getattr(m, "retrctl_sliced", False) for m in model.modules())
