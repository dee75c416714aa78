"""Sheared-LLaMA's targeted structured pruning: learn which layers, hidden dims, heads and MLP neurons to keep so
that the result has exactly the shape asked for (Xia et al. 2024, arXiv:2310.06694; DRAMA cut Llama-3.2-1B to
0.1B/0.3B with it).

Every prunable unit gets a hard-concrete mask z (Louizos et al. 2018, arXiv:1712.01312): a stretched, clipped
binary-concrete variable of a learned log α, so z is exactly 0 or 1 with positive probability and the expected
number of nonzeros is differentiable. Masks (as in LLM-Shearing's ``l0_module.py``):
- ``layers``: one per block, on its attention and MLP outputs together;
- ``hidden``: one per dimension of the residual stream, shared by every block (embeddings, attention and MLP
  outputs);
- ``heads``: one per key/value group of each block (with grouped-query attention a KV head and its query heads
  go together, so the result keeps a uniform heads/KV ratio; for multi-head attention a group is one head);
- ``intermediate``: one per MLP neuron of each block.
Each module's expected sparsity is pushed to its target by a Lagrangian λ₁(ŝ − t) + λ₂(ŝ − t)², whose
multipliers are trained by gradient *ascent* (a gradient-reversal in the penalty, so one optimizer minimises the
loss and maximises over λ), with t warmed up linearly from 0 (``warmup`` steps). At the end every row keeps its
top-k units by log α with k the target (``heads`` and ``intermediate`` per block), so every block keeps the same
number of heads and neurons and the result is a **uniform** model: a stock config with smaller
``num_hidden_layers``, ``hidden_size``, head counts and ``intermediate_size``, loaded by stock
``AutoModel.from_pretrained``.

The masks multiply the weights through ``torch.nn.utils.parametrize`` (the forward pass stays transformers' own,
and ``retrctl train``'s Trainer trains them like any parameter): the embedding matrix's columns by the hidden
mask, ``o_proj`` by the hidden, layer and head masks, ``down_proj`` by the hidden, layer and neuron masks. The
noise u of the hard-concrete sample is drawn once per step (``resample``), so every use of a mask in a step (each
weight it scales, a GradCache or checkpoint re-run) sees the same sample. ``fold`` multiplies the final binary
masks in (stock weights with zeros); ``reshape`` then removes the zeroed units, which is exact: a zero layer,
head or neuron adds 0, and a zeroed hidden dim is 0 in the whole residual stream. RMSNorm over the d' kept dims
instead of d is made equal by scaling each norm's weight by √(d/d') and ε by d/d' (checked to 1e-5 against the
masked model before saving).
"""

from __future__ import annotations

import math
import re

import torch
from torch.nn.utils import parametrize

from retrctl.prune.surgery import PruneError, drop_blocks

KEYS = ("layers", "hidden", "heads", "intermediate")
LIMIT_A, LIMIT_B, EPS = -0.1, 1.1, 1e-6  # the stretch of the hard-concrete distribution (Louizos et al.)
TEMPERATURE = 2 / 3
INIT_LOG_ALPHA = 5.0  # LLM-Shearing: every unit starts almost surely kept
LOG_ALPHA_RANGE = (math.log(1e-2), math.log(1e2))


# ---------------------------------------------------------------- the shape


def source_shape(config) -> dict[str, int]:
    """The model's shape in --target-shape's terms (heads counts query heads)."""
    return {"layers": config.num_hidden_layers, "hidden": config.hidden_size, "heads": config.num_attention_heads,
            "intermediate": config.intermediate_size}


