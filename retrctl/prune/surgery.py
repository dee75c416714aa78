"""What to remove (a plan from importance scores) and removing it from a Llama-family decoder.

Whole blocks (``--drop-layers``, ShortGPT) are taken out of ``model.layers``: the result is a uniform model, a
stock config with a smaller ``num_hidden_layers`` (and ``layer_types`` cut to match), and each attention
module's ``layer_idx`` renumbered 0..n-1. Without the renumbering the KV cache is indexed past its end on any
forward with the cache on (transformers#28462, ShortGPT#8); ``num_hidden_layers`` must change before a reload,
or a stock reload builds the removed blocks again with random weights.

Single sub-layers (``--drop-mlp``, ``--drop-attn``: an MLP removed in some blocks only) make a non-uniform model,
which no stock transformers config expresses for Llama blocks (checked in transformers 5.23):
- ``LlamaConfig``/``Qwen2Config`` take one ``intermediate_size`` and one head count for every layer.
- Gemma3n takes a per-layer ``intermediate_size`` list, but its block is not Llama's: four norms per block,
  AltUp, LAuReL and per-layer input gates, GELU-tanh; weights cannot be mapped onto it exactly.
- NemotronH's ``layers_block_type`` has attention-only and MLP-only blocks, but its attention applies no RoPE
  and its MLP is ungated (``relu2``, up/down only) where Llama's is SwiGLU (gate/up/down).
- flint's ``mlp_only_layers`` (like Qwen2-MoE's) picks a dense MLP instead of a mixture of experts; it cannot
  remove one, and its attention has sinks and a sliding window.
So a removed sub-layer is saved as **zeros in a stock config**: with every projection of an MLP (or of an
attention) zero, the sub-layer adds exactly 0 to the residual stream (``down_proj(act(0)·0) = 0``; zero values
give a zero attention output), so stock ``AutoModel.from_pretrained(dir)`` gives the pruned model's hidden states
exactly, with no custom code and no ``trust_remote_code``, and retrctl's own loader, sentence-transformers,
``retrctl train`` and ``index`` all read it unchanged. All-zero is also a fixed point of training: each of the
three projections' gradients is a product with another one's (zero) output, so ``retrctl train`` on the pruned
model cannot revive a removed sub-layer (tested). The cost: zeros save no compute and no disk
(bench/RESULTS.md, prune: the zero form encodes as slowly as the unpruned model). The speed-up needs the
sub-layer really skipped: ``config.retrctl_pruned`` lists the removed sub-layers and ``skip_removed`` here skips
them in memory, with the same outputs (for inference only: a skipped sub-layer has no weights to save, so a model
to be trained or saved keeps the zero form). No modeling file or ``auto_map`` is written: a dir that asks for
``trust_remote_code`` teaches users to run code that came with a model. retrctl's inference loads (index, search,
mine: ``Encoder.load(..., inference=True)``) skip them by themselves (models/skipping.py). A result that is uniform (whole blocks only) is a plain stock model.
"""

from __future__ import annotations

import dataclasses

from retrctl.errors import UsageError
from retrctl.models import skipping

SUBLAYERS = {"attention": "self_attn", "mlp": "mlp"}


class PruneError(UsageError):
    """A request the model cannot meet (too many layers, nothing to do, a bad budget): a usage error."""


class NotPrunable(PruneError):
    """The model is not a Llama-family decoder (e.g. an encoder-only BERT)."""


