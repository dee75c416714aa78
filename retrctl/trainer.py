"""Kept for compatibility: the training loop and its settings moved to ``retrctl.train`` (issue 13)."""

from retrctl.train.checkpoint import MODEL_DIRS, MODEL_FILES, check_output, foreign_files  # noqa: F401
from retrctl.train.config import RESUME_MAY_CHANGE, TrainConfig, resume_conflicts  # noqa: F401
from retrctl.train.loop import Position, Trainer, build_encoder, lora_b_norm, prepare, teacher_scores  # noqa: F401
