"""The contrastive training loop shared by stages that fine-tune an encoder (train; prune's healing).

``Trainer`` validates the groups, builds the encoder (LoRA, gradient checkpointing), picks an engine
(``engines.py``: plain torch for one process, DeepSpeed ZeRO 0-3 otherwise), runs the steps (InfoNCE from
``contrastive.py``, optionally through GradCache), writes metrics.jsonl and checkpoints, and saves a model that
stock loaders read. Both engines give the same losses for the same global batch (tested: 2 processes × B under
ZeRO-2 = 1 process × 2B). Checkpoints (``<output>.partial/checkpoints/step-N``) hold the engine state (model,
optimizer, scheduler), each process's RNG state and the input position; ``resume`` continues from the newest.

Nothing lost, nothing executed (issue 12). ``check_output`` runs before any model is loaded: ``-o`` must be new,
empty, or a retrctl model (``retrctl.json`` and only the files ``Encoder.save`` and the trainer write), the latter
replaced only with ``overwrite``; a ``.partial`` holding anything else is refused, and one holding checkpoints is
continued with ``resume`` or discarded with ``overwrite``, never silently. A resume checks that the data
(``GroupSource.fingerprint``) and every setting outside ``RESUME_MAY_CHANGE`` equal the checkpoint's, so a run
never records one setting and runs another. Checkpoints load with ``weights_only=True`` (``engines.load_tensors``).
``TrainConfig`` lives here rather than in the stage because every training stage shares it (the core never
imports a stage).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
import json
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from retrctl import contrastive, memory, records
from retrctl.engines import (
    DeepSpeedEngine,
    PlainEngine,
    checkpoints,
    import_deepspeed,
    load_tensors,
    rng_state,
    set_rng_state,
    setup_processes,
)
from retrctl.models import Encoder, pool
from retrctl.trainset import Batches, Example, GroupSource

log = logging.getLogger("retrctl.train")


def _f(default, help: str):
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class TrainConfig:
    """Everything a training run needs besides its data; saved as train_config.json beside each checkpoint."""

    model: str | None = _f(None, "Encoder to start from: directory, GGUF file, 'minilm' or 'smollm2'.")
    pooling: str | None = _f(None, "Pooling mean|cls|eos|last (default: the model's own).")
    bidirectional: bool | None = _f(None, "Bidirectional attention for decoders (DRAMA's best setting).")
    query_prompt: str | None = _f(None, "Prefix for queries; saved with the model so inference uses it too.")
    passage_prompt: str | None = _f(None, "Prefix for passages.")
    query_max_len: int | None = _f(None, "Query length cap in tokens.")
    passage_max_len: int | None = _f(None, "Passage length cap in tokens.")
    dtype: str | None = _f(None, "fp32, or bf16 mixed precision (fp32 master weights).")
    device: str | None = _f(None, "Device (default: cuda:LOCAL_RANK when present, else cpu).")
    batch_size: int = _f(32, "Query groups per step per process; in-batch negatives span all processes.")
    train_group_size: int = _f(2, "Passages per query: 1 positive + N-1 hard negatives (resampled per epoch from the group's).")
    temperature: float = _f(0.05, "Softmax temperature on cosine scores (0.05 as E5/sentence-transformers; LightRetriever 0.02).")
    lr: float = _f(2e-5, "Peak learning rate (AdamW).")
    weight_decay: float = _f(0.01, "AdamW weight decay (not on biases and norms).")
    warmup_ratio: float = _f(0.1, "Linear warmup over this fraction of the steps, then linear decay to 0.")
    warmup_steps: int | None = _f(None, "Warmup steps (overrides --warmup-ratio).")
    epochs: int = _f(3, "Passes over the groups (3, as HF TrainingArguments).")
    max_steps: int | None = _f(None, "Stop after this many optimizer steps (overrides --epochs).")
    max_grad_norm: float = _f(1.0, "Gradient clipping (global norm); 0 = off.")
    seed: int = _f(42, "Seed for sampling, dropout and LoRA init.")
    mrl_dims: list[int] | None = _f(None, "Matryoshka: loss summed over these truncated dims, e.g. 64,128,384.")
    distill_weight: float = _f(0.0, "Weight of KL(teacher || student) on groups carrying positive/negative_scores.")
    teacher_temperature: float = _f(1.0, "Temperature applied to teacher scores before the softmax.")
    lora_r: int = _f(0, "LoRA rank (0 = full fine-tuning); adapters are merged on save.")
    lora_alpha: int = _f(32, "LoRA alpha.")
    lora_dropout: float = _f(0.05, "LoRA dropout.")
    gradient_checkpointing: bool = _f(False, "Recompute activations in backward (less memory, ~30% slower).")
    grad_cache: str = _f("auto", "GradCache (same loss and gradient, bounded memory): auto = when plain steps would not fit.")
    chunk_size: int = _f(32, "Texts per forward pass (length-sorted, padding trimmed); GradCache's sub-batch (auto: the largest that fits).")
    max_memory: int | None = _f(None, "Cap on this process's memory, e.g. 12GB or 12GiB (default: what the machine has free).")
    group_by_length: bool = _f(True, "Batch groups of similar length (less padding); order shuffled per epoch.")
    zero_stage: int | None = _f(None, "DeepSpeed ZeRO stage 0-3 (config generated); implies DeepSpeed.")
    deepspeed: str | None = _f(None, "DeepSpeed JSON config ('auto' values are filled in).")
    save_steps: int = _f(0, "Checkpoint every N steps into <output>.partial/checkpoints (0 = none).")
    save_minutes: float = _f(10.0, "Also checkpoint when this many minutes passed since the last one (0 = none).")
    save_total_limit: int = _f(2, "Checkpoints kept.")
    resume: bool = _f(False, "Continue from the newest checkpoint in <output>.partial (refused if its data or settings differ).")
    logging_steps: int = _f(10, "Log loss, lr and groups/s every N steps (metrics.jsonl gets every step).")
    first_step_max_len: bool = _f(True, "Pad step 1 to the max lengths so an out-of-memory shows at step 1.")
    lora_check_steps: int = _f(5, "Fail if LoRA B weights are still zero after this many steps.")
    overwrite: bool = _f(False, "Replace -o if it is a retrctl model (never other files); without --resume, also "
                                "discard the checkpoints in <output>.partial.")
    plan: dict | None = _f(None, "The memory plan of the run (written by train, not a flag).")

    def __post_init__(self):
        if isinstance(self.grad_cache, bool):  # train_config.json files written before auto|on|off
            self.grad_cache = "on" if self.grad_cache else "off"
        if isinstance(self.max_memory, str):
            from retrctl.memory import parse_size

            self.max_memory = parse_size(self.max_memory)

    @classmethod
    def from_json(cls, path) -> TrainConfig:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict):
            raise records.RecordError(path, message="expected a JSON object of training settings")
        for key in ("resume", "overwrite", "plan"):  # per invocation: an earlier run's train_config.json must not carry them over
            data.pop(key, None)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise records.RecordError(path, message=f"unknown training setting(s): {', '.join(unknown)}")
        return cls(**data)

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")

    def replace(self, **flags) -> TrainConfig:
        """A copy with the flags that were given (not None) applied."""
        return dataclasses.replace(self, **{k: v for k, v in flags.items() if v is not None})

    def encoder_overrides(self) -> dict:
        keys = ("pooling", "bidirectional", "query_prompt", "passage_prompt", "query_max_len", "passage_max_len")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}

    def ds_stage(self) -> int | None:
        if self.deepspeed:
            return int(json.loads(Path(self.deepspeed).read_text()).get("zero_optimization", {}).get("stage", 0))
        return self.zero_stage

    def check(self) -> None:
        """Refuse bad settings before any model is loaded. Every GradCache × ZeRO 0-3 × LoRA combination is
        supported and tested (tests/test_train.py::test_zero_matrix): GradCache's per-chunk backwards tell DeepSpeed
        which one ends the step, the case that breaks in peers (tevatron#206, ST#3173)."""
        if self.batch_size < 1 or self.train_group_size < 1 or self.chunk_size < 1:
            raise ValueError("--batch-size, --train-group-size and --chunk-size must be at least 1")
        if self.temperature <= 0:
            raise ValueError("--temperature must be positive")
        if self.grad_cache not in ("auto", "on", "off"):
            raise ValueError(f"--grad-cache must be auto, on or off, got {self.grad_cache!r}")
        if self.max_memory is not None and self.max_memory <= 0:
            raise ValueError("--max-memory must be positive")
        if self.save_minutes < 0:
            raise ValueError("--save-minutes must be 0 (off) or positive")
        if self.zero_stage is not None and self.deepspeed:
            raise ValueError("give --zero-stage or --deepspeed, not both")
        if self.zero_stage not in (None, 0, 1, 2, 3):
            raise ValueError("--zero-stage must be 0, 1, 2 or 3")
        if self.dtype not in (None, "fp32", "bf16"):
            raise ValueError("training runs in fp32 or bf16 mixed precision (--dtype bf16); fp16 needs loss scaling, not offered")


# Settings a resume may change: where and how often it reports and saves, never what it computes.
# per-invocation and bookkeeping settings, and the memory plan's inputs and outcome: plain or GradCache with any chunk
# computes the same loss and gradient, so a resume on a busier (or bigger) machine may plan differently
RESUME_MAY_CHANGE = frozenset({"resume", "overwrite", "save_steps", "save_minutes", "save_total_limit", "logging_steps",
                               "device", "lora_check_steps", "grad_cache", "chunk_size", "max_memory", "plan"})


def resume_conflicts(saved: dict, cfg: TrainConfig) -> list[str]:
    """The settings of ``cfg`` that differ from a checkpoint's train_config.json, as 'key (checkpoint X, now Y)'."""
    now = dataclasses.asdict(cfg)
    then = {**dataclasses.asdict(TrainConfig()), **saved}  # a field added since the checkpoint: its default
    return [f"{k} (checkpoint {then.get(k)!r}, now {now.get(k)!r})" for k in sorted(set(now) | set(then))
            if k not in RESUME_MAY_CHANGE and then.get(k) != now.get(k)]


# ---------------------------------------------------------------- the output directory

# What Encoder.save (transformers' save_pretrained included) and the trainer write into a model directory; a
# directory with anything else in it is not retrctl's to replace (issue 12: train -o deleted a user's files).
MODEL_FILES = ("retrctl.json", "train_config.json", "metrics.jsonl", "modules.json", "sentence_bert_config.json",
               "config_sentence_transformers.json", "config.json", "generation_config.json", "model.safetensors",
               "model-*-of-*.safetensors", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "added_tokens.json", "tokenizer.model", "vocab.txt", "vocab.json", "merges.txt",
               "spiece.model", "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json")
MODEL_DIRS = {"1_Pooling": ("config.json",), "2_Normalize": ()}
SCRATCH_FILES = ("metrics.jsonl.tmp",)  # besides checkpoints/, in <output>.partial only


def foreign_files(d: Path, partial: bool = False) -> list[str]:
    """Entries of ``d`` that no retrctl model (``partial``: or training scratch, i.e. checkpoints) contains."""
    out, names = [], MODEL_FILES + (SCRATCH_FILES if partial else ())
    for p in sorted(d.iterdir()):
        real_dir = p.is_dir() and not p.is_symlink()
        if real_dir and p.name in MODEL_DIRS:
            out += [f"{p.name}/{q.name}" for q in sorted(p.iterdir()) if q.name not in MODEL_DIRS[p.name] or not q.is_file()]
        elif real_dir and partial and p.name == "checkpoints":
            out += [f"checkpoints/{q.name}" for q in sorted(p.iterdir())
                    if not (q.is_dir() and not q.is_symlink() and re.fullmatch(r"step-\d+(\.tmp)?", q.name))]
        elif not (p.is_file() and any(fnmatch.fnmatchcase(p.name, pat) for pat in names)):
            out.append(p.name + ("/" if p.is_dir() else ""))
    return out


def _is_model(d: Path) -> bool:
    try:
        return isinstance(json.loads((d / "retrctl.json").read_text()), dict)
    except (OSError, ValueError):
        return False


def _names(files: list[str]) -> str:
    return ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")


def check_output(output, cfg: TrainConfig) -> None:
    """Refuse (exit 2), before anything is loaded or written, an ``-o`` whose replacement would lose data."""
    out = Path(output)
    if out.name in ("", ".", ".."):
        raise records.RecordError(out, message="give -o a new directory's name, not '.', '..' or '/'")
    partial = out.with_name(out.name + ".partial")
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise records.RecordError(out, message="exists and is not a directory: choose another -o")
        if any(out.iterdir()):
            foreign = foreign_files(out) or ([] if _is_model(out) else ["no retrctl.json"])
            if foreign:
                raise records.RecordError(out, message=f"is not empty and not a retrctl model ({_names(foreign)}): retrctl "
                                                        "replaces only its own models, even with --overwrite; choose another -o")
            if not cfg.overwrite:
                raise records.RecordError(out, message="is a retrctl model already: give --overwrite to replace it, or choose another -o")
    if partial.exists() or partial.is_symlink():
        if not partial.is_dir() or partial.is_symlink():
            raise records.RecordError(partial, message="is in the way of training's scratch directory: remove it or choose another -o")
        foreign = foreign_files(partial, partial=True)
        if foreign:
            raise records.RecordError(partial, message=f"holds files retrctl did not write ({_names(foreign)}): move them away "
                                                        "or choose another -o")
        done = checkpoints(partial / "checkpoints")
        if done and not cfg.resume and not cfg.overwrite:
            raise records.RecordError(partial, message=f"holds checkpoints of an earlier run (newest {done[-1].name}): give "
                                                        "--resume to continue it, or --overwrite to discard them")


def _read_state(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise records.RecordError(path, message="missing from the checkpoint; delete the checkpoint to resume from an earlier one") from None
    except (OSError, ValueError) as e:
        raise records.RecordError(path, message=f"damaged checkpoint file ({e}); delete the checkpoint to resume from an earlier one") from None
    if not isinstance(data, dict):
        raise records.RecordError(path, message="damaged checkpoint file (not a JSON object)")
    return data


# ---------------------------------------------------------------- model


class Tower(torch.nn.Module):
    """Transformer + pooling: token ids in, pooled float32 vectors out (normalization is the loss's job)."""

    def __init__(self, enc: Encoder):
        super().__init__()
        self.enc = enc

    def forward(self, input_ids, attention_mask):
        hidden = self.enc.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return pool(hidden, attention_mask, self.enc.config.pooling).float()


def build_encoder(cfg: TrainConfig, device: str, *, for_training: bool = True) -> Encoder:
    torch.manual_seed(cfg.seed)  # LoRA init identical in every process
    enc = Encoder.load(cfg.model, device=device, **cfg.encoder_overrides())
    for name, p in enc.model.named_parameters():
        if name.startswith("pooler."):  # BERT's pooler is unused by our pooling; frozen, it gets no None grads
            p.requires_grad_(False)
    if cfg.gradient_checkpointing and for_training:
        enc.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if cfg.lora_r:
            enc.model.enable_input_require_grads()  # open-unlearning#178: else LoRA under checkpointing trains nothing
    if cfg.lora_r:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules="all-linear", exclude_modules=r".*pooler.*", task_type="FEATURE_EXTRACTION")
        enc.model = get_peft_model(enc.model, lora)
    enc.config.temperature = cfg.temperature
    enc.train(for_training)
    return enc


def lora_b_norm(module: torch.nn.Module) -> float:
    total = torch.zeros((), device=next(module.parameters()).device)
    for name, p in module.named_parameters():
        if "lora_B" in name:
            t = p.ds_tensor if hasattr(p, "ds_tensor") else p  # ZeRO-3 keeps a partition per process
            total += t.detach().float().pow(2).sum()
    if dist.is_initialized():  # nccl reduces device tensors only
        dist.all_reduce(total)
    return math.sqrt(float(total))


# ---------------------------------------------------------------- the loop


@dataclasses.dataclass
class Position:
    step: int = 0  # optimizer steps done
    epoch: int = 0
    batch_in_epoch: int = 0  # global batches of this epoch already trained
    groups_consumed: int = 0  # groups read from the input so far (the stream offset)


class Trainer:
    def __init__(self, cfg: TrainConfig, groups, corpus: dict | None, output, *,
                 on_step: Callable[[int, dict], None] | None = None):
        cfg.check()
        check_output(output, cfg)
        self.cfg, self.output, self.on_step = cfg, Path(output), on_step
        self.dist = setup_processes(cfg)
        if self.dist.world > 1 and groups == "-":
            raise ValueError("with several processes read groups from a file, not stdin (every process reads them)")
        self.source = GroupSource(groups, corpus)
        self.n_groups = self.source.validate()
        self.resume_from = self.resume_point() if cfg.resume else None  # checked before any model is loaded
        rank, world = self.dist.rank, self.dist.world
        self.batches = Batches(self.source, group_size=cfg.train_group_size, global_batch=cfg.batch_size * world,
                               seed=cfg.seed, drop_last=world > 1, group_by_length=cfg.group_by_length)
        per_epoch = self.batches.per_epoch(self.n_groups)
        if per_epoch == 0:
            raise records.RecordError(self.source.path, message=f"{self.n_groups} groups: fewer than one global batch of {cfg.batch_size * world}")
        self.total = cfg.max_steps or per_epoch * cfg.epochs
        self.warmup = cfg.warmup_steps if cfg.warmup_steps is not None else int(cfg.warmup_ratio * self.total)
        log.info("%d groups, %d steps of %d groups (%d per process × %d), group size %d, warmup %d",
                 self.n_groups, self.total, cfg.batch_size * world, cfg.batch_size, world, cfg.train_group_size, self.warmup)
        self.enc = build_encoder(cfg, self.dist.device)
        self.probe = self._probe_texts()
        self.before = self._embed(self.enc, self.probe) if rank == 0 else None
        tower = Tower(self.enc)
        self.plan = self._plan_memory(tower)  # before any optimizer state: on CPU an OOM is a kill, not an error
        cfg.plan = self.plan.record()
        if self.dist.deepspeed:
            self.engine = DeepSpeedEngine(tower, cfg, self.total, self.warmup, world)
        else:
            self.engine = PlainEngine(tower, cfg, self.total, self.warmup)
        torch.manual_seed(cfg.seed + 1 + rank)  # dropout differs per process
        self.padded = self.drawn = 0  # negatives resampled / drawn from the corpus, over the batches trained
        self.partial = self.output.with_name(self.output.name + ".partial")
        self.ckpt_root = self.partial / "checkpoints"

    # -- helpers

    def _probe_texts(self) -> list[str]:
        """A few texts whose embeddings must change in training and survive saving (FlagEmbedding#1547)."""
        batch = next(iter(self.batches.epoch(0)))
        return [t for e in batch[:4] for t in (e.query, e.passages[0])]

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
            width = self.enc.config.query_max_len if kind == "query" else self.enc.config.passage_max_len
            width = min(width, getattr(self.enc.model.config, "max_position_embeddings", width) or width)
        batch = self.enc.tokenize(texts, kind, width)
        return {k: v.to(self.dist.device) for k, v in batch.items()}

    def _plan_memory(self, tower: Tower) -> memory.Plan:
        """Plain steps or GradCache (and its chunk) from what one text at the max length keeps for backward
        (measured), the gradients and AdamW state, and the memory free now (memory.py)."""
        cfg, enc, dev = self.cfg, self.enc, self.dist.device

        def forward(batch):
            with torch.autocast(torch.device(dev).type, dtype=torch.bfloat16, enabled=cfg.dtype == "bf16"):
                return tower(**batch)

        per: dict[str, int] = {}
        measured: dict[int, int] = {}
        for kind in ("query", "passage"):
            batch = memory.max_length_batch(enc, kind, 1, "cpu")
            width = batch["input_ids"].size(1)
            if width not in measured:
                measured[width] = memory.probe(forward, lambda n, k=kind: memory.max_length_batch(enc, k, n, dev), tower)
                if cfg.gradient_checkpointing:
                    measured[width] += memory.checkpoint_boundaries(enc.model.config, width)
            per[kind] = measured[width]
        trainable = sum(p.numel() for p in tower.parameters() if p.requires_grad)
        zero = cfg.ds_stage() if self.dist.deepspeed else None
        b, g = cfg.batch_size, cfg.train_group_size
        cost = memory.StepCost(state=memory.optimizer_state(trainable, zero_stage=zero, world=self.dist.world),
                               per_query=per["query"], per_passage=per["passage"], queries=b, passages=b * g,
                               embeddings=3 * 4 * b * (1 + g) * self.dist.world * enc.model.config.hidden_size)
        budget = memory.agree(memory.available(dev, cfg.max_memory), dev)
        plan = memory.plan_step(cost, mode=cfg.grad_cache, chunk_size=cfg.chunk_size, budget=budget, batch_size=b, group_size=g)
        if self.dist.rank == 0:
            log.info("%s", plan.line())
        return plan

    # -- one step

    def step(self, batch: list[Example], first: bool) -> dict:
        cfg, rank, g = self.cfg, self.dist.rank, self.cfg.train_group_size
        b = len(batch) // self.dist.world
        local = batch[rank * b : (rank + 1) * b]
        qb = self._tokenize([e.query for e in local], "query", first and cfg.first_step_max_len)
        pb = self._tokenize([p for e in local for p in e.passages], "passage", first and cfg.first_step_max_len)
        labels = [(rank * b + j) * g for j in range(b)]
        mask = contrastive.false_negative_mask([e.positive_keys for e in local], [k for e in batch for k in e.keys], labels)
        teacher = valid = None
        if cfg.distill_weight:
            valid = torch.tensor([e.teacher is not None for e in local])
            teacher = torch.tensor([e.teacher or [0.0] * g for e in local], dtype=torch.float32)
        loss_fn = functools.partial(
            contrastive.group_loss, group_size=g, temperature=cfg.temperature, normalize=self.enc.config.normalize,
            mrl_dims=cfg.mrl_dims, mask=mask, teacher=teacher, teacher_valid=valid, distill_weight=cfg.distill_weight,
            teacher_temperature=cfg.teacher_temperature)
        # forward in length-sorted chunks cut to their longest row: padding costs nothing (except at step 1)
        trim = not (first and cfg.first_step_max_len)
        qc, qinv = contrastive.sorted_chunks(qb, self.plan.chunk_size, trim)
        pc, pinv = contrastive.sorted_chunks(pb, self.plan.chunk_size, trim)

        def unsorted_loss(q, p):
            return loss_fn(q[qinv.to(q.device)], p[pinv.to(p.device)])

        if self.plan.grad_cache:
            loss, parts = contrastive.grad_cache_step(self.engine.forward, qc, pc, unsorted_loss, self.engine.backward)
        else:
            embed = self.engine.forward
            loss, parts = unsorted_loss(torch.cat([embed(c) for c in qc]), torch.cat([embed(c) for c in pc]))
            self.engine.backward(loss)
            loss = loss.detach()
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

    def resume_point(self) -> Path | None:
        """The newest checkpoint, refused (exit 2) if it was written for other data, settings or process count."""
        found = checkpoints(self.output.with_name(self.output.name + ".partial") / "checkpoints")
        if not found:
            return None
        d = found[-1]
        state = _read_state(d / "trainer_state.json")
        if state.get("world_size") != self.dist.world:
            raise records.RecordError(d, message=f"written by {state.get('world_size')} processes; resume with the same number (now {self.dist.world})")
        differ = resume_conflicts(_read_state(d / "train_config.json"), self.cfg)
        if state.get("data_hash") != self.data_hash:
            differ.insert(0, "the data (groups, or the text of the docs they name)")
        if differ:
            raise records.RecordError(d, message=f"--resume: this run differs from the checkpoint in {'; '.join(differ)}. Rerun with "
                                                 "the checkpoint's data and settings (its train_config.json), or drop --resume and "
                                                 "give --overwrite to start over")
        return d

    def load_checkpoint(self) -> Position:
        d = self.resume_from
        if d is None:
            log.warning("--resume: no checkpoint in %s; starting from step 0", self.ckpt_root)
            return Position()
        state = _read_state(d / "trainer_state.json")
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
                    for p in self.partial.iterdir():
                        if p.is_dir() and not p.is_symlink():
                            shutil.rmtree(p)
                        else:
                            p.unlink()
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
            tmp = path.with_name(path.name + ".tmp")  # replaced whole: a kill here must not lose earlier steps' lines
            tmp.write_text("".join(ln + "\n" for ln in keep))
            os.replace(tmp, path)
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
                    m = self.step(batch, first and pos.step == 0)  # a fresh run's step 1 runs at max length
                    self.padded += sum(e.padded for e in batch)
                    self.drawn += sum(e.drawn for e in batch)
                    first = False
                    pos.step, pos.batch_in_epoch, pos.groups_consumed = pos.step + 1, i + 1, pos.groups_consumed + len(batch)
                    window = (window + [time.perf_counter() - start])[-20:]
                    m = {"step": pos.step, "epoch": pos.epoch, **m, "groups_per_s": round(len(batch) * len(window) / sum(window), 3),
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
        fresh = build_encoder(self.cfg, "cpu", for_training=False)
        Tower(fresh).load_state_dict(state)
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
