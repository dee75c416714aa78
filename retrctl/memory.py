"""Memory: what this process may use, what one training step or one encoding batch costs, and the plan.

On a CPU box an out-of-memory is a SIGKILL from the kernel, not an exception: HF Trainer's
``auto_find_batch_size`` halves the batch after an OOM *exception* and never sees a kill, and for a contrastive
loss a smaller batch is a different objective. So everything here happens before step 1 (or batch 1):

- ``available(device)``: the bytes this process can still take. On CPU the least of ``MemAvailable``
  (/proc/meminfo) and the cgroup's room (v2 ``memory.max`` − ``memory.current``, v1 ``memory.limit_in_bytes`` −
  ``memory.usage_in_bytes``, reclaimable page cache counted as free, every ancestor cgroup checked); on CUDA
  ``torch.cuda.mem_get_info`` of the process's device. Under torchrun/DeepSpeed the local processes share the
  host's RAM, so each gets ``1/LOCAL_WORLD_SIZE`` of it (Ray workers: their node's share). ``--max-memory`` caps the whole process.
- ``probe(forward, ...)``: the bytes of activations one text at the maximum length keeps for backward, measured
  by one forward of two texts under ``saved_tensors_hooks`` (every tensor autograd saves, counted once per
  storage, parameters excluded). Measured rather than computed from shapes, so it is right for whatever attention
  kernel, pooling, LoRA or dtype the model runs with; the RNG is restored afterwards, so results do not change.
- ``StepCost`` turns that into one step's peak for plain steps (every text's graph alive until backward) and for
  GradCache with chunk c (one chunk's graph alive), plus gradients and AdamW state (partitioned under ZeRO).
  ``ACTIVATION_FACTOR`` (what the allocator and backward temporaries add on top of the saved tensors) is
  calibrated against measured peak RSS: ``bench/memory.py`` prints estimate vs measurement (bench/RESULTS.md).
  GradCache's cached outputs are sized by the run's head layout (``cached_outputs``).
- ``plan_step``: plain steps when they fit with a margin, else GradCache with the largest chunk that fits (same
  loss and gradient, tests/test_train.py), else ``DoesNotFit`` naming the smallest setting that would fit.
- ``encode_batch``: the largest inference batch (no graph kept) that fits, for index/mine/search and generation.

Nothing here imports torch at module level, so ``retrctl --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from pathlib import Path

from retrctl.errors import UsageError

log = logging.getLogger("retrctl.memory")

GB = 10**9
MARGIN = 0.8  # of what is free: room for estimate error and for the rest of the machine
# measured peak RSS above the gradients and optimizer state / bytes autograd saves (allocator slack, backward
# temporaries), calibrated on minilm and smollm2 (bench/memory.py, bench/RESULTS.md: at most 1.28 plain, 1.74
# GradCache), with headroom
ACTIVATION_FACTOR = 1.45  # plain steps: every text's graph alive
CACHED_FACTOR = 2.0  # GradCache: one chunk's graph, plus the graph-free first pass and the cache
INFERENCE_FACTOR = 2.0  # peak of a no-grad forward / the working memory of one layer (calibrated like the above)
UNLIMITED = 2**60  # cgroup v1 writes ~2^63 for "no limit"

_UNITS = {"b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(text: str) -> int:
    """'12GB' (10^9), '12GiB' or '12G' (2^30, as docker and kubernetes read them), '500MB', '1.5TB' → bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"expected a size with a unit such as 12GB, 12GiB or 500MB, got {text!r}")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError(f"a memory size must be positive, got {text!r}")
    return n


def fmt(n: float) -> str:
    return f"{n / GB:.1f} GB" if n >= 0.1 * GB else f"{n / 2**20:.0f} MB"


class DoesNotFit(UsageError):
    """Nothing fits: exit 2 with one line naming the smallest setting that would."""


# ---------------------------------------------------------------- what is available


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    if text is None or text == "max":
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def _stat(path: Path, key: str) -> int:
    for line in (_read(path) or "").splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return _int(v) or 0
    return 0


