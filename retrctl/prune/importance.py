"""Sub-layer importance: how much each attention and MLP sub-layer turns the residual stream.

EffiR (coarse step): a decoder block is ``h = x + Attn(norm(x)); y = h + MLP(norm(h))``. The importance of a
sub-layer is ``1 − cos(input, output)`` of the residual stream around it (its residual included), averaged over
calibration tokens: attention ``1 − cos(x, h)``, MLP ``1 − cos(h, y)``. The whole block's ``1 − cos(x, y)`` is
ShortGPT's Block Influence (Men et al. 2024, arXiv:2403.03853), used to pick whole blocks to drop.

A BERT-family encoder layer is ``h = LN_a(x + Attn(x)); y = LN_m(h + MLP(h))``: the same three gaps are measured
(each sub-layer's score then includes its LayerNorm, which sits on the stream) and Block Influence ``1 − cos(x, y)``
ranks whole layers, the only unit an encoder loses (retrctl/prune/anatomy.py); the sub-layer scores are reported
to show where a layer's change comes from.

Averages are over real tokens only (padding masked out on either side), token-weighted across the set, in
float32, so a text contributes in proportion to its length and the padding of a batch changes nothing (tested).
The states are read with forward hooks: the block's input, the stream between the two sub-layers (the input of
a decoder block's ``post_attention_layernorm``, of an encoder layer's ``intermediate``) and the block's output.
"""

from __future__ import annotations

import torch

from retrctl.prune.surgery import blocks_of

KINDS = ("attention", "mlp", "block")


def _first(args, kwargs, name):
    return args[0] if args else kwargs[name]


def _cos_gap(a, b, mask):
    """Sum over real tokens of 1 − cos(a, b) (float32)."""
    cos = torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)
    return ((1 - cos) * mask).sum().item()


@torch.inference_mode()
def importance(model, tokenizer, texts: list[str], *, max_length: int = 256, batch_size: int = 16, progress=None) -> dict:
    """{"attention": [...], "mlp": [...], "block": [...] (one score per block), "tokens": n} for a Llama-family
    decoder or a BERT-family encoder over ``texts`` cut at ``max_length`` tokens."""
    found = blocks_of(model)
    layers = found.layers
    sums = {k: [0.0] * len(layers) for k in KINDS}
    state: dict = {}
    hooks = []
    for i, layer in enumerate(layers):
        hooks.append(layer.register_forward_pre_hook(
            lambda m, a, kw, i=i: state.__setitem__(("in", i), _first(a, kw, "hidden_states")), with_kwargs=True))
        hooks.append(found.middle(layer).register_forward_pre_hook(
            lambda m, a, i=i: state.__setitem__(("mid", i), a[0])))
        hooks.append(layer.register_forward_hook(
            lambda m, a, out, i=i: state.__setitem__(("out", i), out[0] if isinstance(out, tuple) else out)))
    tokens = 0
    try:
        starts = range(0, len(texts), batch_size)
        for start in progress(starts, total=len(starts)) if progress else starts:
            batch = tokenizer(texts[start:start + batch_size], truncation=True, max_length=max_length, padding=True,
                              return_tensors="pt").to(next(model.parameters()).device)
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
            mask = batch["attention_mask"].float()
            tokens += int(mask.sum().item())
            for i in range(len(layers)):
                x, h, y = state[("in", i)], state[("mid", i)], state[("out", i)]
                sums["attention"][i] += _cos_gap(x, h, mask)
                sums["mlp"][i] += _cos_gap(h, y, mask)
                sums["block"][i] += _cos_gap(x, y, mask)
            state.clear()
    finally:
        for h in hooks:
            h.remove()
    if not tokens:
        raise ValueError("no calibration tokens: the calibration texts are empty")
    return {**{k: [s / tokens for s in v] for k, v in sums.items()}, "tokens": tokens}
