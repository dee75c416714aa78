"""Where a model's blocks and sub-layers are: the two block layouts ``prune`` knows.

- **decoder** (Llama family: Llama, Qwen2, SmolLM2, ...): ``model.layers``, each block pre-norm,
  ``h = x + Attn(norm(x)); y = h + MLP(norm(h))``. The stream between the two sub-layers is the input of
  ``post_attention_layernorm``. Either sub-layer can be removed alone: with its weights zero it adds exactly 0 to
  the residual stream (retrctl/prune/surgery.py).
- **encoder** (BERT family: BERT, MiniLM, RoBERTa, XLM-R, ELECTRA, MPNet): ``model.encoder.layer``, each layer
  post-norm, ``h = LN_a(x + Attn(x)); y = LN_m(h + MLP(h))`` with the MLP as ``intermediate`` + ``output``. The
  stream between the two sub-layers is the input of ``intermediate``. Only whole layers can be removed: a
  sub-layer's LayerNorm sits on the residual stream itself, so taking the attention (or MLP) out still leaves
  ``LN_a(x)``, a learned re-scaling of the stream that is neither the identity nor what the importance score
  measured, and no stock BERT config can leave it out. A whole layer is removed exactly (the next layer reads
  the previous layer's output), so ``prune`` offers encoders ``--drop-layers`` and ``--target-params`` (whole
  layers only) and refuses the sub-layer flags.
"""

from __future__ import annotations

import dataclasses

DECODER, ENCODER = "decoder", "encoder"


@dataclasses.dataclass
class Stack:
    """A model's blocks: the module that holds them, the attribute naming the ``ModuleList``, and the layout."""

    owner: object
    attr: str
    kind: str

    @property
    def layers(self):
        return getattr(self.owner, self.attr)

    def set_layers(self, layers) -> None:
        setattr(self.owner, self.attr, layers)

    def middle(self, layer):
        """The module whose input is the residual stream between the attention and the MLP sub-layer."""
        return layer.post_attention_layernorm if self.kind == DECODER else layer.intermediate

    def attention(self, layer) -> list:
        return [layer.self_attn] if self.kind == DECODER else [layer.attention]

    def mlp(self, layer) -> list:
        """The MLP sub-layer's modules (a BERT layer's MLP is ``intermediate`` and ``output`` with its LayerNorm)."""
        return [layer.mlp] if self.kind == DECODER else [layer.intermediate, layer.output]

    def embeddings(self, model) -> list:
        """Modules whose parameters are lookup tables, not compute: a decoder's input embeddings; an encoder's
        whole ``embeddings`` module (words, positions, token types and their LayerNorm)."""
        return [model.get_input_embeddings()] if self.kind == DECODER else [model.embeddings]


def _is_decoder_block(layer) -> bool:
    return all(hasattr(layer, a) for a in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm"))


def _is_encoder_layer(layer) -> bool:
    return all(hasattr(layer, a) for a in ("attention", "intermediate", "output"))


def stack(model) -> Stack | None:
    """The model's blocks; None when it has neither layout (``surgery.blocks_of`` says so to the user)."""
    layers = getattr(model, "layers", None)
    if layers is not None and len(layers) > 0 and all(_is_decoder_block(b) for b in layers):
        return Stack(model, "layers", DECODER)
    encoder = getattr(model, "encoder", None)
    layers = getattr(encoder, "layer", None)
    if layers is not None and len(layers) > 0 and all(_is_encoder_layer(b) for b in layers) and hasattr(model, "embeddings"):
        return Stack(encoder, "layer", ENCODER)
    return None
