"""Where training runs: one plain-torch process, or DeepSpeed ZeRO 0-3 over any number of processes.

- ``PlainEngine``: one process, torch AdamW, autocast for bf16. Chosen when neither ``--zero-stage`` nor
  ``--deepspeed`` is given and there is one process: no distributed init, so it is the fastest start.
- ``DeepSpeedEngine``: ZeRO from a generated config or the user's JSON ('auto' filled in), launched by
  ``torchrun`` or ``deepspeed``, gloo on CPU and nccl on GPUs. We hand DeepSpeed a torch AdamW, so nothing
  (fused Adam) has to be compiled, and the same warmup/decay schedule as the plain engine.

Both expose forward / backward(loss, last) / step / lr / save / load / full_state_dict, so the loop in
``loop.py`` does not know which one it drives. ``backward(..., last=False)`` marks GradCache's inner chunk
backwards as not ending the step, which is what lets GradCache run under ZeRO-2/3 (peers: tevatron#206, ST#3173).

The module an engine trains is the ``Encoder`` itself; ``forward(batch, kind, layout)`` runs its one forward pass
with ``raw=True`` (the head's output as the loss takes it; with the run's ``TrainingLayout``, every trained head's
part side by side), so checkpoints hold the ``Encoder``'s own state dict. Checkpoint files are read by ``checkpoint.load_tensors``
(never unpickling code), DeepSpeed's included (see checkpoint.py).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from retrctl.models.loading import cache_dir
from retrctl.process import free_port, stdout_to_stderr
from retrctl.records import RecordError
from retrctl.train.checkpoint import _scan, deepspeed_globals, load_tensors

if TYPE_CHECKING:
    from retrctl.models import Encoder
    from retrctl.models.layout import TrainingLayout
    from retrctl.train.config import TrainConfig


def linear_schedule(step: int, *, warmup: int, total: int) -> float:
    """Linear warmup from 1/(warmup+1) to 1, then linear decay towards 0 at ``total``."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    return max(0.0, (total - step) / max(1, total - warmup))


# ---------------------------------------------------------------- processes


@dataclasses.dataclass
class Dist:
    rank: int = 0
    world: int = 1
    deepspeed: bool = False
    device: str = "cpu"

    def barrier(self):
        if self.world > 1:
            dist.barrier()


def _quiet_deepspeed() -> None:
    """DeepSpeed logs to stdout at INFO; stdout carries records only."""
    ds = logging.getLogger("DeepSpeed")
    ds.setLevel(max(logging.getLogger().level, logging.WARNING))
    for h in ds.handlers:
        if type(h) is logging.StreamHandler and h.stream is not sys.stderr:  # DeepSpeed's own, not a test harness's
            h.setStream(sys.stderr)


def import_deepspeed():
    """Import DeepSpeed with its stdout log handler bound to stderr (transformers' save_pretrained imports it too)."""
    with stdout_to_stderr():
        import deepspeed
    _quiet_deepspeed()
    return deepspeed


def without_shared_memory_all_reduce(deepspeed) -> None:
    """Keep DeepSpeed from compiling its shared-memory all-reduce as it starts a process group on CPU (a C++
    extension, ~40 s of compile on the first run; then loaded from TORCH_EXTENSIONS_DIR). That op serves the
    all-reduce of tensor-parallel inference only; training's collectives go through torch.distributed (gloo).
    DeepSpeed builds the op only where its table of compatible ops says it can, so the entry is turned off."""
    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)  # the table, read by comm/torch.py's build_shm_op
    if isinstance(compatible, dict) and "deepspeed_shm_comm" in compatible:
        compatible["deepspeed_shm_comm"] = False


def setup_processes(cfg: TrainConfig) -> Dist:
    if importlib.util.find_spec("deepspeed") is not None:  # one process without ZeRO runs without DeepSpeed installed
        import_deepspeed()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = cfg.device or (f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    if cfg.zero_stage is None and not cfg.deepspeed and world == 1:
        return Dist(device=device)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache_dir() / "torch_extensions"))
    if "RANK" not in os.environ:  # one process without a launcher
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    deepspeed = import_deepspeed()
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    else:
        without_shared_memory_all_reduce(deepspeed)
    if not dist.is_initialized():
        with stdout_to_stderr():
            deepspeed.init_distributed(dist_backend="nccl" if device.startswith("cuda") else "gloo", verbose=False)
    rank = dist.get_rank()
    if rank != 0:  # only rank 0 logs at INFO
        logging.getLogger("retrctl").setLevel(logging.WARNING)
    return Dist(rank=rank, world=dist.get_world_size(), deepspeed=True, device=device)


# ---------------------------------------------------------------- engines


def lora_b_norm(module: torch.nn.Module) -> float:
    """The global norm of the LoRA B weights (every process's ZeRO-3 partition): zero means the adapters do not train."""
    total = torch.zeros((), device=next(module.parameters()).device)
    for name, p in module.named_parameters():
        if "lora_B" in name:
            t = p.ds_tensor if hasattr(p, "ds_tensor") else p  # ZeRO-3 keeps a partition per process
            total += t.detach().float().pow(2).sum()
    if dist.is_initialized():  # nccl reduces device tensors only
        dist.all_reduce(total)
    return math.sqrt(float(total))


