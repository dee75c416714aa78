"""EffiR's fine step: self-slimming of the MLP width.

Every MLP intermediate neuron i gets a trainable gate z_i, initialised to 1 (the model is unchanged at the start):
MLP(x) = W_down(ReLU(z) ⊙ Act(W_gate x) ⊙ W_up x). The gates are trained for a few steps on retrieval groups with
InfoNCE + λ·L0(ReLU(z)), the L0 norm relaxed by a sigmoid (``l0``); then the gates of all MLPs are ranked
**globally**, so layers keep different widths, and the top fraction is kept. The mask is frozen by zeroing the
masked neurons' rows of W_gate and W_up and columns of W_down: such a neuron adds exactly 0, and zero is a fixed
point of training (each of the three weights' gradients is a product with another one's zero), so training on
with InfoNCE (the healing phase) keeps the mask without any hook.

The gate is a ``torch.nn.utils.parametrize`` parametrization of ``down_proj.weight`` (W_down · diag(ReLU(z))), so
the forward pass is transformers' own; ``fold`` removes it, leaving stock weights with the gates multiplied in.
Per-layer widths are what no stock Llama config expresses (surgery.py): the masked neurons stay as zeros in a
stock dir, ``config.retrctl_pruned["mlp_width"]`` lists each block's kept width, and retrctl's inference loads
slice them out (models/skipping.py), so the smaller MLPs cost less where retrctl encodes.
"""

from __future__ import annotations

import torch
from torch.nn.utils import parametrize

from retrctl.prune import work
from retrctl.prune.surgery import PruneError

RELAX = 0.5  # temperature of the L0 relaxation: 2σ(g/τ) − 1 is 0 at g = 0 and ~0.76 at the initial g = 1


class Gate(torch.nn.Module):
    """down_proj.weight [hidden, n] → weight · ReLU(z) per column: the neuron's output scaled by its gate."""

    def __init__(self, n: int, lr: float | None = None):
        super().__init__()
        self.z = torch.nn.Parameter(torch.ones(n))
        self.z.lr = lr  # Trainer's optimizer gives the gates their own learning rate

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * torch.relu(self.z).to(weight.dtype)


def _mlps(model, skip=()):
    return [(i, layer.mlp) for i, layer in enumerate(model.layers) if i not in set(skip)]


def check_gated_mlp(model) -> None:
    for _, mlp in _mlps(model):
        if not all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj")):
            raise PruneError(f"--slim-mlp needs gated MLPs (gate_proj, up_proj, down_proj), not {type(mlp).__name__}")


def add_gates(model, lr: float | None = None, removed=()) -> None:
    """A gate on every MLP's neurons, except in the blocks of ``removed`` (MLPs already zeroed)."""
    check_gated_mlp(model)
    for _, mlp in _mlps(model, removed):
        parametrize.register_parametrization(mlp.down_proj, "weight", Gate(mlp.down_proj.in_features, lr))


def gates(model) -> dict[int, torch.Tensor]:
    """Block → its gate values ReLU(z) (detached, CPU)."""
    out = {}
    for i, mlp in _mlps(model):
        if parametrize.is_parametrized(mlp.down_proj, "weight"):
            out[i] = torch.relu(mlp.down_proj.parametrizations.weight[0].z.detach().float().cpu())
    return out


def l0(model) -> torch.Tensor:
    """The relaxed L0 norm of ReLU(z), averaged over every gated neuron: mean of 2σ(ReLU(z)/τ) − 1."""
    zs = [mlp.down_proj.parametrizations.weight[0].z for _, mlp in _mlps(model)
          if parametrize.is_parametrized(mlp.down_proj, "weight")]
    z = torch.cat(zs)
    return (2 * torch.sigmoid(torch.relu(z) / RELAX) - 1).mean()


def fold(model) -> None:
    """Multiply each gate into its down_proj weight and remove the parametrization: stock weights, same outputs."""
    for _, mlp in _mlps(model):
        if parametrize.is_parametrized(mlp.down_proj, "weight"):
            parametrize.remove_parametrizations(mlp.down_proj, "weight", leave_parametrized=True)


