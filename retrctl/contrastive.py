"""Kept for compatibility: the contrastive losses moved to ``retrctl.train.losses`` (issue 13)."""

from retrctl.train.losses import (  # noqa: F401
    RngState,
    chunks,
    distill_kl,
    false_negative_mask,
    gather,
    grad_cache_step,
    group_loss,
    info_nce,
    scores,
    sorted_chunks,
    world,
)
