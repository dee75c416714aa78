"""A stock transformers decoder with some attention / MLP sub-layers skipped (written by `retrctl prune`).

This file is copied, with ``BASE_MODEL`` filled in, into every pruned model dir whose removals are not the same
in every block. It imports only torch and transformers (no retrctl), so
``AutoModel.from_pretrained(dir, trust_remote_code=True)`` runs the model with those sub-layers truly skipped.

Without ``trust_remote_code`` the same dir loads as the stock class: the skipped sub-layers' weights are stored
as zeros, and a sub-layer whose projections are all zero adds exactly 0 to the residual stream, so both loads
give the same hidden states; this file only saves their compute. ``config.retrctl_pruned`` lists them
({"mlp": [block, ...], "attention": [block, ...]}, blocks numbered as in this model).
"""

from __future__ import annotations

import torch
import transformers

BASE_MODEL = "LlamaModel"  # rewritten on save: the stock class of the model that was pruned


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


class PrunedModel(getattr(transformers, BASE_MODEL)):
    def __init__(self, config):
        super().__init__(config)
        patterns = skip(self, getattr(config, "retrctl_pruned", None) or {})
        # their zero weights are in the checkpoint on purpose (the stock load needs them): not worth a warning
        self._keys_to_ignore_on_load_unexpected = set(self._keys_to_ignore_on_load_unexpected or ()) | set(patterns)
