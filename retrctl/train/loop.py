"""The contrastive training loop shared by stages that fine-tune an encoder (train; prune's healing).

Two steps, as a Tevatron driver runs them. ``Trainer.build`` does everything before step 1: checks the settings and
the output, reads and validates the groups, loads the teacher, builds the encoder (LoRA, gradient checkpointing)
or takes one already built, plans memory and picks an engine (``engines.py``: plain torch for one process,
DeepSpeed ZeRO 0-3 otherwise). ``fit`` runs the steps (the objective from ``objective.py``, optionally through
GradCache), writes metrics.jsonl and checkpoints, and saves a model that stock loaders read. Both engines give the
same losses for the same global batch (tested: 2 processes × B under ZeRO-2 = 1 process × 2B). Checkpoints
(``<output>.partial/checkpoints/step-N``) hold the engine state (model, optimizer, scheduler), each process's RNG
state and the input position; ``resume`` continues from the newest.

The module trained is the ``Encoder`` itself: each step runs ``Encoder.forward(..., layout=...)`` (backbone →
heads, the pass ``encode`` runs), so training and inference cannot drift; the run's ``TrainingLayout``
(models/layout.py) names the heads it trains and where each sits in the one tensor a step passes around.
Distillation takes teacher scores from the groups (``positive_scores``/``negative_scores``) or from an online
``teacher``: a callable ``(query, passages) -> scores`` or an ``Encoder`` scored with its own similarity.

Nothing lost, nothing executed: ``checkpoint.check_output`` runs before any model is loaded. A resume
checks that the data (``GroupSource.fingerprint``) and every setting outside ``RESUME_MAY_CHANGE`` equal the
checkpoint's, so a run never records one setting and runs another. Checkpoints load with ``weights_only=True``
(``checkpoint.load_tensors``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from retrctl import memory, records
from retrctl.errors import UsageError
from retrctl.models import Encoder, lookup
from retrctl.train import losses, objective
from retrctl.train.checkpoint import (
    Position,
    check_output,
    checkpoints,
    clear_partial,
    legacy_keys,
    load_tensors,
    read_state,
    resume_point,
    rng_state,
    set_rng_state,
)
from retrctl.train.config import TrainConfig
from retrctl.train.data import Batches, Example, GroupSource
from retrctl.train.engines import DeepSpeedEngine, PlainEngine, import_deepspeed, lora_b_norm, setup_processes
from retrctl.train.model import build_encoder, prepare
from retrctl.train.teacher import (
    Teacher,
    TeacherVectors,
    calibrated_temperature,
    check_teacher,
    forward_bytes,
    load_teacher,
    teacher_scores,
)

log = logging.getLogger("retrctl.train")



# ---------------------------------------------------------------- the loop


class Trainer:
    """Train an encoder on groups and save it to ``output``, in two steps as a Tevatron driver does: ``build`` (a
    classmethod: everything before step 1) returns a trainer ready to ``fit`` (the steps, checkpoints and the saved
    model). Constructing one reads, loads and checks nothing.

    ``build`` checks the settings and the output first (``TrainConfig.check``, ``check_output``: exit 2 before
    anything is read or loaded); ``corpus`` is then read when it is a path (a dict of docs is used as it is).

    ``encoder``: an Encoder to train instead of loading ``cfg.model`` (e.g. a pruned one); ``cfg``'s encoder
    settings still apply to it, and a CPU copy is kept to export the trained weights into (``cfg.model`` may be
    None then). ``teacher``: scores each example's passages for its query on the fly for the distillation term
    (``cfg.distill_weight``), instead of the scores stored in the groups: a callable ``(query, passages) ->
    scores`` or an Encoder. Neither is part of what a resume can check (the data and ``cfg`` are): resume with the
    same ones. ``cfg.teacher`` names a model loaded as the teacher (a resume compares the name); an Encoder
    teacher's vectors of each text are computed once (``TeacherVectors``) and, with ``cfg.embed_distill_weight``,
    the student's vectors regress onto them (through a learned projection when the widths differ).

    For a stage that trains extra parameters inside the encoder (prune's self-slimming gates): ``penalty``, a
    term of the parameters alone added to every step's loss (reported as ``penalty``); ``finish``, applied to the
    trained encoder before it is saved (folding the extras into stock weights); a parameter carrying an ``lr``
    attribute gets that learning rate (same schedule). ``after_export(dir)`` edits the saved model before publishing.
    """

    GROUPS = True  # the data are groups (train/distill.py's subclass trains on a corpus alone)
    ENCODES_PASSAGES = True  # a step encodes its passages (train/query_side.py's subclass reads them from an index)

    def __init__(self, cfg: TrainConfig, output, *, on_step: Callable[[int, dict], None] | None = None,
                 penalty: Callable[[], torch.Tensor] | None = None, finish: Callable[[Encoder], None] | None = None,
                 after_export: Callable[[Path], None] | None = None):
        self.cfg, self.output, self.on_step = cfg, Path(output), on_step
        self.penalty, self.finish, self.after_export = penalty, finish, after_export
        self.steps_done = 0
        self.padded = self.drawn = 0  # negatives resampled / drawn from the corpus, over the batches trained
        self.partial = self.output.with_name(self.output.name + ".partial")
        self.ckpt_root = self.partial / "checkpoints"

    @classmethod
    def build(cls, cfg: TrainConfig, groups, corpus: dict | str | Path | None, output, *,
              encoder: Encoder | None = None, teacher: Teacher | Encoder | None = None, **hooks) -> Trainer:
        """A trainer ready to ``fit``, cheapest step first: the settings and the output checked, the corpus and the
        data read, the resume point checked, then the teacher loaded, the encoder built, the memory planned and the
        engine built. ``hooks``: ``on_step``, ``penalty``, ``finish``, ``after_export`` (the class docstring)."""
        cls.check(cfg, output, encoder=encoder, teacher=teacher)
        if isinstance(corpus, (str, Path)):  # read once the settings and the output are known to be usable
            corpus = records.read_corpus(corpus)
        run = cls(cfg, output, **hooks)
        run.dist = setup_processes(cfg)
        per_epoch = run._read_data(groups, corpus)
        run.resume_from = (resume_point(run.ckpt_root, cfg, world=run.dist.world, data_hash=run.data_hash, groups=cls.GROUPS)
                           if cfg.resume else None)  # checked before any model is loaded
        run.total = cfg.max_steps or per_epoch * cfg.epochs
        run.warmup = cfg.warmup_steps if cfg.warmup_steps is not None else int(cfg.warmup_ratio * run.total)
        run.teacher = teacher
        if cfg.teacher and teacher is None:  # after every cheaper check: loading a model takes a while
            run.teacher = load_teacher(cfg.teacher, run.dist.device)
        run.vectors = TeacherVectors(run.teacher, cfg.chunk_size) if isinstance(run.teacher, Encoder) else None
        run._build_encoder(encoder)
        run.probe = run._probe_texts()
        run.before = run._embed(run.enc, run.probe) if run.dist.rank == 0 else None
        run.teacher_temperature = cfg.teacher_temperature
        if cfg.calibrate_teacher:  # the same groups and untrained weights in every process, and on a resume
            run.teacher_temperature = calibrated_temperature(run.enc, run.batches.epoch(0), cfg.temperature, cfg.teacher_temperature,
                                                             run.teacher, run.vectors, run.total * run.batches.global_batch)
        run.plan = run._plan_memory()  # before any optimizer state: on CPU an OOM is a kill, not an error
        cfg.plan = run.plan.record()
        if run.dist.deepspeed:
            run.engine = DeepSpeedEngine(run.enc, cfg, run.total, run.warmup, run.dist.world)
        else:
            run.engine = PlainEngine(run.enc, cfg, run.total, run.warmup)
        torch.manual_seed(cfg.seed + 1 + run.dist.rank)  # dropout differs per process
        return run

    # -- building

    @classmethod
    def check(cls, cfg: TrainConfig, output, *, encoder: Encoder | None = None, teacher=None) -> None:
        """The settings (``cfg``'s defaults settled) and the output, refused (exit 2) before anything is read."""
        cfg.settle(teacher=bool(cfg.teacher) or teacher is not None, groups=cls.GROUPS)
        cfg.check(needs_model=encoder is None)
        if cfg.embed_distill_weight and not (cfg.teacher or isinstance(teacher, Encoder)):
            raise UsageError("--embed-distill-weight needs a teacher model (--teacher)")
        corpus_only = (("--token-distill-weight", cfg.token_distill_weight), ("--layer-distill-weight", cfg.layer_distill_weight),
                       ("--fresh-crops", cfg.fresh_crops))
        for flag, value in corpus_only:
            if value and cls.GROUPS:
                raise UsageError(f"{flag} trains from a corpus alone: give --corpus and no GROUPS", flag=flag)
        if cfg.teacher:
            check_teacher(cfg.teacher, output)
        check_output(output, cfg)

    def _build_encoder(self, encoder: Encoder | None) -> None:
        """The encoder to train, ``cfg.model`` loaded or ``encoder`` prepared, and its layout."""
        cfg = self.cfg
        teacher_dim = self.vectors.dim if self.vectors is not None and cfg.embed_distill_weight else None
        self.template = None  # what the trained weights are exported into, when the encoder was given
        if encoder is None:
            trained = build_encoder(cfg, self.dist.device, teacher_dim=teacher_dim)
        else:
            self.template = copy.deepcopy(encoder).to("cpu")  # before LoRA wraps it or ZeRO-3 partitions it
            torch.manual_seed(cfg.seed)  # LoRA init identical in every process
            trained = prepare(encoder.to(self.dist.device), cfg, teacher_dim=teacher_dim)
        self.enc, self.layout = trained.encoder, trained.layout  # the engines train the Encoder's own weights
        if self.vectors is not None and cfg.embed_distill_weight:  # the target of a text is of what the student reads
            self.vectors.read_as(self.enc)
        if "lookup" in self.layout:  # both query encoders in one forward (models/lookup.py)
            lookup.check_prefix(self.enc)
        legacy_keys(self.enc)  # resume checkpoints written before the Encoder was trained directly

    def _read_data(self, groups, corpus) -> int:
        """The groups validated (exit 2 on bad input) and batched; returns the global batches per epoch."""
        cfg, world = self.cfg, self.dist.world
        if world > 1 and groups == "-":
            raise UsageError("with several processes read groups from a file, not stdin (every process reads them)")
        self.source = GroupSource(groups, corpus)
        self.n_groups = self.source.validate()
        self.group_size = cfg.train_group_size
        self.batches = Batches(self.source, group_size=cfg.train_group_size, global_batch=cfg.batch_size * world,
                               seed=cfg.seed, drop_last=world > 1, group_by_length=cfg.group_by_length)
        per_epoch = self.batches.per_epoch(self.n_groups)
        if per_epoch == 0:
            raise records.RecordError(self.source.path, message=f"{self.n_groups} groups: fewer than one global batch of {cfg.batch_size * world}")
        log.info("%d groups, %d steps of %d groups (%d per process × %d), group size %d", self.n_groups,
                 cfg.max_steps or per_epoch * cfg.epochs, cfg.batch_size * world, cfg.batch_size, world, cfg.train_group_size)
        if cfg.max_steps and cfg.max_steps < per_epoch:  # groups stream in file order, shuffled within a window
            log.warning("--max-steps %d trains on the first %d of the %d groups, in file order (shuffled within windows "
                        "of %d): a file whose head is not a sample of the whole trains on its head only", cfg.max_steps,
                        cfg.max_steps * cfg.batch_size * world, self.n_groups,
                        self.batches.global_batch * self.batches.buffer_batches)
        return per_epoch

    def _probe_texts(self) -> list[str]:
        """A few texts whose embeddings must change in training and survive saving (FlagEmbedding#1547)."""
        batch = next(iter(self.batches.epoch(0)))
        return [t for e in batch[:4] for t in (e.query, e.passages[0]) if t]

    @staticmethod
    def _embed(enc: Encoder, texts: list[str]) -> np.ndarray:
        was = enc.training
        enc.eval()
        out = enc.encode(texts, kind="passage", batch_size=16)
        enc.train(was)
        return out

    def _tokenize(self, texts: list[str], kind: str, pad_to_max: bool) -> dict:
        width = None
        if pad_to_max:
            width = memory.within_positions(self.enc.model.config, self.enc.config.max_len(kind))
        batch = self.enc.tokenize(texts, kind, width)
        return {k: v.to(self.dist.device) for k, v in batch.items()}

    def _plan_memory(self) -> memory.Plan:
        """Plain steps or GradCache (and its chunk) from what one text at the max length keeps for backward
        (measured), the gradients and AdamW state, and the memory free now (memory.py)."""
        cfg, enc, dev = self.cfg, self.enc, self.dist.device

        def forward(batch):
            with torch.autocast(torch.device(dev).type, dtype=torch.bfloat16, enabled=cfg.dtype == "bf16"):
                return enc(batch, raw=True, layout=self.layout)

        per: dict[str, int] = {}
        measured: dict[int, int] = {}
        for kind in ("query", "passage") if self.ENCODES_PASSAGES else ("query",):
            batch = memory.max_length_batch(enc, kind, 1, "cpu")
            width = batch["input_ids"].size(1)
            if width not in measured:
                measured[width] = memory.probe(forward, lambda n, k=kind: memory.max_length_batch(enc, k, n, dev), enc)
                if cfg.gradient_checkpointing:
                    measured[width] += memory.checkpoint_boundaries(enc.model.config, width)
            per[kind] = measured[width]
        trainable = sum(p.numel() for p in enc.parameters() if p.requires_grad)
        zero = cfg.ds_stage() if self.dist.deepspeed else None
        b, g = cfg.batch_size, self.group_size if self.ENCODES_PASSAGES else 0  # else the passages are stored vectors
        # the teacher's weights are loaded already (in what the process holds); its forward over one chunk is not
        teacher = (forward_bytes(self.vectors.teacher, cfg.chunk_size, every_state=bool(cfg.layer_distill_weight))
                   if self.vectors is not None else 0)
        cost = memory.StepCost(state=memory.optimizer_state(trainable, zero_stage=zero, world=self.dist.world),
                               per_query=per["query"], per_passage=per.get("passage", 0), queries=b, passages=b * g,
                               embeddings=memory.cached_outputs(self.layout, b, b * g, self.dist.world), teacher=teacher)
        budget = memory.agree(memory.available(dev, cfg.max_memory), dev)
        plan = memory.plan_step(cost, mode=cfg.grad_cache, chunk_size=cfg.chunk_size, budget=budget, batch_size=b, group_size=g)
        if self.dist.rank == 0:
            log.info("%s", plan.line())
        return plan

    # -- one step

    def objective(self, batch: list[Example]) -> tuple[list[str], list[str], Callable, torch.Tensor]:
        """This process's query texts, passage texts, ``loss_fn(outputs)`` over their training outputs (the
        ``StepOutputs`` of ``self.layout``), and the false-negative mask (reported)."""
        cfg, rank, g = self.cfg, self.dist.rank, self.cfg.train_group_size
        b = len(batch) // self.dist.world
        local = batch[rank * b : (rank + 1) * b]
        labels = [(rank * b + j) * g for j in range(b)]
        mask = losses.false_negative_mask([e.positive_keys for e in local], [k for e in batch for k in e.keys], labels)
        teacher = valid = vectors = None
        if cfg.distill_weight and self.teacher is not None:  # scored now, for every example
            teacher, valid = teacher_scores(self.teacher, local, self.vectors), torch.ones(len(local), dtype=torch.bool)
        elif cfg.distill_weight:
            valid = torch.tensor([e.teacher is not None for e in local])
            teacher = torch.tensor([e.teacher or [0.0] * g for e in local], dtype=torch.float32)
        if cfg.embed_distill_weight:
            vectors = (self.vectors([e.query for e in local], "query"),
                       self.vectors([p for e in local for p in e.passages], "passage"), self.vectors.unit)
        loss_fn = objective.step_loss(cfg, self.enc, self.layout, local, mask, teacher, valid, self.steps_done, vectors,
                                      teacher_temperature=self.teacher_temperature)
        return [e.query for e in local], [p for e in local for p in e.passages], loss_fn, mask

    def step(self, batch: list, first: bool) -> dict:
        cfg = self.cfg
        queries, passages, loss_fn, mask = self.objective(batch)
        qb = self._tokenize(queries, "query", first and cfg.first_step_max_len)
        pb = self._tokenize(passages, "passage", first and cfg.first_step_max_len)
        # forward in length-sorted chunks cut to their longest row: padding costs nothing (except at step 1)
        trim = not (first and cfg.first_step_max_len)
        qc, qinv = losses.sorted_chunks(qb, self.plan.chunk_size, trim)
        pc, pinv = losses.sorted_chunks(pb, self.plan.chunk_size, trim)
        embed_q = functools.partial(self.engine.forward, kind="query", layout=self.layout)
        embed_p = functools.partial(self.engine.forward, kind="passage", layout=self.layout)

        def unsorted_loss(q, p):  # the step's outputs back in input order, split into their parts once
            return loss_fn(self.layout.split(q[qinv.to(q.device)], p[pinv.to(p.device)]))

        extra = None
        if self.penalty is not None:  # parameters only: its gradient adds to the step's (first: the last backward ends it)
            extra = self.penalty()
            self.engine.backward(extra, False)
        if self.plan.grad_cache:
            loss, parts = losses.grad_cache_step(embed_q, qc, pc, unsorted_loss, self.engine.backward, encode_passage=embed_p)
        else:
            loss, parts = unsorted_loss(torch.cat([embed_q(c) for c in qc]), torch.cat([embed_p(c) for c in pc]))
            self.engine.backward(loss)
            loss = loss.detach()
        if extra is not None:
            loss, parts = loss + extra.detach(), {**parts, "penalty": extra.detach()}
        return self.finish_step(loss, parts, mask)

    def finish_step(self, loss: torch.Tensor, parts: dict, mask: torch.Tensor) -> dict:
        """The optimizer step after the backward, and the step's metrics (global under several processes)."""
        lr = self.engine.lr()
        self.engine.step()
        out = {"loss": loss, **parts}
        masked = torch.tensor(float(mask.sum()))
        if self.dist.world > 1:  # report global values, as one process with the whole batch would
            vals = torch.stack([*(v.float().cpu() for v in out.values()), masked]).to(self.dist.device)
            dist.all_reduce(vals)  # on the device: nccl reduces nothing else
            vals = vals.cpu()
            out, masked = dict(zip(out, vals[:-1] / self.dist.world, strict=True)), vals[-1]
        return {"lr": lr, **{k: float(v) for k, v in out.items()}, "masked": int(masked)}

    # -- checkpoints

    def save_checkpoint(self, pos: Position) -> None:
        d = self.ckpt_root / f"step-{pos.step}"
        tmp = d.with_name(d.name + ".tmp")
        if self.dist.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.dist.barrier()
        self.engine.save(tmp, self.dist.rank)
        torch.save(rng_state(), tmp / f"rng-{self.dist.rank}.pt")
        if self.dist.rank == 0:
            state = {**dataclasses.asdict(pos), "world_size": self.dist.world, "total_steps": self.total,
                     "padded_negatives": self.padded, "random_negatives": self.drawn, "data_hash": self.data_hash}
            (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2) + "\n")
            self.cfg.save(tmp / "train_config.json")
        self.dist.barrier()
        if self.dist.rank == 0:
            shutil.rmtree(d, ignore_errors=True)
            os.replace(tmp, d)
            for old in checkpoints(self.ckpt_root)[: -max(1, self.cfg.save_total_limit)]:
                shutil.rmtree(old, ignore_errors=True)
            log.info("checkpoint %s", d)
        self.dist.barrier()

    def load_checkpoint(self) -> Position:
        d = self.resume_from
        if d is None:
            log.warning("--resume: no checkpoint in %s; starting from step 0", self.ckpt_root)
            return Position()
        state = read_state(d / "trainer_state.json")
        self.engine.load(d)
        set_rng_state(load_tensors(d / f"rng-{self.dist.rank}.pt"))
        try:
            self.padded, self.drawn = state["padded_negatives"], state["random_negatives"]
            pos = Position(**{k: int(state[k]) for k in ("step", "epoch", "batch_in_epoch", "groups_consumed")})
        except (KeyError, TypeError, ValueError) as e:
            raise records.RecordError(d / "trainer_state.json", message=f"damaged checkpoint file (bad or missing {e})") from None
        log.info("resumed from %s (step %d, epoch %d, %d groups consumed)", d, pos.step, pos.epoch, pos.groups_consumed)
        return pos

    @functools.cached_property
    def data_hash(self) -> str:
        """What the run trains on: the groups and the docs they name, plus the whole corpus when negatives are drawn from it."""
        parts = [self.source.fingerprint]
        if self.source.without_negatives and self.cfg.train_group_size > 1:
            parts.append(self.source.corpus_fingerprint())
        return "+".join(parts)

    # -- the run

    def fit(self) -> Path:
        try:
            with records.atomic_dir(self.output) if self.dist.rank == 0 else contextlib.nullcontext(self.partial):
                if self.dist.rank == 0 and not self.cfg.resume:  # a fresh start; check_output saw only our files here
                    clear_partial(self.partial)
                self.dist.barrier()
                pos = self.load_checkpoint() if self.cfg.resume else Position()
                self._loop(pos)
                self._export()
                self.dist.barrier()
        finally:  # also on failure; DeepSpeed's own call also drops its group handles, so this process can train again
            if self.dist.deepspeed and dist.is_initialized():
                import_deepspeed().comm.destroy_process_group()
        return self.output

    def _metrics(self, pos: Position):
        path = self.partial / "metrics.jsonl"
        if self.dist.rank != 0:
            return contextlib.nullcontext(None)
        if path.exists():  # a kill after the checkpoint leaves later lines, the last maybe torn: drop them
            keep = []
            for ln in path.read_text().splitlines():
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    if json.loads(ln)["step"] <= pos.step:
                        keep.append(ln)
            with records.atomic_path(path) as tmp:  # replaced whole: a kill here must not lose earlier steps' lines
                Path(tmp).write_text("".join(ln + "\n" for ln in keep))
        return open(path, "a", encoding="utf-8")

    def _loop(self, pos: Position) -> None:
        cfg = self.cfg
        first, t0, window = True, time.perf_counter(), []
        self.last_save = time.monotonic()
        with self._metrics(pos) as metrics:
            while pos.step < self.total:
                for i, batch in enumerate(self.batches.epoch(pos.epoch)):
                    if i < pos.batch_in_epoch:
                        continue  # resume: skip what was trained (sampling is a pure function of seed and position)
                    start = time.perf_counter()
                    self.steps_done = pos.step  # the FLOPS weight's warm-up reads it
                    m = self.step(batch, first and pos.step == 0)  # a fresh run's step 1 runs at max length
                    self.padded += sum(e.padded for e in batch)
                    self.drawn += sum(e.drawn for e in batch)
                    first = False
                    pos.step, pos.batch_in_epoch, pos.groups_consumed = pos.step + 1, i + 1, pos.groups_consumed + len(batch)
                    window = (window + [(len(batch), time.perf_counter() - start)])[-20:]  # an epoch's last batch may be short
                    m = {"step": pos.step, "epoch": pos.epoch, **m, "groups_per_s": round(sum(n for n, _ in window) / sum(t for _, t in window), 3),
                         "groups_consumed": pos.groups_consumed, "elapsed_s": round(time.perf_counter() - t0, 2)}
                    if metrics is not None:
                        metrics.write(json.dumps(m) + "\n")
                        metrics.flush()
                    if pos.step % max(1, cfg.logging_steps) == 0 or pos.step == self.total:
                        log.info("step %d/%d  loss %.4f  lr %.2e  %.1f groups/s", pos.step, self.total, m["loss"], m["lr"], m["groups_per_s"])
                    if cfg.lora_r and pos.step == min(cfg.lora_check_steps, self.total):
                        self._check_lora()
                    by_steps = bool(cfg.save_steps) and pos.step % cfg.save_steps == 0
                    if (by_steps or self._minutes_passed()) and pos.step < self.total:
                        self.save_checkpoint(pos)
                        self.last_save = time.monotonic()
                    if self.on_step is not None:
                        self.on_step(pos.step, m)
                    if pos.step >= self.total:
                        break
                else:
                    pos.epoch, pos.batch_in_epoch = pos.epoch + 1, 0
        if (self.padded or self.drawn) and self.dist.rank == 0:
            log.warning("%d negatives resampled (groups with fewer than %d), %d drawn at random from the corpus (groups with none)",
                        self.padded, cfg.train_group_size - 1, self.drawn)
        self.enc.report_truncation()

    def _minutes_passed(self) -> bool:
        """--save-minutes elapsed since the last checkpoint (rank 0's clock decides for every process: saving
        is collective)."""
        if not self.cfg.save_minutes:
            return False
        due = time.monotonic() - self.last_save >= 60 * self.cfg.save_minutes
        if self.dist.world > 1:
            flag = torch.tensor([int(due)], device=self.dist.device)
            dist.broadcast(flag, 0)
            due = bool(flag.item())
        return due

    def _check_lora(self) -> None:
        norm = lora_b_norm(self.engine.module)
        if norm == 0.0:
            raise RuntimeError(f"LoRA B weights are still zero after {self.cfg.lora_check_steps} steps: the adapters are not "
                               "training (kamalkraj/e5-mistral#6, open-unlearning#178); check --lr and the ZeRO/checkpointing setup")
        log.info("LoRA B norm after %d steps: %.3g", self.cfg.lora_check_steps, norm)

    # -- saving the model

    def _export(self) -> None:
        state = self.engine.full_state_dict()
        if self.dist.rank != 0:
            return
        if self.template is None:
            fresh = build_encoder(self.cfg, "cpu", for_training=False).encoder
        else:
            torch.manual_seed(self.cfg.seed)
            fresh = prepare(self.template, self.cfg, for_training=False).encoder
        fresh.load_state_dict({k: v for k, v in state.items() if not k.startswith("distill_projection.")})
        if self.finish is not None:
            self.finish(fresh)
        after = self._embed(fresh, self.probe)
        if self.cfg.lora_r:
            fresh.model = fresh.model.merge_and_unload()  # in fp32
            merged = self._embed(fresh, self.probe)
            if not np.allclose(after, merged, atol=1e-4):
                raise RuntimeError("merging the LoRA adapters changed the embeddings")
        if self.before is not None and float(np.abs(after - self.before).max()) < 1e-6:
            raise RuntimeError("training did not change the embeddings (FlagEmbedding#1547): check --lr and the data")
        shutil.rmtree(self.ckpt_root, ignore_errors=True)
        fresh.save(self.partial)
        self.cfg.save(self.partial / "train_config.json")
        reloaded = Encoder.load(self.partial, device="cpu")
        cos = float((self._embed(reloaded, self.probe) * after).sum(1).min()) if fresh.config.normalize else 1.0
        if cos < 0.9999:
            raise RuntimeError(f"the saved model does not reproduce the trained embeddings (min cos {cos:.5f})")
        drift = float((after * self.before).sum(1).mean()) if self.before is not None and fresh.config.normalize else float("nan")
        log.info("saved %s (probe cos to the untrained model %.4f; reload parity %.6f)", self.output, drift, cos)
        if self.after_export is not None:  # rank 0 only, as the save
            self.after_export(self.partial)
