"""``train --ray``: the same ``Trainer`` in N processes that Ray Train places on a cluster, one per worker.

Ray Train's ``TorchTrainer`` starts the workers, sets RANK/LOCAL_RANK/WORLD_SIZE/MASTER_* in each and opens the
torch process group (gloo on CPUs, nccl on GPUs); ``engines.setup_processes`` reads those variables as it does
under ``torchrun``, so each worker runs the loop a ``torchrun --nproc_per_node N`` process runs: the same batches,
the same loss, DeepSpeed ZeRO inside when asked for (``--zero-stage``/``--deepspeed``), rank 0 the one writer of
metrics, checkpoints and the published model (``records.atomic_dir``).

Nothing lost when a worker dies: ``FailureConfig(max_failures=...)`` makes Ray start the whole worker group again,
and every start resumes from retrctl's own newest checkpoint in ``OUTPUT.partial/checkpoints`` (``--save-steps``,
``--save-minutes``; on a real cluster ``-o`` must be a path every node sees). No second checkpoint format: Ray
is told of none, so its own storage (a scratch directory, removed afterwards) holds nothing but its marker. The
driver decides a fresh start once, before the first start (clearing ``OUTPUT.partial`` as ``Trainer.fit`` would);
each start afterwards resumes exactly when a checkpoint is there, which only this run can have written.

Bad input found on a worker (``RecordError``, ``UsageError``: the same on every rank, as every rank reads the same
data and settings) is handed back as a value rather than raised, so Ray does not retry it, and raised here: exit 2
with file:line:field as in one process. Workers' stdout goes to stderr; the driver's Ray log lines too
(``distributed.connect``). ``import ray`` happens only when ``--ray`` is given.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from retrctl import distributed
from retrctl.distributed import RaySettings
from retrctl.errors import RecordError, UsageError
from retrctl.process import stdout_onto_stderr
from retrctl.train.checkpoint import check_output, checkpoints, clear_partial
from retrctl.train.config import TrainConfig

log = logging.getLogger("retrctl.train")

LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")  # what torchrun, deepspeed and mpirun-style launchers set
START_TIMEOUT_VARIABLE = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"  # Ray Train's limit for placing and starting workers


def check_launch(settings: RaySettings, cfg: TrainConfig, groups) -> None:
    """Refuse (UsageError, exit 2) what cannot run on Ray, before any cluster work: a process already started by
    a launcher, groups on stdin (every worker reads the groups), GPUs shared between training processes."""
    launched = [v for v in LAUNCHER_VARIABLES if v in os.environ]
    if launched:
        raise UsageError(f"--ray starts its own {settings.workers} training processes, but this one was started by a "
                         f"launcher ({', '.join(launched)} set): run `retrctl train --ray` from a plain shell, or "
                         "drop --ray under torchrun/deepspeed", flag="--ray")
    if (groups is None and not cfg.teacher) or (isinstance(groups, str) and groups == "-"):
        raise UsageError("--ray: every worker reads the groups, so give GROUPS as a file they can all read, not stdin",
                         flag="--ray")
    if settings.worker_gpus and settings.worker_gpus != int(settings.worker_gpus):
        raise UsageError(f"--worker-gpus {settings.worker_gpus:g}: each training process takes whole GPUs "
                         "(nccl allows one process per GPU)", flag="--worker-gpus")
    if settings.worker_gpus and cfg.device == "cpu":
        raise UsageError("--worker-gpus with --device cpu: drop one of them", flag="--worker-gpus")


def train_on_ray(settings: RaySettings, cfg: TrainConfig, output, work: Callable[[bool], object], *, groups,
                 collective_timeout: float | None = None) -> Path:
    """Run ``work(resume)`` in ``settings.workers`` Ray Train workers and return ``output``.

    ``work`` trains in the calling worker (it is pickled and shipped: a module-level function or a partial of
    one); ``resume`` says whether this start continues from the newest checkpoint. ``cfg`` and ``groups`` (what
    ``work`` trains on: None for a corpus alone) are checked here with the output (the cheap refusals, exit 2
    before the cluster is touched); the data are read on the workers.
    ``collective_timeout``: seconds a process-group operation may wait for the other workers (Ray's 1800 when
    None); ``settings.timeout`` bounds the placing and start of the workers."""
    check_launch(settings, cfg, groups)
    output = Path(output).absolute()
    checked = copy.deepcopy(cfg).settle(teacher=bool(cfg.teacher), groups=groups is not None)
    checked.check(needs_model=True)
    check_output(output, cfg)
    partial = output.with_name(output.name + ".partial")
    started = distributed.connect(settings)
    storage = tempfile.mkdtemp(prefix="retrctl-ray-train-")
    try:
        if not cfg.resume and partial.is_dir():  # a fresh start: what Trainer.fit clears, cleared once for every start
            clear_partial(partial)
        trainer = _trainer(settings, work, partial, storage, collective_timeout)
        log.info("training on %d Ray workers (%g CPU, %g GPU each) at %s; a killed worker restarts the run from the "
                 "newest checkpoint in %s", settings.workers, settings.worker_cpus, settings.worker_gpus,
                 settings.address, partial / "checkpoints")
        with _env_default(START_TIMEOUT_VARIABLE, str(settings.timeout)):
            result = _fit(trainer)
    finally:
        shutil.rmtree(storage, ignore_errors=True)
        if started:
            import ray

            ray.shutdown()
    if result is not None:  # bad input, found by the workers
        raise _rebuilt(result)
    return output


def _trainer(settings: RaySettings, work, partial: Path, storage: str, collective_timeout: float | None):
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    resources = {"CPU": settings.worker_cpus, **({"GPU": settings.worker_gpus} if settings.worker_gpus else {})}
    torch_config = TorchConfig() if collective_timeout is None else TorchConfig(timeout_s=int(max(1, collective_timeout)))
    return TorchTrainer(
        _run_worker,
        train_loop_config={"work": work, "partial": str(partial), "cwd": os.getcwd(),
                           "threads": int(max(1, settings.worker_cpus))},
        scaling_config=ScalingConfig(num_workers=settings.workers, use_gpu=bool(settings.worker_gpus),
                                     resources_per_worker=resources),
        torch_config=torch_config,
        run_config=RunConfig(name=f"retrctl-train-{partial.name}", storage_path=storage,
                             failure_config=FailureConfig(max_failures=distributed.RESTARTS)))


def _fit(trainer):
    """The workers' hand-back (None when training succeeded); a run that failed more often than the restarts allow
    raises one RuntimeError naming the first error."""
    from ray.train import TrainingFailedError

    try:
        return trainer.fit().return_value
    except TrainingFailedError as e:
        first = str(e).strip().splitlines()
        raise RuntimeError(f"Ray: training failed {distributed.RESTARTS + 1} times, giving up "
                           f"({first[0] if first else type(e).__name__}); rerun with --resume to continue from the "
                           "newest checkpoint") from None


@contextlib.contextmanager
def _env_default(name: str, value: str) -> Iterator[None]:
    """``name=value`` in this process's environment for the block, unless the user set it (Ray Train reads it here
    and hands it to its controller)."""
    if name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


# ---------------------------------------------------------------- on each worker


def _run_worker(config: dict):
    """One training process: stdout onto stderr, the driver's working directory (so relative paths mean what they
    meant there), torch's threads to the worker's CPUs, then ``work(resume)``. Returns None, or bad input as a
    plain tuple (``_portable``)."""
    stdout_onto_stderr()  # print() in a worker must never reach the driver's stdout
    if os.path.isdir(config["cwd"]):
        os.chdir(config["cwd"])
    import torch

    torch.set_num_threads(config["threads"])
    resume = bool(checkpoints(Path(config["partial"]) / "checkpoints"))  # written by an earlier start of this run
    try:
        config["work"](resume)
    except (RecordError, UsageError) as e:
        return _portable(e)
    return None


def _portable(e: Exception) -> tuple:
    """An input error as plain values: it crosses the cluster whatever its class's constructor takes."""
    if isinstance(e, RecordError):
        return ("record", e.path, e.line, e.field, e.message)
    return ("usage", str(e), getattr(e, "flag", None))


def _rebuilt(t: tuple) -> Exception:
    if t[0] == "record":
        return RecordError(t[1], t[2], t[3], t[4])
    return UsageError(t[1], flag=t[2])
