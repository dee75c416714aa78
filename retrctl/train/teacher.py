"""Online teachers: scores of each training example's passages for its query, computed during training.

A teacher is a callable ``(query, passages) -> scores`` or an ``Encoder`` scored with its own similarity of query
and passage vectors; the trainer distils these scores (``--distill-weight``) instead of those stored in the groups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from retrctl.models import Encoder
from retrctl.train.data import Example

Teacher = Callable[[str, Sequence[str]], Sequence[float]]


def teacher_scores(teacher: Teacher | Encoder, examples: list[Example]) -> torch.Tensor:
    """[len(examples), group size] scores of each example's passages for its query, from an online teacher: a
    callable ``(query, passages) -> scores`` or an Encoder (its own similarity of query and passage vectors)."""
    if isinstance(teacher, Encoder):
        with torch.inference_mode():
            rows = []
            for e in examples:
                q = torch.from_numpy(teacher.encode([e.query], kind="query"))
                p = torch.from_numpy(teacher.encode(e.passages, kind="passage"))
                rows.append(teacher.similarity(q, p)[0])
            return torch.stack(rows).float()
    return torch.tensor([[float(x) for x in teacher(e.query, e.passages)] for e in examples], dtype=torch.float32)