def choose(values: dict[int, torch.Tensor], keep: float) -> dict[int, torch.Tensor]:
    """Block → boolean mask of kept neurons: the top ``keep`` fraction of all gates, ranked globally (ties: the
    lower block, then the lower neuron). Every gated MLP keeps at least one neuron."""
    if not 0 < keep < 1:
        raise PruneError(f"--slim-mlp must be a fraction in (0, 1) of the MLP neurons to keep, got {keep}")
    blocks = sorted(values)
    flat = torch.cat([values[i] for i in blocks])
    n_keep = max(len(blocks), round(keep * len(flat)))
    order = sorted(range(len(flat)), key=lambda j: (-float(flat[j]), j))[:n_keep]
    kept = torch.zeros(len(flat), dtype=torch.bool)
    kept[order] = True
    out, start = {}, 0
    for i in blocks:
        mask = kept[start : start + len(values[i])].clone()
        if not mask.any():  # a block whose gates all lost keeps its best neuron: an MLP is removed by --drop-mlp
            mask[int(torch.argmax(values[i]))] = True
        out[i], start = mask, start + len(values[i])
    return out


@torch.no_grad()
def zero_neurons(model, masks: dict[int, torch.Tensor]) -> None:
    """Freeze the mask in the stock form: masked neurons' gate/up rows and down columns set to zero."""
    for i, mask in masks.items():
        mlp = model.layers[i].mlp
        drop = ~mask.to(mlp.down_proj.weight.device)
        mlp.gate_proj.weight[drop] = 0
        mlp.up_proj.weight[drop] = 0
        mlp.down_proj.weight[:, drop] = 0
        for lin in (mlp.gate_proj, mlp.up_proj):
            if lin.bias is not None:
                lin.bias[drop] = 0


def widths(model, masks: dict[int, torch.Tensor]) -> list[int]:
    """Each block's MLP width after the mask (its full width where no mask applies)."""
    return [int(masks[i].sum()) if i in masks else layer.mlp.down_proj.in_features for i, layer in enumerate(model.layers)]


def self_slim(enc, keep: float, groups, corpus: dict | None, scratch, *, slim_steps: int, heal_steps: int,
              slim_lambda: float, gate_lr: float, removed=(), heal_teacher: str | None = None, **train_settings) -> tuple:
    """EffiR's fine step on ``enc`` (an Encoder; gated and trained in place): gates trained ``slim_steps``
    steps with InfoNCE + λ·L0 (``retrctl train``'s Trainer, groups as ``train`` reads them), the top ``keep``
    of the gates kept globally, then ``heal_steps`` steps of plain InfoNCE with the mask frozen (0: none), plus
    distillation from ``heal_teacher`` (the unpruned model: its vectors and scores of the groups' texts) when given.
    Each phase trains into ``scratch`` (``gates/``, ``healed/``; a finished phase is not trained again, an
    interrupted one resumes from its checkpoints: stages/prune.py's --resume).
    Returns (the slimmed Encoder, each block's gate values, each block's kept mask, the two phases' last metrics)."""
    from pathlib import Path

    import numpy as np

    from retrctl.models import Encoder
    from retrctl.train.config import TrainConfig
    from retrctl.train.loop import Trainer

    scratch = Path(scratch)
    values_file = scratch / "gates.npz"
    if not (values_file.is_file() and work.finished(scratch / "gates")):
        add_gates(enc.model, lr=gate_lr, removed=removed)
        Trainer.build(TrainConfig(max_steps=slim_steps, **train_settings), groups, corpus, scratch / "gates", encoder=enc,
                      penalty=lambda: slim_lambda * l0(enc.model), finish=lambda e: fold(e.model)).fit()
        # Trainer trained ``enc`` itself (one process); its saved copy has the gates folded
        np.savez(values_file, **{f"block_{i}": v.numpy() for i, v in gates(enc.model).items()})
    with np.load(values_file) as saved:
        values = {int(k.split("_")[1]): torch.from_numpy(saved[k]) for k in saved.files}
    masks = choose(values, keep)
    metrics = {"slim": work.last_metrics(scratch / "gates")}
    slim = Encoder.load(scratch / "gates", device="cpu")  # the gates folded into stock weights
    zero_neurons(slim.model, masks)
    slim.model.config.retrctl_pruned = {**(getattr(slim.model.config, "retrctl_pruned", None) or {}),
                                        "mlp_width": widths(slim.model, masks)}
    if heal_steps:
        out = scratch / "healed"
        if not work.finished(out):
            teach = {"teacher": heal_teacher, "embed_distill_weight": 1.0} if heal_teacher else {}
            Trainer.build(TrainConfig(max_steps=heal_steps, **teach, **train_settings), groups, corpus, out, encoder=slim).fit()
        metrics["heal"] = work.last_metrics(out)
        slim = Encoder.load(out, device="cpu")
    return slim, values, masks, metrics
