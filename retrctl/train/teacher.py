"""Online teachers: a frozen model (or a callable) whose outputs the student learns during training.

A teacher is a callable ``(query, passages) -> scores`` or an ``Encoder``. An Encoder teacher (``--teacher``:
a model dir or a shipped name, loaded frozen for inference) gives the scores of each example's passages for its
query (its own similarity of its query and passage vectors), distilled by ``--distill-weight``, and its vectors
of the texts themselves, distilled by ``--embed-distill-weight``. It encodes the raw texts with its own tokenizer,
prompts and lengths, so its tokenizer need not be the student's. The teacher is frozen, so each text's vector is
computed once and kept (``TeacherVectors``).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from retrctl import memory, records
from retrctl.errors import UsageError
from retrctl.hashing import weights_fingerprint
from retrctl.models import Encoder, backbone
from retrctl.models.layout import token_block
from retrctl.models.loading import resolve
from retrctl.train import losses
from retrctl.train.data import Example

Teacher = Callable[[str, Sequence[str]], Sequence[float]]
log = logging.getLogger("retrctl.train")


def check_teacher(name: str, output) -> None:
    """Refuse a teacher that is, is inside or contains the output dir (or its ``.partial``), before anything is
    read or written (exit 2 naming both)."""
    out = Path(output)
    for o in (out, out.with_name(out.name + ".partial")):
        if os.path.lexists(name):
            records.check_outputs([o], [name], dir_output=True)


def load_teacher(name: str, device: str) -> Encoder:
    """The teacher ``name`` names (a model dir, GGUF file or shipped name), frozen for inference; a name that does
    not load exits 2 naming it."""
    try:
        teacher = Encoder.load(name, device=device, inference=True)
    except UsageError:
        raise
    except Exception as e:  # whatever the loaders raise for a dir that is no model: one line naming it
        raise records.RecordError(name, message=f"--teacher: not a model retrctl can load ({type(e).__name__}: {e})") from None
    teacher.requires_grad_(False)
    teacher.eval()
    return teacher


def forward_bytes(teacher: Encoder, texts: int, every_state: bool = False) -> int:
    """Working memory of the teacher's no-grad forward over ``texts`` texts at its longest length; with
    ``every_state`` the hidden states of every block it keeps too (layer-wise distillation's targets)."""
    cfg = teacher.model.config
    width = memory.within_positions(cfg, max(teacher.config.query_max_len, teacher.config.passage_max_len))
    size = next(teacher.model.parameters()).element_size()
    states = (cfg.num_hidden_layers + 1) * width * cfg.hidden_size * size if every_state else 0
    return texts * (memory.inference_per_text(cfg, width, size) + states)


def block_map(student: Encoder, teacher: Encoder, name: str) -> list[int]:
    """The teacher's block each of the student's blocks was cut from: the blocks ``prune`` kept (the student's
    prune.json, made from this teacher's weights), or each block itself for a student as deep without one."""
    depth, of_teacher = student.model.config.num_hidden_layers, teacher.model.config.num_hidden_layers
    report = resolve(student.source) / "prune.json"
    if not report.is_file():
        if depth != of_teacher:
            raise UsageError(f"--layer-distill-weight: the student {student.source} has {depth} blocks and the teacher "
                             f"{name} {of_teacher}, and no prune.json says which of the teacher's it kept")
        return list(range(depth))
    saved = json.loads(report.read_text())
    if saved.get("source_fingerprint") != weights_fingerprint(resolve(teacher.source)):
        raise UsageError(f"--layer-distill-weight: the student {student.source} was cut from another model than "
                         f"the teacher {name} (its prune.json's source_fingerprint)")
    mask = (saved.get("masks") or {}).get("block") or []
    kept = [i for i, on in enumerate(mask) if on]
    if len(mask) != of_teacher or len(kept) != depth:
        raise records.RecordError(report, field="masks", message=f"keeps {len(kept)} of {len(mask)} blocks; the "
                                  f"student has {depth} and the teacher {of_teacher}")
    return kept


class TeacherVectors:
    """The teacher's vector of each text it has seen, per side, computed once (the teacher is frozen)."""

    def __init__(self, teacher: Encoder, batch_size: int = 32):
        self.teacher, self.batch_size = teacher, batch_size
        self.cache: dict[str, dict[str, np.ndarray]] = {"query": {}, "passage": {}}

    def read_as(self, student: Encoder) -> None:
        """Cap the teacher's lengths at the student's: the teacher's vector of a text is then of what the student
        reads of it (the prefix a cap keeps), a target the student can reach."""
        for key in ("query_max_len", "passage_max_len"):
            setattr(self.teacher.config, key, min(getattr(self.teacher.config, key), getattr(student.config, key)))

    @property
    def unit(self) -> bool:
        """Whether the teacher's vectors are normalized (the student's are then compared normalized)."""
        return bool(self.teacher.config.normalize)

    @property
    def dim(self) -> int:
        return self.teacher.dim

    def __call__(self, texts: list[str], kind: str) -> torch.Tensor:
        """[len(texts), teacher dim] float32, in order; texts not seen before encoded in one pass."""
        seen = self.cache[kind]
        new = list(dict.fromkeys(t for t in texts if t not in seen))
        if new:
            for text, vec in zip(new, self.teacher.encode(new, kind=kind, batch_size=self.batch_size), strict=True):
                seen[text] = vec
        if not texts:
            return torch.zeros((0, self.dim))
        return torch.from_numpy(np.stack([seen[t] for t in texts]))


def teacher_scores(teacher: Teacher | Encoder, examples: list[Example], vectors: TeacherVectors | None = None) -> torch.Tensor:
    """[len(examples), group size] scores of each example's passages for its query, from an online teacher: a
    callable ``(query, passages) -> scores`` or an Encoder (its own similarity of query and passage vectors, read
    from ``vectors`` when given, so a text is encoded once)."""
    if isinstance(teacher, Encoder):
        vectors = vectors or TeacherVectors(teacher)
        q = vectors([e.query for e in examples], "query")
        p = vectors([t for e in examples for t in e.passages], "passage")
        g = len(examples[0].passages) if examples else 0
        with torch.inference_mode():
            return torch.stack([teacher.similarity(q[i : i + 1], p[i * g : (i + 1) * g])[0]
                                for i in range(len(examples))]).float()
    return torch.tensor([[float(x) for x in teacher(e.query, e.passages)] for e in examples], dtype=torch.float32)


def calibrated_temperature(student: Encoder, batches: Iterable[list[Example]], temperature: float, fallback: float,
                           teacher: Teacher | Encoder | None = None, vectors: TeacherVectors | None = None,
                           trained: int | None = None, groups: int = 64) -> float:
    """The teacher temperature that puts the teacher's scores on the untrained student's scale: ``temperature`` (the
    student's) × the teacher's mean positive-minus-negative margin ÷ the student's (its similarity of the same texts,
    as the loss computes it), over ``groups`` groups spread evenly over the first ``trained`` of ``batches`` (those the
    run trains on; the groups with teacher scores, or all of them, scored by an online ``teacher``). MarginMSE and KL
    read the teacher's margins as they are: on min-max fused scores (margins near 0.6) against cosines (near 0.2)
    every margin is pushed apart, whatever the teacher ranks. ``fallback`` when either mean margin is not positive."""
    pool = [e for e in itertools.islice((e for batch in batches for e in batch), trained)
            if teacher is not None or e.teacher is not None]
    examples = pool[:: max(1, len(pool) // groups)][:groups]
    if not examples:
        return fallback
    scores = (teacher_scores(teacher, examples, vectors) if teacher is not None
              else torch.tensor([e.teacher for e in examples], dtype=torch.float32))
    was = student.training
    student.eval()
    q = torch.from_numpy(student.encode([e.query for e in examples], kind="query"))
    p = torch.from_numpy(student.encode([t for e in examples for t in e.passages], kind="passage"))
    student.train(was)
    n = len(examples)
    s = losses.scores(q, p, normalize=student.config.normalize).view(n, n, -1)[torch.arange(n), torch.arange(n)]
    student_margin = float((s[:, :1] - s[:, 1:]).mean())
    teacher_margin = float((scores[:, :1] - scores[:, 1:]).mean())
    if student_margin <= 0 or teacher_margin <= 0:
        log.warning("--calibrate-teacher: mean margins teacher %.4g, student %.4g over %d groups: the teacher "
                    "temperature stays %g", teacher_margin, student_margin, len(examples), fallback)
        return fallback
    calibrated = temperature * teacher_margin / student_margin
    log.info("--calibrate-teacher: mean margins teacher %.4g, student %.4g over %d groups: teacher temperature %.4g",
             teacher_margin, student_margin, len(examples), calibrated)
    return calibrated


class TeacherTokens:
    """The teacher's hidden states of each token the student reads (the student's tokenizer, prompt and cap), as
    ``models.layout.token_block`` lays them out, and its vector of each text from the same forward: token-level and
    layer-wise distillation's targets. ``tokens``: its final states; ``layers``: its states after the blocks the
    student's blocks but the last were cut from (``block_map``). Computed per step in chunks (a corpus's token states
    are far larger than its vectors, so they are not cached). The teacher must read the student's tokens as its own
    and be as wide: a model pruned from it does."""

    def __init__(self, teacher: Encoder, student: Encoder, name: str, chunk_size: int = 32, *, tokens: bool = True,
                 layers: bool = False):
        flag = "--token-distill-weight" if tokens else "--layer-distill-weight"
        if teacher.tokenizer.get_vocab() != student.tokenizer.get_vocab():
            raise UsageError(f"{flag}: the teacher {name} and the student {student.source} have "
                             "different tokenizers; token-level distillation needs the same tokens on both sides")
        if teacher.model.config.hidden_size != student.model.config.hidden_size:
            raise UsageError(f"{flag}: the teacher {name} is {teacher.model.config.hidden_size} wide and "
                             f"the student {student.source} {student.model.config.hidden_size}; token-level distillation "
                             "needs the same width")
        self.teacher, self.student, self.chunk_size, self.tokens = teacher, student, chunk_size, tokens
        # the teacher's hidden_states index of each student block but the last (index 0 is the embeddings)
        self.layers = [b + 1 for b in block_map(student, teacher, name)[:-1]] if layers else []
        if layers and not self.layers:
            raise UsageError(f"--layer-distill-weight: the student {student.source} has one block; no state lies "
                             "between its blocks")
        self.cuts = backbone.Tokenizer(student.tokenizer)  # its own cut counters: the student's count what it reads

    def __call__(self, texts: list[str], kind: str) -> dict[str, torch.Tensor]:
        """{"vectors": [len(texts), teacher dim], "tokens": [len(texts), cap × hidden] (with ``tokens``),
        "layers": [len(texts), cap × layers × hidden] (with ``layers``)}, float32, in order."""
        side, head = self.student.sides[kind], self.teacher.sides[kind].head
        hidden_size = self.teacher.model.config.hidden_size
        out = {"vectors": [], **({"tokens": []} if self.tokens else {}), **({"layers": []} if self.layers else {})}
        with torch.inference_mode():
            for start in range(0, len(texts), self.chunk_size):
                batch = self.student.tokenize(texts[start : start + self.chunk_size], kind, counter=self.cuts)
                batch = {k: v.to(self.teacher.device) for k, v in batch.items()}
                mask = batch["attention_mask"]
                if self.layers:
                    states = backbone.every_hidden_state(self.teacher.model, batch)
                    hidden = states[-1]
                    out["layers"].append(token_block(torch.cat([states[i] for i in self.layers], -1), mask,
                                                     side.max_len).float().cpu())
                else:
                    hidden = backbone.hidden_states(self.teacher.model, batch)
                if self.tokens:
                    out["tokens"].append(token_block(hidden, mask, side.max_len).float().cpu())
                out["vectors"].append(head.finish(head(hidden, mask, batch["input_ids"])).float().cpu())
        widths = {"vectors": self.teacher.dim, "tokens": side.max_len * hidden_size,
                  "layers": side.max_len * len(self.layers) * hidden_size}
        return {k: torch.cat(v) if v else torch.zeros((0, widths[k])) for k, v in out.items()}