def check_decoder(model) -> None:
    layers = getattr(model, "layers", None)
    ok = layers is not None and len(layers) > 0 and all(
        all(hasattr(layer, a) for a in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")) for layer in layers)
    if not ok:
        raise NotPrunable(f"{type(model).__name__} is not a Llama-family decoder (blocks of self_attn + mlp with pre-norms); "
                          "layer dropping needs one (an encoder-only model such as BERT/MiniLM cannot be pruned this way)")


# ---------------------------------------------------------------- sizes


def embedding_ids(model) -> set[int]:
    return {id(p) for p in model.get_input_embeddings().parameters()}


def sublayer_params(model) -> dict:
    """Parameters per block of each kind ("attention", "mlp", "block" = all of the block, norms included) and
    "total": the model's non-embedding count."""
    out = {"attention": [], "mlp": [], "block": [], "total": non_embedding_params(model)}
    for layer in model.layers:
        out["attention"].append(sum(p.numel() for p in layer.self_attn.parameters()))
        out["mlp"].append(sum(p.numel() for p in layer.mlp.parameters()))
        out["block"].append(sum(p.numel() for p in layer.parameters()))
    return out


def non_embedding_params(model) -> int:
    """Non-embedding parameters that compute: the removed (zeroed) sub-layers of ``config.retrctl_pruned`` do not
    count, as in the skipped form."""
    emb = embedding_ids(model)
    total = sum(p.numel() for p in model.parameters() if id(p) not in emb)
    pruned = getattr(model.config, "retrctl_pruned", None) or {}
    for kind, attr in SUBLAYERS.items():
        for i in pruned.get(kind, []):
            total -= sum(p.numel() for p in getattr(model.layers[i], attr).parameters())
    for i, width in enumerate(pruned.get("mlp_width") or []):  # self-slimmed: a zeroed neuron is a gate/up row + down column
        mlp = model.layers[i].mlp
        if i not in pruned.get("mlp", []) and width < mlp.down_proj.in_features:
            total -= (mlp.down_proj.in_features - width) * (mlp.gate_proj.in_features + mlp.up_proj.in_features + mlp.down_proj.out_features)
    return total


# ---------------------------------------------------------------- the plan


@dataclasses.dataclass
class Plan:
    """What to remove, in the source model's block numbers."""

    blocks: list[int] = dataclasses.field(default_factory=list)
    mlp: list[int] = dataclasses.field(default_factory=list)
    attention: list[int] = dataclasses.field(default_factory=list)

    def masks(self, n: int) -> dict[str, list[int]]:
        """1 = kept, per source block; a sub-layer of a removed block is removed too."""
        return {"block": [int(i not in self.blocks) for i in range(n)],
                "mlp": [int(i not in self.blocks and i not in self.mlp) for i in range(n)],
                "attention": [int(i not in self.blocks and i not in self.attention) for i in range(n)]}

    @property
    def uniform(self) -> bool:
        return not self.mlp and not self.attention


def _order(scores: list[float], exclude=()) -> list[int]:
    """Block numbers, least important first (ties: the lower number)."""
    return sorted((i for i in range(len(scores)) if i not in exclude), key=lambda i: (scores[i], i))


def _least(scores: list[float], n: int, exclude=()) -> list[int]:
    return sorted(_order(scores, exclude)[:n])


def plan(scores: dict, sizes: dict, *, drop_layers: int = 0, drop_mlp: int = 0, drop_attn: int = 0,
         target_params: float | None = None, max_mlp_share: float = 0.5, already: dict | None = None) -> Plan:
    """Choose the sub-layers to remove: the least important of each group (attention and MLP ranked apart).

    ``target_params`` (a fraction of the non-embedding parameters to keep) drops MLPs, least important first, up
    to ``max_mlp_share`` of them, then whole blocks by Block Influence, until the count is at or under budget.
    The cap keeps a feed-forward in most blocks: without it a budget would be met by removing every MLP first.
    ``already`` ({"mlp": [...], "attention": [...]}, a pruned model's ``config.retrctl_pruned``) are not chosen
    again. PruneError, naming the flag, for a request the model cannot meet."""
    n = len(scores["block"])
    if target_params is not None:
        if drop_layers or drop_mlp or drop_attn:
            raise PruneError("--target-params chooses what to drop itself: give it alone, without --drop-*")
        if not 0 < target_params < 1:
            raise PruneError(f"--target-params must be a fraction in (0, 1) of the non-embedding parameters, got {target_params}")
        return _plan_budget(scores, sizes, target_params, max_mlp_share, already)
    if not (drop_layers or drop_mlp or drop_attn):
        raise PruneError("nothing to do: give --drop-mlp, --drop-attn, --drop-layers or --target-params")
    for flag, k in (("--drop-layers", drop_layers), ("--drop-mlp", drop_mlp), ("--drop-attn", drop_attn)):
        if k < 0:
            raise PruneError(f"{flag} must be >= 0, got {k}")
    if drop_layers >= n:
        raise PruneError(f"--drop-layers {drop_layers}: the model has {n} blocks; at least one must stay")
    already = already or {}
    blocks = _least(scores["block"], drop_layers)
    chosen = {}
    for flag, kind, k in (("--drop-mlp", "mlp", drop_mlp), ("--drop-attn", "attention", drop_attn)):
        gone = set(blocks) | set(already.get(kind, []))
        if k > n - len(gone):
            raise PruneError(f"{flag} {k}: only {n - len(gone)} {kind} sub-layers are left to remove "
                             f"({n} blocks{', after --drop-layers' if drop_layers else ''})")
        chosen[kind] = _least(scores[kind], k, gone)
    return Plan(blocks, chosen["mlp"], chosen["attention"])


def _plan_budget(scores, sizes, fraction, max_mlp_share, already) -> Plan:
    """``sizes`` also holds "total": the model's non-embedding count (already-removed sub-layers not counted)."""
    n = len(scores["block"])
    budget = fraction * sizes["total"]
    gone = {k: set((already or {}).get(k, [])) for k in ("mlp", "attention")}
    p = Plan()

    def count():
        # sub-layers removed before this run are not in "total" already
        block = sum(sizes["block"][i] - sizes["mlp"][i] * (i in gone["mlp"]) - sizes["attention"][i] * (i in gone["attention"])
                    for i in p.blocks)
        return sizes["total"] - block - sum(sizes["mlp"][i] for i in p.mlp if i not in p.blocks)

    for i in _order(scores["mlp"], gone["mlp"])[: max(0, int(max_mlp_share * n) - len(gone["mlp"]))]:
        if count() <= budget:
            break
        p.mlp.append(i)
    for i in _order(scores["block"]):
        if count() <= budget or len(p.blocks) == n - 1:
            break
        p.blocks.append(i)
    if count() > budget:
        raise PruneError(f"--target-params {fraction}: cannot get under {budget:.0f} non-embedding parameters "
                         "while keeping one block")
    p.mlp = sorted(i for i in p.mlp if i not in p.blocks)
    p.blocks.sort()
    return p


# ---------------------------------------------------------------- applying it


def zero_sublayers(model, kind: str, blocks: list[int]) -> None:
    """The stock-loadable form of a removed sub-layer: every parameter of it zero (it then adds exactly 0)."""
    for i in blocks:
        for p in getattr(model.layers[i], SUBLAYERS[kind]).parameters():
            p.data.zero_()


def drop_blocks(model, blocks: list[int]) -> list[int]:
    """Take whole blocks out; renumber ``layer_idx`` and rewrite the config. Returns the kept source indices."""
    import torch

    kept = [i for i in range(len(model.layers)) if i not in set(blocks)]
    model.layers = torch.nn.ModuleList(model.layers[i] for i in kept)
    for new, layer in enumerate(model.layers):
        for m in layer.modules():
            if hasattr(m, "layer_idx"):
                m.layer_idx = new
    cfg = model.config
    cfg.num_hidden_layers = len(kept)
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[i] for i in kept]
    return kept


def apply(model, p: Plan) -> None:
    """Remove what the plan says, in the stock form (blocks out, sub-layers zeroed and listed in
    ``config.retrctl_pruned`` in the new block numbers)."""
    check_decoder(model)
    zero_sublayers(model, "mlp", p.mlp)
    zero_sublayers(model, "attention", p.attention)
    earlier = getattr(model.config, "retrctl_pruned", None) or {}  # a pruned model pruned again keeps its removals
    kept = drop_blocks(model, p.blocks) if p.blocks else list(range(len(model.layers)))
    new = {old: i for i, old in enumerate(kept)}
    pruned = {k: sorted(new[i] for i in {*getattr(p, k), *earlier.get(k, [])} if i in new) for k in ("mlp", "attention")}
    if earlier.get("mlp_width"):  # widths of self-slimmed MLPs follow their blocks
        pruned["mlp_width"] = [earlier["mlp_width"][i] for i in kept]
    if pruned["mlp"] or pruned["attention"] or pruned.get("mlp_width"):
        model.config.retrctl_pruned = pruned
    elif hasattr(model.config, "retrctl_pruned"):
        del model.config.retrctl_pruned


def skip_removed(model) -> None:
    """Really skip the sub-layers listed in ``config.retrctl_pruned`` (in memory): same outputs, less compute."""
    skipping.skip_removed(model)