def meminfo_available(path="/proc/meminfo") -> int | None:
    """MemAvailable (the kernel's estimate of what can be allocated without swapping), in bytes."""
    for line in (_read(Path(path)) or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _cgroup_dirs(root: Path, proc_cgroup: Path, v2: bool) -> list[Path]:
    """This process's cgroup directory and its ancestors (limits may sit on any of them), innermost first."""
    rel = None
    for line in (_read(proc_cgroup) or "").splitlines():
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if (v2 and hid == "0" and controllers == "") or (not v2 and "memory" in controllers.split(",")):
            rel = path.lstrip("/")
    dirs = []
    if rel:
        d = root / rel
        while True:
            dirs.append(d)
            if d == root or root not in d.parents:
                break
            d = d.parent
    if root not in dirs:
        dirs.append(root)  # inside a container the namespace root is this cgroup
    return [d for d in dirs if d.is_dir()]


def cgroup_available(root="/sys/fs/cgroup", proc_cgroup="/proc/self/cgroup") -> int | None:
    """Room left under the tightest cgroup memory limit (v2, or v1 under ``<root>/memory``); None if unlimited.
    Inactive page cache counts as free: the kernel reclaims it before it kills anyone."""
    root, proc_cgroup = Path(root), Path(proc_cgroup)
    rooms = []
    for d in _cgroup_dirs(root, proc_cgroup, v2=True):
        limit = _int(_read(d / "memory.max"))
        if limit is not None and limit < UNLIMITED:
            used = (_int(_read(d / "memory.current")) or 0) - _stat(d / "memory.stat", "inactive_file")
            rooms.append(limit - max(0, used))
    v1 = root / "memory"
    if v1.is_dir():
        for d in _cgroup_dirs(v1, proc_cgroup, v2=False):
            limit = _int(_read(d / "memory.limit_in_bytes"))
            if limit is not None and limit < UNLIMITED:
                used = (_int(_read(d / "memory.usage_in_bytes")) or 0) - _stat(d / "memory.stat", "total_inactive_file")
                rooms.append(limit - max(0, used))
    return max(0, min(rooms)) if rooms else None


def rss() -> int:
    """This process's resident set, in bytes."""
    text = _read(Path("/proc/self/statm"))
    if text:
        return int(text.split()[1]) * os.sysconf("SC_PAGE_SIZE")
    import resource  # not Linux: peak instead of current

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def local_processes() -> int:
    """Processes of this job on this host (torchrun: LOCAL_WORLD_SIZE; the deepspeed launcher: LOCAL_SIZE; Ray
    workers: RETRCTL_LOCAL_WORKERS, the workers that may share a node, set by retrctl/distributed.py)."""
    for key in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "RETRCTL_LOCAL_WORKERS"):
        if os.environ.get(key, "").isdigit():
            return max(1, int(os.environ[key]))
    return 1


@dataclasses.dataclass
class Budget:
    """held: bytes this process holds now (RSS, or CUDA memory reserved); free: what it may still take."""

    held: int
    free: int
    source: str

    @property
    def total(self) -> int:
        return self.held + self.free

    @property
    def usable(self) -> int:
        """What a plan may spend: all of a --max-memory cap, MARGIN of memory found free."""
        return self.free if self.source == "--max-memory" else int(self.free * MARGIN)


def available(device: str = "cpu", max_memory: int | None = None) -> Budget:
    """What this process holds and may still take on ``device``, its share when several local processes run.
    ``max_memory`` (or the environment's RETRCTL_MAX_MEMORY, e.g. 12GB) caps the whole process."""
    if max_memory is None and os.environ.get("RETRCTL_MAX_MEMORY"):
        max_memory = parse_size(os.environ["RETRCTL_MAX_MEMORY"])
    if str(device).startswith("cuda"):
        import torch

        dev = torch.device(device)
        free, _ = torch.cuda.mem_get_info(dev)
        held, source = torch.cuda.memory_reserved(dev), f"{dev} free (torch.cuda.mem_get_info)"
    else:
        found = [(n, s) for n, s in ((meminfo_available(), "MemAvailable"), (cgroup_available(), "cgroup limit")) if n is not None]
        free, source = min(found) if found else (8 * GB, "unknown; assumed 8 GB")
        share = local_processes()
        if share > 1:
            free, source = free // share, f"{source} / {share} local processes"
        held = rss()
    if max_memory is not None and max_memory - held < free * MARGIN:
        free, source = max(0, max_memory - held), "--max-memory"
    return Budget(held=held, free=int(free), source=source)


# ---------------------------------------------------------------- what a step costs


