"""A training step's objective, composed from ``losses`` by what the run trains (its ``TrainingLayout``,
models/layout.py): the dense InfoNCE (with Matryoshka and distillation), or LightRetriever's joint token-lookup
loss around it, wrapped by the sparse head's terms (SPLADE) or BGE-M3's multi-head objective (lexical and/or colbert
heads, self-distillation), then by embedding distillation from a teacher. The step's outputs are split once, into
``StepOutputs`` (``TrainingLayout.split``); every loss of the composition reads its parts from them by name and
hands the loss it wraps the same ``StepOutputs``."""

from __future__ import annotations

import functools

import torch

from retrctl.models.layout import TrainingLayout
from retrctl.train import losses
from retrctl.train.config import TrainConfig, parse_floats


def step_loss(cfg: TrainConfig, enc, layout: TrainingLayout, local: list, mask: torch.Tensor, teacher, valid,
              steps_done: int, teacher_vectors: tuple | None = None, *, teacher_temperature: float):
    """``loss_fn(outputs) -> (loss, parts)`` for this process's examples ``local``, ``outputs`` the step's
    ``StepOutputs`` (``layout.split``). ``teacher_vectors``: (the teacher's vectors of the queries, of the passages,
    whether they are unit vectors) when the step distils the teacher's embeddings (``--embed-distill-weight``).
    ``teacher_temperature``: the run's (``cfg``'s, or the one ``--calibrate-teacher`` computed)."""
    g = cfg.train_group_size
    vectors = functools.partial(
        losses.group_loss, group_size=g, temperature=cfg.temperature, normalize=enc.config.normalize,
        mrl_dims=cfg.mrl_dims, mask=mask, teacher=teacher, teacher_valid=valid, distill_weight=cfg.distill_weight,
        teacher_temperature=teacher_temperature, distill_loss=cfg.distill_loss,
        contrastive_weight=cfg.contrastive_weight)
    if "lookup" in layout:
        loss_fn = functools.partial(losses.joint_lookup_loss, loss=vectors, kl_weight=cfg.lookup_kl_weight,
                                    temperature=cfg.temperature, normalize=enc.config.normalize, mask=mask)
    else:
        loss_fn = functools.partial(losses.dense_loss, loss=vectors)
    terms = None
    if layout.token_queries:  # LightRetriever: the query side is token counts, no encoder
        terms = enc.sparse.counts(enc.tokenizer, [e.query for e in local], enc.config.query_max_len)
    flops_weight = losses.flops_weight_at(steps_done, cfg.flops_weight, cfg.flops_warmup)
    sparse = "sparse" in layout
    if "colbert" in layout or (sparse and enc.sparse.weights == "lexical"):  # BGE-M3's objective
        loss_fn = functools.partial(
            losses.m3_loss, loss=loss_fn, group_size=g, temperature=cfg.temperature, normalize=enc.config.normalize,
            query_terms=terms, weights=parse_floats(cfg.ensemble_weights, 3, "--ensemble-weights"),
            lambdas=parse_floats(cfg.head_loss_weights, 3, "--head-loss-weights"), self_distill=cfg.self_distill,
            flops_weight=flops_weight if sparse and enc.sparse.weights == "splade" else 0.0, mask=mask)
    elif sparse:
        loss_fn = functools.partial(losses.sparse_loss, loss=loss_fn, group_size=g, query_terms=terms, mask=mask,
                                    flops_weight=flops_weight)
    if teacher_vectors is not None:  # outermost: it reads the projected (or dense) part beside the rest's
        tq, tp, unit = teacher_vectors
        loss_fn = functools.partial(losses.embed_distill_loss, loss=loss_fn, teacher_q=tq, teacher_p=tp,
                                    weight=cfg.embed_distill_weight, kind=cfg.embed_distill_loss, normalize=unit)
    return loss_fn
