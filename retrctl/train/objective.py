"""A training step's objective, composed from ``losses`` by what the encoder trains: the dense InfoNCE (with
Matryoshka and distillation), wrapped by LightRetriever's joint token-lookup loss, then by the sparse head's terms
(SPLADE) or BGE-M3's multi-head objective (lexical and/or colbert heads, self-distillation). Each wrapper splits its
part off the end of the raw outputs (``Encoder.forward(raw=True)`` appends them in the same order)."""

from __future__ import annotations

import functools

import torch

from retrctl.train import losses
from retrctl.train.config import TrainConfig, parse_floats


def step_loss(cfg: TrainConfig, enc, local: list, mask: torch.Tensor, teacher, valid, steps_done: int):
    """``loss_fn(q, p) -> (loss, parts)`` for this process's examples ``local``."""
    g = cfg.train_group_size
    loss_fn = functools.partial(
        losses.group_loss, group_size=g, temperature=cfg.temperature, normalize=enc.config.normalize,
        mrl_dims=cfg.mrl_dims, mask=mask, teacher=teacher, teacher_valid=valid, distill_weight=cfg.distill_weight,
        teacher_temperature=cfg.teacher_temperature)
    if cfg.query_encoder == "token-lookup":
        loss_fn = functools.partial(losses.joint_lookup_loss, loss=loss_fn, kl_weight=cfg.lookup_kl_weight,
                                    temperature=cfg.temperature, normalize=enc.config.normalize, mask=mask)
    terms = None
    if enc.train_sparse and cfg.sparse_queries() == "tokens":  # LightRetriever: the query side is token counts, no encoder
        terms = enc.sparse.counts(enc.tokenizer, [e.query for e in local], enc.config.query_max_len)
    flops_weight = losses.flops_weight_at(steps_done, cfg.flops_weight, cfg.flops_warmup)
    if enc.train_colbert or (enc.train_sparse and enc.sparse.weights == "lexical"):  # BGE-M3's objective
        return functools.partial(
            losses.m3_loss, loss=loss_fn, group_size=g, temperature=cfg.temperature, normalize=enc.config.normalize,
            vocab=enc.sparse.vocab if enc.train_sparse else 0, colbert_dim=enc.colbert.out_dim if enc.train_colbert else 0,
            caps=(enc.config.query_max_len, enc.config.passage_max_len), query_terms=terms,
            weights=parse_floats(cfg.ensemble_weights, 3, "--ensemble-weights"),
            lambdas=parse_floats(cfg.head_loss_weights, 3, "--head-loss-weights"), self_distill=cfg.self_distill,
            flops_weight=flops_weight if enc.train_sparse and enc.sparse.weights == "splade" else 0.0, mask=mask)
    if enc.train_sparse:
        return functools.partial(losses.sparse_loss, loss=loss_fn, vocab=enc.sparse.vocab, group_size=g,
                                 query_terms=terms, mask=mask, flops_weight=flops_weight)
    return loss_fn


def output_width(enc) -> int:
    """Floats of one text's training output: the dense vector, the sparse head's term weights, the colbert block."""
    width = enc.model.config.hidden_size + (enc.sparse.vocab if enc.train_sparse else 0)
    if enc.train_colbert:
        width += enc.colbert.out_dim * max(enc.config.query_max_len, enc.config.passage_max_len)
    return width