def probe(forward, make_batch, module, rows: int = 2) -> int:
    """Bytes autograd keeps for backward per text: one forward of ``rows`` texts (``make_batch(rows)``) under
    saved_tensors_hooks, each saved storage counted once, ``module``'s parameters (and their views) left out."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # tensors without storage (sparse, nested)
            return t
        key = st.data_ptr()
        if key not in params and key != 0:
            seen.setdefault(key, st.nbytes())
        return t

    # fork_rng puts the generators back: probing must not shift the dropout masks of the steps that follow
    with torch.random.fork_rng(), torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward(make_batch(rows))
        del out
    return math.ceil(sum(seen.values()) / rows)


@dataclasses.dataclass
class StepCost:
    """One training step of this process: bytes added beyond what the process holds when planning."""

    state: int  # gradients + AdamW moments (this process's partition under ZeRO)
    per_query: int  # activations kept per query text at its max length
    per_passage: int  # … per passage text
    queries: int  # texts per step in this process
    passages: int
    embeddings: int = 0  # GradCache's cached embeddings and their gradients
    teacher: int = 0  # an online teacher's no-grad forward over one chunk (its weights are held already)

    def plain(self) -> int:
        return self.state + self.teacher + int(ACTIVATION_FACTOR * (self.queries * self.per_query + self.passages * self.per_passage))

    def cached(self, chunk: int) -> int:
        alive = max(min(chunk, self.queries) * self.per_query, min(chunk, self.passages) * self.per_passage)
        return self.state + self.teacher + self.embeddings + int(CACHED_FACTOR * alive)


def cached_outputs(layout, queries: int, passages: int, world: int = 1) -> int:
    """GradCache's cache for the global batch: each text's training output (as wide as its side of ``layout``, a
    ``models.layout.TrainingLayout``) in fp32, three times (the outputs, their gradients, the gathered candidates)."""
    return 3 * 4 * world * (queries * layout.query.width + passages * layout.passage.width)


def optimizer_state(trainable: int, *, zero_stage: int | None = None, world: int = 1, bytes_per: int = 4) -> int:
    """Gradients (1×) and AdamW's two moments (2×) of the trainable parameters, fp32, ZeRO-partitioned."""
    grads, moments = trainable * bytes_per, 2 * trainable * bytes_per
    stage = zero_stage or 0
    if stage >= 1:
        moments //= world
    if stage >= 2:
        grads //= world
    return grads + moments


@dataclasses.dataclass
class Plan:
    grad_cache: bool
    chunk_size: int
    need: int  # bytes the step adds (the chosen mode)
    plain_need: int  # … in plain mode
    budget: Budget
    reason: str
    cost: StepCost | None = None

    @property
    def peak(self) -> int:
        return self.budget.held + self.need

    def line(self) -> str:
        mode = f"GradCache, chunk {self.chunk_size}" if self.grad_cache else "plain steps"
        return (f"one step needs ~{fmt(self.budget.held + self.plain_need)}, {fmt(self.budget.total)} available "
                f"({self.budget.source}): {mode}, peak ~{fmt(self.peak)} ({self.reason})")

    def record(self) -> dict:
        return {"grad_cache": self.grad_cache, "chunk_size": self.chunk_size, "peak_bytes": self.peak,
                "plain_peak_bytes": self.budget.held + self.plain_need, "available_bytes": self.budget.total,
                "held_bytes": self.budget.held, "source": self.budget.source, "reason": self.reason,
                **({"state_bytes": self.cost.state, "per_query_bytes": self.cost.per_query,
                    "per_passage_bytes": self.cost.per_passage, "teacher_bytes": self.cost.teacher} if self.cost else {})}


def plan_step(cost: StepCost, *, mode: str, chunk_size: int, budget: Budget, batch_size: int, group_size: int) -> Plan:
    """auto: plain if it fits within MARGIN of what is free, else GradCache with the largest chunk up to
    ``chunk_size`` that fits; on: GradCache the same way even when plain would fit; off: plain.
    A forced mode that does not fit, or nothing that fits, raises DoesNotFit."""
    room = budget.usable
    plain = cost.plain()
    most = max(cost.queries, cost.passages)
    fits = lambda need: need <= room  # noqa: E731

    def largest_chunk(limit: int) -> int:
        lo, hi = 0, max(1, min(limit, most))
        while lo < hi:  # cost.cached grows with the chunk: binary search for the largest that fits
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(cost.cached(mid)) else (lo, mid - 1)
        return lo

    if mode == "off":
        if fits(plain):
            return Plan(False, chunk_size, plain, plain, budget, "--grad-cache off", cost)
        raise DoesNotFit(_nothing_fits(cost, budget, room, batch_size, group_size, forced="off"))
    if mode == "auto" and fits(plain):
        return Plan(False, chunk_size, plain, plain, budget, "fits with a margin", cost)
    chunk = largest_chunk(chunk_size)
    if chunk >= 1:
        why = "--grad-cache on" if mode == "on" else "plain steps would not fit; same loss and gradient"
        return Plan(True, chunk, cost.cached(chunk), plain, budget, why, cost)
    raise DoesNotFit(_nothing_fits(cost, budget, room, batch_size, group_size))


