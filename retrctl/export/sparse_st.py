"""An encoder's sparse head as a stock sentence-transformers ``SparseEncoder`` dir (``--format sparse-encoder``).

retrctl's SPLADE head (models/sparse.py) is ``max_i log(1 + ReLU(h_i · E_j))`` over the real, non-special tokens
i, with the special terms' weights zero. sentence-transformers 6.2 expresses exactly that with stock modules, so
``SparseEncoder(DIST/sparse-encoder)`` loads it with no retrctl code and no ``trust_remote_code``:

- ``Transformer``: the backbone (a copy of its weights: the dir must stand alone, and sentence-transformers
  refuses module paths with ``..``), with the model's prompts and length caps;
- ``Dense`` on ``token_embeddings``: weight = the input embedding matrix (the tied MLM head), bias 0 except
  −1e6 on the special terms, identity activation: the per-token logits, special terms driven below zero;
- ``MultiVectorMask`` with the special tokens as its skiplist for queries and documents: it leaves them out of
  the pooling mask (not out of attention), as retrctl leaves them out of the max;
- ``SpladePooling("max", "relu")``: log1p(ReLU(·)), max over the masked tokens.

Not ST's ``MLMTransformer``: its ``BertForMaskedLM`` head adds a transform (dense, GELU, LayerNorm) that
all-MiniLM-L6-v2 does not ship (it would come up random) and that retrctl's head does not have.
Encoders with a symmetric head only: a decoder's chat template and missing masked-LM class do not fit
sentence-transformers' sparse modules (retrctl's own loader serves those), and LightRetriever's token-count
queries have no stock module (``encode_query`` would run the model).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from retrctl.errors import UsageError

SUBDIR = "sparse-encoder"
SPECIAL_BIAS = -1e6


def check(enc) -> None:
    """UsageError (nothing written) for a model this format cannot express."""
    from retrctl.models import is_decoder

    if getattr(enc, "sparse", None) is None:
        raise UsageError(f"--format sparse-encoder: {enc.source} has no sparse head (train one with --heads dense,sparse)")
    if is_decoder(enc.model.config):
        raise UsageError("--format sparse-encoder: sentence-transformers' sparse modules do not fit a decoder (its chat "
                         "template, no masked-LM class); retrctl loads its sparse head: retrctl index --method sparse --model DIST")
    if enc.sparse.weights == "lexical":
        raise UsageError("--format sparse-encoder: BGE-M3's lexical head (one learned weight per token, at the token's own "
                         "id) has no stock sentence-transformers module; retrctl serves it: retrctl index --model DIST")
    if enc.sparse.query != "encoder":
        raise UsageError("--format sparse-encoder: this model's sparse queries are token counts (LightRetriever), which no "
                         "stock SparseEncoder module computes (encode_query would run the model); train with "
                         "--sparse-query encoder for a symmetric SparseEncoder, or use retrctl's index")


def write(enc, out: Path) -> None:
    """The SparseEncoder dir ``out`` (see the module docstring)."""
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    from retrctl.export.st import write_token_model

    sp = enc.sparse
    weight = sp.weight.detach().float().cpu()
    bias = torch.zeros(sp.vocab)
    bias[sp.special_ids] = SPECIAL_BIAS
    dense = Dense(weight.shape[1], sp.vocab, bias=True, activation_function=torch.nn.Identity(), init_weight=weight.clone(),
                  init_bias=bias, module_input_name="token_embeddings")
    write_token_model(enc, out, SparseEncoder, [dense, SpladePooling("max", "relu")], sp.special_ids)
    (out / "retrctl_sparse.json").write_text(json.dumps({"from": "retrctl export --format sparse-encoder",
                                                         **sp.settings()}, indent=2) + "\n")


def stock_parity(enc, out: Path, texts: list[str]) -> dict:
    """Stock ``SparseEncoder(out)``'s ``encode_query``/``encode_document`` against retrctl's head (every term, not
    the top-k) on ``texts``: the largest absolute difference of a term weight."""
    from sentence_transformers import SparseEncoder

    from retrctl.models.sparse import to_csr

    st = SparseEncoder(str(out), device="cpu", trust_remote_code=False)
    top_k, enc.sparse.top_k = enc.sparse.top_k, 0
    try:
        worst = 0.0
        for kind, stock in (("query", st.encode_query), ("passage", st.encode_document)):
            ours = to_csr(*enc.encode_sparse(texts, kind), enc.sparse.vocab).toarray()
            theirs = stock(texts, convert_to_tensor=True, batch_size=len(texts)).to_dense().cpu().numpy()
            if theirs.shape != ours.shape:
                return {"max_abs_diff": float("inf"), "shape": list(theirs.shape)}
            worst = max(worst, float(np.abs(theirs - ours).max()))
    finally:
        enc.sparse.top_k = top_k
    return {"max_abs_diff": worst}
