"""Kept for compatibility: training groups and batches moved to ``retrctl.train.data`` (issue 13)."""

from retrctl.train.data import Batches, Example, GroupSource  # noqa: F401