def _nothing_fits(cost: StepCost, budget: Budget, room: int, batch_size: int, group_size: int, forced: str | None = None) -> str:
    head = (f"one training step needs ~{fmt(budget.held + cost.plain())} but {fmt(budget.held + room)} is usable "
            f"({budget.source}, {fmt(budget.held)} already held by the model)")
    if forced == "off" and cost.cached(1) <= room:
        return head + "; drop --grad-cache off (GradCache fits: same loss and gradient)"
    if cost.state + cost.embeddings > room:
        return head + "; even the gradients and optimizer state do not fit: use --lora-r 16, --zero-stage 3 on more processes, or a smaller model"
    per_text = max(cost.per_query, cost.per_passage)
    return head + (f"; even GradCache with --chunk-size 1 needs ~{fmt(budget.held + cost.cached(1))}: lower --passage-max-len "
                   f"/ --query-max-len, or add --gradient-checkpointing (one text at the max length keeps ~{fmt(per_text * CACHED_FACTOR)})")


# ---------------------------------------------------------------- inference batches


def encode_batch(per_text: int, requested: int, budget: Budget, fixed: int = 0) -> int:
    """The largest inference batch up to ``requested`` whose activations (plus ``fixed`` bytes, e.g. weights not
    yet paged in) fit within MARGIN of what is free (at least 1: a smaller batch cannot fix a single text)."""
    room = budget.usable - fixed
    if per_text <= 0:
        return requested
    return max(1, min(requested, room // per_text))


def agree(budget: Budget, device: str) -> Budget:
    """Under several processes every rank must make the same plan (GradCache's extra backwards are collective
    under ZeRO): all take the smallest free memory and the largest held."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return budget
    free = torch.tensor([budget.free], dtype=torch.int64, device=device)
    held = torch.tensor([budget.held], dtype=torch.int64, device=device)
    dist.all_reduce(free, op=dist.ReduceOp.MIN)
    dist.all_reduce(held, op=dist.ReduceOp.MAX)
    return dataclasses.replace(budget, free=int(free.item()), held=int(held.item()))


# ---------------------------------------------------------------- shapes


def within_positions(model_config, length: int) -> int:
    """``length`` tokens capped by the model's position table (a longer input crashes it); as is without one."""
    return min(length, getattr(model_config, "max_position_embeddings", length) or length)


def max_length_batch(enc, kind: str, rows: int, device) -> dict:
    """``rows`` texts of exactly the max length of ``kind`` (capped by the position table): the worst case."""
    import torch

    width = within_positions(enc.model.config, enc.config.max_len(kind))
    special = set(enc.tokenizer.all_special_ids)
    token = next(i for i in range(1000, 10**6) if i not in special)
    ids = torch.full((rows, width), token, dtype=torch.long)
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}


def _shape(config) -> tuple[int, int, int, int]:
    """(layers, hidden, intermediate, heads) of a transformer config (BERT, Llama, … naming)."""
    get = lambda *names, default=0: next((getattr(config, n) for n in names if getattr(config, n, None)), default)  # noqa: E731
    hidden = get("hidden_size", "d_model", "n_embd", default=768)
    return (get("num_hidden_layers", "n_layer", "num_layers", default=12), hidden,
            get("intermediate_size", "ffn_dim", "n_inner", default=4 * hidden), get("num_attention_heads", "n_head", default=12))


def checkpoint_boundaries(config, length: int, bytes_per: int = 4) -> int:
    """Per text under gradient checkpointing: the hidden states kept at each layer boundary (autograd's hooks
    do not see them, the checkpoints hold them)."""
    layers, hidden, _, _ = _shape(config)
    return layers * length * hidden * bytes_per


def inference_per_text(config, length: int, bytes_per: int = 4) -> int:
    """Working memory of one text in a no-grad forward: one layer's temporaries (projections, MLP, attention
    scores when the kernel materializes them) and the hidden states in and out."""
    _, hidden, inter, heads = _shape(config)
    return int(INFERENCE_FACTOR * (length * (8 * hidden + 3 * inter) * bytes_per + 2 * heads * length * length * bytes_per))


def generation_per_row(config, width: int, new_tokens: int, logits_kept: int = 1, bytes_per: int = 4) -> int:
    """One prompt row of generation: its KV cache at full length, the prefill's working memory, and the logits."""
    layers, hidden, _, heads = _shape(config)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // max(1, heads)
    kv = 2 * layers * kv_heads * head_dim * (width + new_tokens) * bytes_per
    vocab = getattr(config, "vocab_size", 32000)
    return kv + inference_per_text(config, width, bytes_per) + 2 * vocab * max(1, logits_kept) * 4


_warned: set = set()


def fit_batch(per_row: int, requested: int, device: str = "cpu", what: str = "batch", fixed: int = 0) -> int:
    """The largest batch up to ``requested`` whose rows fit in what is usable now (at least 1); logs a smaller one."""
    budget = available(device)
    n = encode_batch(per_row, requested, budget, fixed)
    if n < requested and (what, n) not in _warned:
        _warned.add((what, n))
        log.warning("%s: %d rows of ~%s would not fit in %s usable (%s): batches of %d", what, requested, fmt(per_row),
                    fmt(budget.usable), budget.source, n)
    return n