def param_groups(module: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only; a parameter with its own ``lr`` attribute (prune's gates) in a group of its own."""
    decay, no_decay, own = [], [], {}
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        if getattr(p, "lr", None) is not None:
            own.setdefault(p.lr, []).append(p)
        else:
            (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0},
            *({"params": ps, "weight_decay": 0.0, "lr": lr} for lr, ps in own.items())]


class PlainEngine:
    """One process, plain torch."""

    def __init__(self, enc: Encoder, cfg: TrainConfig, total: int, warmup: int):
        self.module, self.cfg = enc, cfg
        self.optimizer = torch.optim.AdamW(param_groups(enc, cfg.weight_decay), lr=cfg.lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, functools.partial(linear_schedule, warmup=warmup, total=total))
        self.device_type = torch.device(enc.device).type

    def forward(self, batch: dict, kind: str = "passage", layout: TrainingLayout | None = None) -> torch.Tensor:
        with torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.cfg.dtype == "bf16"):
            return self.module(batch, kind, raw=True, layout=layout)

    def backward(self, loss: torch.Tensor, last: bool = True) -> None:
        loss.backward()

    def step(self) -> None:
        if self.cfg.max_grad_norm:
            torch.nn.utils.clip_grad_norm_([p for g in self.optimizer.param_groups for p in g["params"]], self.cfg.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def save(self, d: Path, rank: int) -> None:
        torch.save({"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict()}, d / "engine.pt")

    def load(self, d: Path) -> None:
        state = load_tensors(d / "engine.pt", map_location=self.module.device)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def full_state_dict(self) -> dict:
        return {k: v.detach().cpu().float() for k, v in self.module.state_dict().items()}


def deepspeed_config(cfg: TrainConfig, world: int) -> dict:
    """The generated config, or the user's JSON with 'auto' filled in."""
    if cfg.deepspeed:
        ds = json.loads(Path(cfg.deepspeed).read_text())
        for section in ("optimizer", "scheduler"):
            if section in ds:
                raise ValueError(f"{cfg.deepspeed}: remove '{section}': retrctl passes AdamW and its warmup schedule (--lr, --warmup-*)")
    else:
        ds = {"zero_optimization": {"stage": cfg.zero_stage or 0}}
    fill = {"train_micro_batch_size_per_gpu": cfg.batch_size, "train_batch_size": cfg.batch_size * world,
            "gradient_accumulation_steps": 1, "gradient_clipping": cfg.max_grad_norm}
    for k, v in fill.items():
        if ds.get(k, "auto") == "auto":
            ds[k] = v
    if ds["gradient_accumulation_steps"] != 1:
        raise ValueError("gradient_accumulation_steps must be 1: accumulation adds no in-batch negatives (ST#2916); use --grad-cache")
    bf16 = ds.setdefault("bf16", {})
    if bf16.get("enabled", "auto") == "auto":
        bf16["enabled"] = cfg.dtype == "bf16"
    ds.setdefault("zero_allow_untested_optimizer", True)
    ds.setdefault("steps_per_print", 10**9)
    ds.setdefault("wall_clock_breakdown", False)
    return ds


class DeepSpeedEngine:
    """DeepSpeed ZeRO 0-3, any number of processes."""

    def __init__(self, enc: Encoder, cfg: TrainConfig, total: int, warmup: int, world: int):
        deepspeed = import_deepspeed()
        self.cfg, self.ds_config = cfg, deepspeed_config(cfg, world)
        optimizer = torch.optim.AdamW(param_groups(enc, cfg.weight_decay), lr=cfg.lr)
        schedule = functools.partial(linear_schedule, warmup=warmup, total=total)
        with stdout_to_stderr():
            self.engine, _, _, self.scheduler = deepspeed.initialize(
                model=enc, optimizer=optimizer, config=self.ds_config,
                lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, schedule))
        _quiet_deepspeed()
        self.module = self.engine.module
        self.stage = self.ds_config["zero_optimization"].get("stage", 0)

    def forward(self, batch: dict, kind: str = "passage", layout: TrainingLayout | None = None) -> torch.Tensor:
        return self.engine(batch, kind, raw=True, layout=layout)

    def backward(self, loss: torch.Tensor, last: bool = True) -> None:
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss)

    def step(self) -> None:
        self.engine.set_gradient_accumulation_boundary(True)
        self.engine.step()

    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def save(self, d: Path, rank: int) -> None:
        with stdout_to_stderr():
            self.engine.save_checkpoint(str(d), tag="deepspeed", save_latest=False)

    def load(self, d: Path) -> None:
        files = sorted((d / "deepspeed").glob("*.pt"))
        if not files:
            raise RecordError(d / "deepspeed", message="no DeepSpeed checkpoint files: delete this checkpoint to resume from an earlier one")
        allowed = {f"{c.__module__}.{c.__qualname__}" for c in deepspeed_globals()}
        for f in files:  # before DeepSpeed opens anything: only tensors, containers and its own three classes
            _scan(f, allowed)
        ce = self.engine.checkpoint_engine
        ce.load = functools.partial(load_tensors, allow=deepspeed_globals())  # its own load unpickles any class
        try:
            with stdout_to_stderr():
                path, _ = self.engine.load_checkpoint(str(d), tag="deepspeed")
        finally:
            del ce.load  # back to the class's method (used by save)
        if path is None:
            raise RuntimeError(f"{d}: DeepSpeed found no checkpoint to resume")

    def full_state_dict(self) -> dict | None:
        """Full weights on rank 0 (None elsewhere); collective under ZeRO-3."""
        if self.stage == 3:
            state = self.engine._zero3_consolidated_16bit_state_dict()
        else:
            state = self.module.state_dict() if dist.get_rank() == 0 else None
        return None if state is None else {k: v.detach().cpu().float() for k, v in state.items()}
