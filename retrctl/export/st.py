"""The sentence-transformers dir of an export, and its check with stock ``SentenceTransformer``.

``Encoder.save`` already writes a stock-loadable layout (modules.json, 1_Pooling, 2_Normalize, prompts, max
length, retrctl.json). With Matryoshka ``dims`` an identity ``Dense`` (hidden → dims, no bias, Identity
activation) goes between pooling and ``Normalize``: stock ``SentenceTransformer`` applies ``truncate_dim`` only
after its modules, i.e. after normalising, so vectors would come out short of unit norm; with
the Dense module it truncates and then renormalises, as retrctl does, and ``truncate_dim`` is a no-op.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

log = logging.getLogger("retrctl.export")


def write(enc, out: Path) -> None:
    """The model dir ``out`` (sentence-transformers layout + retrctl.json), dims as an identity Dense, and the
    query cap where it differs from the passage cap."""
    enc.save(out)
    write_lengths(enc.config, out)
    dims = enc.config.dims
    if not dims:
        return
    import torch
    from sentence_transformers.sentence_transformer.modules import Dense

    hidden = enc.model.config.hidden_size
    dense = Dense(hidden, dims, bias=False, activation_function=torch.nn.Identity(), init_weight=torch.eye(hidden)[:dims].clone())
    (out / "2_Dense").mkdir()
    dense.save(str(out / "2_Dense"))
    modules = json.loads((out / "modules.json").read_text())
    at = next((i for i, m in enumerate(modules) if m["type"].endswith("Normalize")), len(modules))
    modules.insert(at, {"path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    for i, m in enumerate(modules):
        m.update(idx=i, name=str(i))
        if m["type"].endswith("Normalize"):
            (out / m["path"]).rename(out / f"{i}_Normalize")
            m["path"] = f"{i}_Normalize"
    (out / "modules.json").write_text(json.dumps(modules, indent=2))


def write_lengths(config, out: Path) -> None:
    """A query cap other than the passage cap as the Transformer's ``query_length``/``document_length``, which
    sentence-transformers 6 applies in ``encode_query``/``encode_document`` (``max_seq_length`` stays the passage
    cap for plain ``encode``). Only in an export: releases before these keys refuse a config that has them, and
    ``Encoder.save``'s model dirs stay loadable by those."""
    if config.query_max_len == config.passage_max_len:  # both always set: Encoder.load fills the model's own
        return
    path = out / "sentence_bert_config.json"
    sb = json.loads(path.read_text())
    sb.update(query_length=config.query_max_len, document_length=config.passage_max_len)
    path.write_text(json.dumps(sb, indent=2))


def stock_parity(enc, out: Path, texts: list[str], ref: dict | None = None) -> dict:
    """Stock ``SentenceTransformer(out)``'s ``encode_query``/``encode_document`` (its saved prompts and lengths)
    against ``enc.encode`` on ``texts``, or against ``ref`` ({kind: vectors}, the fp32 model's, for a cast export):
    the largest absolute difference, the smallest and the mean cosine."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(out), device="cpu", trust_remote_code=False)
    worst, cos, coss = 0.0, 1.0, []
    for kind, stock in (("query", st.encode_query), ("passage", st.encode_document)):
        ours = ref[kind] if ref is not None else enc.encode(texts, kind)
        theirs = stock(texts, convert_to_numpy=True, batch_size=len(texts))
        if theirs.shape != ours.shape:
            return {"max_abs_diff": float("inf"), "min_cos": -1.0, "shape": list(theirs.shape)}
        worst = max(worst, float(np.abs(theirs - ours).max()))
        theirs = theirs.astype(np.float32)
        coss.append(cosines(ours, theirs))
        cos = min(cos, float(coss[-1].min()))
    return {"max_abs_diff": worst, "min_cos": cos, "mean_cos": float(np.concatenate(coss).mean())}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    na = np.linalg.norm(a, axis=1).clip(1e-12)
    nb = np.linalg.norm(b, axis=1).clip(1e-12)
    return (a * b).sum(1) / (na * nb)


def write_token_model(enc, out: Path, model_cls, modules: list, special_ids: list[int]) -> None:
    """A stock sentence-transformers model of class ``model_cls`` (SparseEncoder, MultiVectorEncoder) saved to ``out``:
    ``Transformer`` (a copy of the backbone, so the dir stands alone; the model's prompts and caps), then
    ``modules`` on its token embeddings, each fed through a ``MultiVectorMask`` that leaves ``special_ids`` out on
    both sides (retrctl's heads give special tokens no term weight and no token vector)."""
    import tempfile

    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    cfg = enc.config
    special = enc.tokenizer.convert_ids_to_tokens(special_ids)
    mask = MultiVectorMask(skiplist_words=special, skiplist_tasks=["query", "document"])
    prompts = {k: v for k, v in (("query", cfg.prompt("query")), ("document", cfg.prompt("passage"))) if v}
    head, *tail = modules
    with tempfile.TemporaryDirectory() as backbone:
        enc.model.save_pretrained(backbone)
        enc.tokenizer.save_pretrained(backbone)
        model = model_cls(modules=[Transformer(backbone, max_seq_length=cfg.passage_max_len), head, mask, *tail],
                          device="cpu", prompts=prompts or None)
        model.save(str(out))
    write_lengths(cfg, out)

