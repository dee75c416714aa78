"""An encoder's colbert head as a stock sentence-transformers ``MultiVectorEncoder`` dir (``--format
multi-vector-encoder``).

retrctl's colbert head (models/colbert.py) is norm(W^T h_i + b) for every real, non-special token i.
sentence-transformers 6.2 has each step as a stock module, so ``MultiVectorEncoder(DIST/multi-vector-encoder)``
loads it with no retrctl code and no ``trust_remote_code`` (PyLate, the usual ColBERT loader, does not install
beside our transformers):

- ``Transformer``: the backbone (a copy of its weights, so the dir stands alone), the model's prompts and caps;
- ``Dense`` on ``token_embeddings``: the head's own ``Linear`` (identity activation), from its ``colbert/`` folder;
- ``MultiVectorMask`` with the special tokens as its skiplist for queries and documents (retrctl drops them on
  both sides);
- ``Normalize`` on ``token_embeddings``.

Queries are not padded with [MASK] expansion tokens (ColBERT's query augmentation): retrctl's head scores the
query's real tokens only, as BGE-M3 does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from retrctl.errors import UsageError

SUBDIR = "multi-vector-encoder"


def check(enc) -> None:
    """UsageError (nothing written) for a model this format cannot express."""
    from retrctl.models import is_decoder

    if getattr(enc, "colbert", None) is None:
        raise UsageError(f"--format multi-vector-encoder: {enc.source} has no colbert head "
                         "(train one with --heads dense,lexical,colbert)")
    if is_decoder(enc.model.config):
        raise UsageError("--format multi-vector-encoder: sentence-transformers wraps a decoder's inputs in its chat "
                         "template; retrctl serves this model's colbert head itself (retrctl index --model DIST)")


def write(enc, out: Path) -> None:
    """The MultiVectorEncoder dir ``out`` (see the module docstring)."""
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Normalize
    from sentence_transformers.base.modules.dense import Dense

    from retrctl.export.st import write_token_model

    head = enc.colbert
    lin = head.linear
    dense = Dense(lin.in_features, lin.out_features, bias=True, activation_function=torch.nn.Identity(),
                  init_weight=lin.weight.detach().float().cpu().clone(), init_bias=lin.bias.detach().float().cpu().clone(),
                  module_input_name="token_embeddings")
    write_token_model(enc, out, MultiVectorEncoder, [dense, Normalize(module_input_name="token_embeddings")],
                      head.special_ids)
    (out / "retrctl_colbert.json").write_text(json.dumps({"from": "retrctl export --format multi-vector-encoder",
                                                          "dim": head.out_dim}, indent=2) + "\n")


def stock_parity(enc, out: Path, texts: list[str]) -> dict:
    """Stock ``MultiVectorEncoder(out)``'s ``encode_query``/``encode_document`` against retrctl's head on ``texts``:
    the largest absolute difference of a token vector's component (inf when a text's token count differs)."""
    from sentence_transformers import MultiVectorEncoder

    st = MultiVectorEncoder(str(out), device="cpu", trust_remote_code=False)
    worst = 0.0
    for kind, stock in (("query", st.encode_query), ("passage", st.encode_document)):
        ours = enc.encode_colbert(texts, kind)
        theirs = stock(texts, batch_size=len(texts))
        for a, b in zip(ours, theirs, strict=True):
            b = b.float().cpu().numpy() if hasattr(b, "cpu") else np.asarray(b, np.float32)
            if a.shape != b.shape:
                return {"max_abs_diff": float("inf"), "shape": [list(a.shape), list(b.shape)]}
            worst = max(worst, float(np.abs(a - b).max()) if a.size else 0.0)
    return {"max_abs_diff": worst}
