"""Distillation from a corpus alone: a student learns a frozen teacher's vectors of the corpus's texts, no labels.

``train --corpus C --model small/ --teacher BIG -o healed/`` with no groups (the heal step after ``prune``): the
texts are each doc's passage (title + text, the passage side) and one sentence crop of it (the query side; the
crops ``retrctl crop`` cuts, from retrctl/crops.py, seeded by ``--seed``; a doc with no sentence of 4 words gives
its first 32 words; with ``--fresh-crops`` another sentence of the doc on each pass, as Contriever draws its crops
anew each time it reads a doc). Each step is one embedding-distillation step over a batch of docs: the student's
vectors of the batch's crops and passages regress onto the teacher's (``losses.embed_distill_loss``; a learned
projection when the widths differ, dropped at save), as sentence-transformers' model-distillation example trains
a student with fewer layers on MSE to the teacher's embeddings.

With ``--token-distill-weight`` the student's final hidden state of each token also regresses onto the teacher's of
the same token (``losses.token_distill``, TinyBERT's hidden-state loss on the last layer): every token of every
text is a target, where the vector is one per text. With ``--layer-distill-weight`` its state after each of its
other blocks does too, onto the teacher's after the block it was cut from (``losses.layer_distill``, TinyBERT's
intermediate layers through ``prune``'s map of kept blocks). The teacher then reads the student's tokens, so it must
share its tokenizer and width (a model pruned from it does).

The teacher is frozen, so its vectors are computed once, up front, in chunks saved under ``OUTPUT.partial/teacher``
(a resume reuses every finished chunk; a fresh run starts over), those of fresh crops by each step that reads them; with
token or layer distillation its hidden states (too large to keep) and its vectors come from one forward of each
step's texts instead. The training loop is ``Trainer``'s own (checkpoints, resume, memory plan, GradCache, the saved
model and its checks).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import shutil
from collections.abc import Callable, Iterator

import numpy as np
import torch

from retrctl import records
from retrctl.crops import crop
from retrctl.errors import UsageError
from retrctl.hashing import json_lines_hex
from retrctl.models import Encoder
from retrctl.train import losses
from retrctl.train.loop import Trainer
from retrctl.train.teacher import TeacherTokens

log = logging.getLogger("retrctl.train")

FALLBACK_WORDS = 32  # the query side of a doc with no sentence crop: its first words
TEACHER_CHUNK = 1024  # texts per saved chunk of the teacher's vectors


@dataclasses.dataclass
class TextPair:
    """One doc's texts: a sentence crop (query side) and the passage, ``index`` its row in the teacher's vectors;
    ``crops``, with fresh crops, the query side of each pass in turn (``query`` the first)."""

    index: int
    query: str
    passage: str
    crops: tuple[str, ...] = ()
    padded: int = 0  # the loop's counters of resampled and drawn negatives: none here
    drawn: int = 0

    @property
    def passages(self) -> list[str]:
        return [self.passage]

    def cost(self) -> int:
        return len(self.query) + len(self.passage)

    def on_pass(self, epoch: int) -> TextPair:
        """The pair as pass ``epoch`` reads it: with fresh crops, that pass's crop, cycling through the doc's."""
        return dataclasses.replace(self, query=self.crops[epoch % len(self.crops)]) if self.crops else self


def corpus_texts(corpus: dict[str, dict], seed: int, passes: int = 0) -> list[TextPair]:
    """Each doc with text as a (crop, passage) pair, in corpus order; the crops as ``retrctl crop --seed`` cuts them.
    ``passes`` > 0: fresh crops, up to that many distinct sentences of each doc (``crop --per-doc``), one per pass."""
    docs = [(docid, d) for docid, d in corpus.items() if records.passage_text(d).strip()]
    crops: dict[str, list[str]] = {}
    for c in crop(({"docid": docid, "text": d.get("text") or ""} for docid, d in docs), per_doc=max(passes, 1), seed=seed):
        crops.setdefault(c["source_docid"], []).append(c["query_text"])
    pairs = []
    for i, (docid, d) in enumerate(docs):
        passage = records.passage_text(d)
        queries = crops.get(docid) or [" ".join(passage.split()[:FALLBACK_WORDS])]
        pairs.append(TextPair(i, queries[0], passage, tuple(queries) if passes else ()))
    return pairs


class TextBatches:
    """Global batches of TextPairs for one epoch, deterministic in (seed, epoch): shuffled, then (with
    ``group_by_length``) sorted by length within windows of 16 batches whose order is shuffled again."""

    def __init__(self, pairs: list[TextPair], *, global_batch: int, seed: int, group_by_length: bool = True):
        self.pairs, self.global_batch, self.seed, self.group_by_length = pairs, global_batch, seed, group_by_length

    def per_epoch(self) -> int:
        return -(-len(self.pairs) // self.global_batch)

    def epoch(self, epoch: int) -> Iterator[list[TextPair]]:
        rng = np.random.default_rng([self.seed, epoch])
        order = [self.pairs[i].on_pass(epoch) for i in rng.permutation(len(self.pairs))]
        window = self.global_batch * 16
        for start in range(0, len(order), window):
            buf = order[start : start + window]
            if self.group_by_length:
                buf = sorted(buf, key=lambda e: -e.cost())
            batches = [buf[i : i + self.global_batch] for i in range(0, len(buf), self.global_batch)]
            if self.group_by_length:
                batches = [batches[i] for i in rng.permutation(len(batches))]
            yield from batches


class CorpusDistiller(Trainer):
    """``Trainer`` on a corpus alone: embedding distillation from ``cfg.teacher`` (see the module docstring)."""

    GROUPS = False

    @classmethod
    def check(cls, cfg, output, *, encoder=None, teacher=None) -> None:
        """What a corpus alone needs (a teacher model, embedding distillation), then ``Trainer``'s checks."""
        if not cfg.teacher and teacher is None:
            raise UsageError("a corpus alone is training data only with a teacher to distil (--teacher); else give groups")
        if teacher is not None and not isinstance(teacher, Encoder):
            raise UsageError("distillation from a corpus alone needs a teacher model (its vectors), not a scoring function")
        if cfg.embed_distill_weight is not None and cfg.embed_distill_weight <= 0:
            raise UsageError("--embed-distill-weight: a corpus alone trains on embedding distillation only; it must be "
                             "above 0", flag="--embed-distill-weight")
        super().check(cfg, output, encoder=encoder, teacher=teacher)

    def _build_encoder(self, encoder) -> None:
        """``Trainer``'s encoder, and what reads the teacher's token states for it (``TeacherTokens``)."""
        super()._build_encoder(encoder)
        # token-level and layer-wise distillation: the teacher's states of each token beside its vector of each text
        cfg = self.cfg
        self.hidden = {name: w for name, w in (("tokens", cfg.token_distill_weight), ("layers", cfg.layer_distill_weight)) if w}
        self.tokens = (TeacherTokens(self.vectors.teacher, self.enc, cfg.teacher or "(given)", cfg.chunk_size,
                                     tokens="tokens" in self.hidden, layers="layers" in self.hidden)
                       if self.hidden else None)

    def _read_data(self, groups, corpus) -> int:
        cfg, world = self.cfg, self.dist.world
        if not corpus:
            raise UsageError("distillation without groups trains on a corpus: give --corpus")
        self.source = None
        self.pairs = corpus_texts(corpus, cfg.seed, cfg.epochs if cfg.fresh_crops else 0)
        if not self.pairs:
            raise UsageError("the corpus has no passage with text to distil on")
        self.n_groups, self.group_size = len(self.pairs), 1
        self.fingerprint = json_lines_hex([p.query, p.passage, *p.crops] for p in self.pairs)
        self.batches = TextBatches(self.pairs, global_batch=cfg.batch_size * world, seed=cfg.seed,
                                   group_by_length=cfg.group_by_length)
        if world > 1 and len(self.pairs) % (cfg.batch_size * world):
            raise UsageError(f"with {world} processes the corpus's {len(self.pairs)} docs must fill whole global batches "
                             f"of {cfg.batch_size * world}; use one process or another --train-batch-size")
        per_epoch = self.batches.per_epoch()
        log.info("%d docs (%s and the passage of each), %d steps of %d docs, distilled from %s", len(self.pairs),
                 "a sentence crop per pass" if cfg.fresh_crops else "a sentence crop",
                 cfg.max_steps or per_epoch * cfg.epochs, cfg.batch_size * world, cfg.teacher or "a teacher")
        return per_epoch

    @property
    def data_hash(self) -> str:
        return "corpus+" + self.fingerprint

    def objective(self, batch: list[TextPair]) -> tuple[list[str], list[str], Callable, torch.Tensor]:
        b = len(batch) // self.dist.world
        local = batch[self.dist.rank * b : (self.dist.rank + 1) * b]
        rows = torch.tensor([e.index for e in local])
        queries, passages = [e.query for e in local], [e.passage for e in local]
        if self.tokens is None:  # a fresh crop is read once a pass: its teacher vector is encoded here, not kept
            q = (torch.from_numpy(self.vectors.teacher.encode(queries, kind="query", batch_size=self.cfg.chunk_size))
                 if self.cfg.fresh_crops else self.targets["query"][rows])
            vectors = q, self.targets["passage"][rows]
        else:  # the teacher's hidden states and vectors from one forward of this step's texts
            blocks_q, blocks_p = self.tokens(queries, "query"), self.tokens(passages, "passage")
            vectors = blocks_q["vectors"], blocks_p["vectors"]
        loss_fn = functools.partial(
            losses.embed_distill_loss, teacher_q=vectors[0], teacher_p=vectors[1],
            weight=self.cfg.embed_distill_weight, kind=self.cfg.embed_distill_loss, normalize=self.vectors.unit)
        if self.tokens is not None:
            loss_fn = functools.partial(losses.hidden_distill_loss, loss=loss_fn, teacher_q=blocks_q, teacher_p=blocks_p,
                                        weights=self.hidden)
        return queries, passages, loss_fn, torch.zeros(0, dtype=torch.bool)

    def _loop(self, pos) -> None:
        if self.tokens is None:  # else the step's forward of the teacher gives its vectors too
            kinds = ("passage",) if self.cfg.fresh_crops else ("query", "passage")
            self.targets = {kind: self._teacher_vectors(kind) for kind in kinds}
        super()._loop(pos)

    def _export(self) -> None:
        shutil.rmtree(self.partial / "teacher", ignore_errors=True)  # a cache for resumes, not part of the model
        super()._export()

    def _teacher_vectors(self, kind: str) -> torch.Tensor:
        """The teacher's vectors of every pair's ``kind`` text, [docs, teacher dim]: chunks finished by an earlier
        (interrupted) run of the same teacher and texts are read from ``OUTPUT.partial/teacher``, the rest
        computed and saved (by process 0)."""
        root = self.partial / "teacher"
        key = {"teacher": self.cfg.teacher, "data": self.data_hash, "kind": kind, "chunk": TEACHER_CHUNK}
        texts = [e.query if kind == "query" else e.passage for e in self.pairs]
        out = []
        for n, start in enumerate(range(0, len(texts), TEACHER_CHUNK)):
            path = root / f"{kind}-{n:05d}.npy"
            meta = path.with_suffix(".json")
            if path.is_file() and meta.is_file() and json.loads(meta.read_text()) == key:
                out.append(np.load(path))
                continue
            vecs = self.vectors.teacher.encode(texts[start : start + TEACHER_CHUNK], kind=kind, batch_size=self.cfg.chunk_size)
            if self.dist.rank == 0:
                root.mkdir(parents=True, exist_ok=True)
                with records.atomic_path(path, suffix=".npy") as tmp:
                    np.save(tmp, vecs)
                meta.write_text(json.dumps(key) + "\n")
            out.append(vecs)
            log.info("teacher vectors: %s %d/%d", kind, min(start + TEACHER_CHUNK, len(texts)), len(texts))
        return torch.from_numpy(np.concatenate(out))