def parse_target_shape(text: str) -> dict[str, int]:
    """``layers=15,hidden=384,heads=6,intermediate=768`` (any subset) → dict; PruneError naming the bad part."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\w+)\s*=\s*(\d+)", part)
        if not m or m[1] not in KEYS:
            raise PruneError(f"--target-shape {text!r}: {part!r} is not KEY=N with KEY one of {', '.join(KEYS)}")
        if m[1] in out:
            raise PruneError(f"--target-shape {text!r}: {m[1]} is given twice")
        out[m[1]] = int(m[2])
    if not out:
        raise PruneError(f"--target-shape {text!r}: give at least one of {', '.join(k + '=N' for k in KEYS)}")
    return out


def group_size(config) -> int:
    """Query heads per key/value head: the unit a head mask removes."""
    return config.num_attention_heads // getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def check_target(model, target: dict[str, int]) -> dict[str, int]:
    """The full target (unnamed keys keep the source's size); PruneError for a shape the model cannot take."""
    cfg = model.config
    if getattr(cfg, "retrctl_pruned", None):
        raise PruneError("--target-shape needs a uniform model; this one has sub-layers or neurons removed singly "
                         "(config.retrctl_pruned): shape the unpruned model")
    for a in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size"):
        if not isinstance(getattr(cfg, a, None), int):
            raise PruneError(f"--target-shape needs a Llama-family config with an integer {a}")
    src = source_shape(cfg)
    for key, n in target.items():
        if not 1 <= n <= src[key]:
            raise PruneError(f"--target-shape {key}={n}: the model has {key}={src[key]}; give 1..{src[key]}")
    r = group_size(cfg)
    if target.get("heads", r) % r:
        raise PruneError(f"--target-shape heads={target['heads']}: the model shares each key/value head among {r} query "
                         f"heads (grouped-query attention); give a multiple of {r} so every block stays uniform")
    full = {**src, **target}
    if full == src:
        raise PruneError(f"--target-shape: {target} is the model's own shape; nothing to prune")
    try:  # the result must be a config stock code accepts (LlamaConfig wants hidden_size % heads == 0)
        type(cfg).from_dict(_config_values(cfg, full))
    except Exception as e:  # noqa: BLE001 - any refusal of the config class is the user's to see
        raise PruneError(f"--target-shape {','.join(f'{k}={v}' for k, v in full.items())}: {type(cfg).__name__} "
                         f"refuses that shape ({str(e).splitlines()[-1].strip()})") from None
    return full


def shape_fields(cfg, shape: dict[str, int]) -> dict:
    """The config fields of ``shape`` (head_dim kept explicit: the stock default hidden // heads would change it)."""
    r = group_size(cfg)
    return {"num_hidden_layers": shape["layers"], "hidden_size": shape["hidden"], "num_attention_heads": shape["heads"],
            "num_key_value_heads": shape["heads"] // r, "intermediate_size": shape["intermediate"], "head_dim": head_dim(cfg)}


def _config_values(cfg, shape: dict[str, int]) -> dict:
    """The config's values with ``shape`` written in."""
    out = {**cfg.to_dict(), **shape_fields(cfg, shape)}
    if out.get("layer_types"):
        out["layer_types"] = out["layer_types"][: shape["layers"]]
    return out


def head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


# ---------------------------------------------------------------- hard-concrete masks


class HardConcrete(torch.nn.Module):
    """Masks of shape ``shape`` (rows × units, or units), ``keep`` units kept per row at the end."""

    def __init__(self, shape, keep: int, lr: float | None = None):
        super().__init__()
        self.log_alpha = torch.nn.Parameter(INIT_LOG_ALPHA + 0.01 * torch.randn(shape))
        self.log_alpha.lr = lr  # Trainer gives a parameter with ``lr`` its own learning rate
        self.keep = keep
        self.register_buffer("u", torch.full(shape, 0.5), persistent=False)

    def resample(self) -> None:
        self.u = torch.empty_like(self.u).uniform_(EPS, 1 - EPS)

    def forward(self) -> torch.Tensor:
        if not self.training:
            return self.binary().to(self.log_alpha.dtype)
        s = torch.sigmoid((torch.log(self.u) - torch.log(1 - self.u) + self.log_alpha) / TEMPERATURE)
        return (s * (LIMIT_B - LIMIT_A) + LIMIT_A).clamp(0, 1)

    def nonzero_prob(self) -> torch.Tensor:
        """P(z ≠ 0) per unit: 1 − CDF of the stretched concrete at 0."""
        xn = -LIMIT_A / (LIMIT_B - LIMIT_A)
        return 1 - torch.sigmoid(math.log(xn / (1 - xn)) * TEMPERATURE - self.log_alpha).clamp(EPS, 1 - EPS)

    def expected_sparsity(self) -> torch.Tensor:
        """Per row (or a scalar for a 1-d mask): the expected fraction of units pruned."""
        return 1 - self.nonzero_prob().mean(-1)

    def target_sparsity(self) -> float:
        return 1 - self.keep / self.log_alpha.shape[-1]

    @torch.no_grad()
    def binary(self) -> torch.Tensor:
        """The final mask: the ``keep`` largest log α of each row (ties: the lower index)."""
        la = self.log_alpha.detach().float()
        flat = la.reshape(-1, la.shape[-1])
        order = torch.argsort(-flat, dim=-1, stable=True)[:, : self.keep]
        return torch.zeros_like(flat, dtype=torch.bool).scatter_(1, order, True).reshape(la.shape)

    def constrain(self) -> None:
        with torch.no_grad():
            self.log_alpha.clamp_(*LOG_ALPHA_RANGE)


class _Reverse(torch.autograd.Function):
    """Identity forward, negated gradient: the optimizer that minimises the loss maximises over λ."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -grad


class ShapeMasks(torch.nn.Module):
    """The masks of every module the target shrinks, and their Lagrange multipliers."""

    def __init__(self, config, target: dict[str, int], *, lr: float | None = None, warmup: int = 0):
        super().__init__()
        src = source_shape(config)
        r = group_size(config)
        self.head_dim = head_dim(config)
        self.group = r
        shapes = {"layers": ([src["layers"]], target["layers"]), "hidden": ([src["hidden"]], target["hidden"]),
                  "heads": ([src["layers"], src["heads"] // r], target["heads"] // r),
                  "intermediate": ([src["layers"], src["intermediate"]], target["intermediate"])}
        self.masks = torch.nn.ModuleDict({k: HardConcrete(*shapes[k], lr=lr) for k in KEYS if target[k] < src[k]})
        self.lambdas = torch.nn.ParameterDict({f"{i}_{k}": torch.nn.Parameter(torch.zeros(())) for k in self.masks for i in (1, 2)})
        for p in self.lambdas.values():
            p.lr = lr
        self.warmup = warmup
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))  # in the state: a resumed run ramps on

    def resample(self) -> None:
        for m in self.masks.values():
            m.resample()

    def z(self, key: str):
        """The current mask of ``key`` (None when the target leaves it whole)."""
        return self.masks[key]() if key in self.masks else None

    def lagrangian(self) -> torch.Tensor:
        """Σ over masks of mean over rows of λ₁(ŝ − t) + λ₂(ŝ − t)², t warmed up linearly over ``warmup`` steps."""
        ramp = min(1.0, int(self.steps) / self.warmup) if self.warmup else 1.0
        total = 0.0
        for k, m in self.masks.items():
            gap = m.expected_sparsity() - ramp * m.target_sparsity()
            l1, l2 = _Reverse.apply(self.lambdas[f"1_{k}"]), _Reverse.apply(self.lambdas[f"2_{k}"])
            total = total + (l1 * gap + l2 * gap**2).mean()
        return total

    def step_penalty(self) -> torch.Tensor:
        """Once per training step, before its forward passes: keep log α in range, draw this step's noise,
        return the Lagrangian."""
        for m in self.masks.values():
            m.constrain()
        self.resample()
        self.steps += 1
        return self.lagrangian()

    @torch.no_grad()
    def report(self) -> dict:
        """Expected and target sparsity per mask, the multipliers (for metrics and prune.json)."""
        out = {}
        for k, m in self.masks.items():
            out[k] = {"expected_sparsity": round(float(m.expected_sparsity().mean()), 4),
                      "target_sparsity": round(m.target_sparsity(), 4),
                      "lambda_1": round(float(self.lambdas[f"1_{k}"]), 4), "lambda_2": round(float(self.lambdas[f"2_{k}"]), 4)}
        return out

    def kept(self, config) -> dict[str, torch.Tensor]:
        """The final binary masks; a module the target leaves whole is all True."""
        src = source_shape(config)
        whole = {"layers": [src["layers"]], "hidden": [src["hidden"]], "heads": [src["layers"], src["heads"] // self.group],
                 "intermediate": [src["layers"], src["intermediate"]]}
        return {k: self.masks[k].binary() if k in self.masks else torch.ones(whole[k], dtype=torch.bool) for k in KEYS}


# ---------------------------------------------------------------- masking the weights


class _Scaled(torch.nn.Module):
    """A weight (or bias) times the masks. ``rows``: its output rows are the residual stream written by block
    ``block`` (hidden mask × the block's layer mask); ``cols``: its input columns are that block's ``heads`` or
    ``intermediate`` units, or the ``hidden`` dims (the embedding matrix). Declarative, not closures, so a deep
    copy of the model (Trainer's export copy) scales by its own copy of the masks."""

    def __init__(self, masks: ShapeMasks, *, block: int | None = None, rows: bool = False, cols: str | None = None):
        super().__init__()
        self.shape_masks, self.block, self.rows, self.cols = masks, block, rows, cols

    def _row_scale(self):
        h, layer = self.shape_masks.z("hidden"), self.shape_masks.z("layers")
        layer = None if layer is None else layer[self.block]
        if h is None:
            return layer
        return h if layer is None else h * layer

    def _col_scale(self):
        m = self.shape_masks
        z = m.z(self.cols)
        if z is None or self.cols == "hidden":
            return z
        z = z[self.block]
        return z.repeat_interleave(m.group * m.head_dim) if self.cols == "heads" else z

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        r = self._row_scale() if self.rows else None
        if r is not None:
            w = w * (r[:, None] if w.ndim == 2 and r.ndim == 1 else r).to(w.dtype)
        c = self._col_scale() if self.cols else None
        if c is not None:
            w = w * c.to(w.dtype)[None, :]
        return w


def attach(model, masks: ShapeMasks) -> None:
    """Scale the decoder's weights by the masks (parametrizations; see the module docstring)."""
    if "hidden" in masks.masks:
        parametrize.register_parametrization(model.get_input_embeddings(), "weight", _Scaled(masks, cols="hidden"))
    for i, layer in enumerate(model.layers):
        for lin, cols in ((layer.self_attn.o_proj, "heads"), (layer.mlp.down_proj, "intermediate")):
            parametrize.register_parametrization(lin, "weight", _Scaled(masks, block=i, rows=True, cols=cols))
            if lin.bias is not None:
                parametrize.register_parametrization(lin, "bias", _Scaled(masks, block=i, rows=True))


def fold(model) -> None:
    """Multiply the final binary masks into the weights and remove the parametrizations: stock weights with the
    pruned units zero."""
    for m in model.modules():
        if isinstance(m, ShapeMasks):
            m.eval()
    for module in list(model.modules()):
        if parametrize.is_parametrized(module):
            for name in list(module.parametrizations):
                if isinstance(module.parametrizations[name][0], _Scaled):
                    parametrize.remove_parametrizations(module, name, leave_parametrized=True)


# ---------------------------------------------------------------- removing the pruned units


def _linear(old, out_idx=None, in_idx=None):
    w, b = old.weight.detach(), None if old.bias is None else old.bias.detach()
    if out_idx is not None:
        w, b = w[out_idx], None if b is None else b[out_idx]
    if in_idx is not None:
        w = w[:, in_idx]
    new = torch.nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        new.weight.copy_(w)
        if b is not None:
            new.bias.copy_(b)
    return new


def _norm(norm, idx, scale: float, eps_scale: float):
    with torch.no_grad():
        norm.weight = torch.nn.Parameter(norm.weight.detach()[idx] * scale)
    for attr in ("variance_epsilon", "eps"):
        if hasattr(norm, attr):
            setattr(norm, attr, getattr(norm, attr) * eps_scale)


@torch.no_grad()
def reshape(model, kept: dict[str, torch.Tensor]) -> dict[str, int]:
    """Remove every unit the binary masks ``kept`` drop (from a model whose pruned units are folded to zero, or
    not: the slicing is the same); rewrites the config. Returns the new shape."""
    cfg = model.config
    hd, r = head_dim(cfg), group_size(cfg)
    d = cfg.hidden_size
    hidden = torch.nonzero(kept["hidden"]).flatten()
    d2 = len(hidden)
    scale, eps_scale = math.sqrt(d / d2), d / d2
    emb = model.get_input_embeddings()
    new_emb = torch.nn.Embedding(emb.num_embeddings, d2, padding_idx=emb.padding_idx, device=emb.weight.device, dtype=emb.weight.dtype)
    new_emb.weight.copy_(emb.weight.detach()[:, hidden])
    model.set_input_embeddings(new_emb)
    for i, layer in enumerate(model.layers):
        att, mlp = layer.self_attn, layer.mlp
        groups = torch.nonzero(kept["heads"][i]).flatten()
        kv = torch.cat([torch.arange(g * hd, (g + 1) * hd) for g in groups.tolist()])
        q = torch.cat([torch.arange(g * r * hd, (g + 1) * r * hd) for g in groups.tolist()])
        att.q_proj = _linear(att.q_proj, q, hidden)
        att.k_proj = _linear(att.k_proj, kv, hidden)
        att.v_proj = _linear(att.v_proj, kv, hidden)
        att.o_proj = _linear(att.o_proj, hidden, q)
        neurons = torch.nonzero(kept["intermediate"][i]).flatten()
        mlp.gate_proj = _linear(mlp.gate_proj, neurons, hidden)
        mlp.up_proj = _linear(mlp.up_proj, neurons, hidden)
        mlp.down_proj = _linear(mlp.down_proj, hidden, neurons)
        if hasattr(mlp, "intermediate_size"):
            mlp.intermediate_size = len(neurons)
        if hasattr(mlp, "hidden_size"):
            mlp.hidden_size = d2
        _norm(layer.input_layernorm, hidden, scale, eps_scale)
        _norm(layer.post_attention_layernorm, hidden, scale, eps_scale)
    _norm(model.norm, hidden, scale, eps_scale)
    shape = {"layers": cfg.num_hidden_layers, "hidden": d2, "heads": int(kept["heads"][0].sum()) * r,
             "intermediate": int(kept["intermediate"][0].sum())}  # blocks: drop_blocks below
    for field, value in shape_fields(cfg, shape).items():
        setattr(cfg, field, value)
    cfg.rms_norm_eps = cfg.rms_norm_eps * eps_scale
    drop = [i for i, k in enumerate(kept["layers"].tolist()) if not k]
    if drop:
        drop_blocks(model, drop)
    return source_shape(cfg)
