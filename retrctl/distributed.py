"""Ray as an execution layer under the checkpointed work loops (dense encoding, the LLM stages' batch loop).

The retrctl process stays the driver and does what only it should do: reading and validating input, hashing,
filters, the faiss build, the one writer of checkpoints and outputs. It hands each expensive unit (a chunk of texts
to encode, a batch of prompts) to a ``WorkerPool``: N Ray actors, each holding the model once (its ``target``,
shipped to the cluster once with ``ray.put``). A unit is a method call on the target (``pool.call("encode",
texts, ...)``); ``RemoteProxy`` makes those calls look local, so the loops run the same code with or without Ray
and get the same batches, hence the same output.

- ``pool.ordered(fn, items)`` runs ``fn(item)`` for up to ``2 × workers`` items at once in driver threads and
  yields the results in submission order. Driver code is serialised by one lock, released only while a thread
  waits for its unit: counters and checkpoint appends need no locking of their own, and input is read by the
  consuming thread only, so a bad record raises where it is read (exit 2, file:line:field).
- A killed actor is restarted by Ray and its unit run again (``max_restarts``/``max_task_retries``); the driver
  keeps one writer, so a rerun unit duplicates nothing. A unit's own exception comes back as itself.
- No progress for ``timeout`` seconds (no unit finished, e.g. a hung node or no resources to place the actors)
  fails with one line instead of waiting for ever.
- A target that is a torch module (an encoder) travels on the CPU and moves to the worker's GPU when the worker
  has one (``--worker-gpus``), so the driver needs no GPU; the stages load their copy on the CPU under ``--ray``.
- Workers' stdout goes to their stderr (the driver's stdout carries data) and each worker takes its share of its
  node's memory for the memory planner (``RETRCTL_LOCAL_WORKERS``, retrctl/memory.py).

``import ray`` happens only here, and only when ``--ray`` is given (``pip install 'retrctl[ray]'``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

from retrctl.errors import UsageError
from retrctl.process import stdout_onto_stderr

log = logging.getLogger("retrctl.ray")

INSTALL_HINT = "pip install 'retrctl[ray]'"
RESTARTS = 3  # restarts of one actor (and reruns of its unit) before the job fails
POLL_SECONDS = 1.0  # how often a waiting thread checks the no-progress clock
TIMEOUT = 600.0  # default no-progress limit, seconds
# cluster log lines not passed on (``shown``). Ray Train's placement-group cleaner asks the state API, which needs the
# dashboard (not started here), about once a second for the whole run, and says each time that it cannot (LOG_NOISE,
# by its text, whichever process says it); once the run's controller is gone it ends its monitor thread with
# ray.actor.exit_actor(), which that thread prints as a traceback (Ray 2.60) when it gets there before the cluster
# shuts down, after the run's outcome (a bad input's one line, say) has been reported (QUIET_ACTORS: by the actor)
LOG_NOISE = ("Failed to query Ray Train Controller actor state",)
QUIET_ACTORS = ("PlacementGroupCleaner",)


@dataclass(frozen=True)
class RaySettings:
    """Where and how wide: ``address`` auto (a running cluster: RAY_ADDRESS or this node's), local (a new
    one-node cluster in this process), HOST:PORT or ray://HOST:PORT; ``workers`` actors of ``worker_cpus`` CPUs
    and ``worker_gpus`` GPUs each; ``timeout`` seconds without a finished unit before the job fails."""

    address: str
    workers: int = 1
    worker_cpus: float = 1.0
    worker_gpus: float = 0.0
    timeout: float = TIMEOUT


def pop_settings(opts: dict) -> RaySettings | None:
    """Pop the shared Ray flags (``--ray``, ``--workers``, ``--worker-cpus``, ``--worker-gpus``,
    ``--ray-timeout``) from a command's options: the settings, or None without ``--ray``. Ray missing or an
    address nothing answers on is a usage error here, before any input is read or model loaded."""
    address = opts.pop("ray", None)
    given = {k: opts.pop(k, None) for k in ("workers", "worker_cpus", "worker_gpus", "ray_timeout")}
    if address is None:
        if any(v is not None for v in given.values()):
            raise UsageError("--workers, --worker-cpus, --worker-gpus and --ray-timeout need --ray auto|local|HOST:PORT")
        return None
    _import_ray()
    if address not in ("auto", "local"):
        _reachable(address)
    return RaySettings(address, workers=given["workers"] or 1, worker_cpus=given["worker_cpus"] or 1.0,
                       worker_gpus=given["worker_gpus"] or 0.0, timeout=given["ray_timeout"] or TIMEOUT)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise UsageError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}", flag="--ray") from None
    return ray


def _reachable(address: str, seconds: float = 5.0) -> None:
    """A HOST:PORT that nothing answers on fails at once (ray.init would retry for a minute)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--ray must be auto, local, HOST:PORT or ray://HOST:PORT, got {address!r}", flag="--ray")
    try:
        socket.create_connection((host, int(port)), timeout=seconds).close()
    except OSError as e:
        raise UsageError(f"no Ray cluster answers at {address} ({e.strerror or e}): start one there with `ray start "
                         f"--head --port {port}`, or give the head's address", flag="--ray") from None


def connect(settings: RaySettings) -> bool:
    """Join (or start) the cluster ``settings.address`` names; True when this call started Ray in this process
    (the caller shuts it down). A process where Ray is already initialised (a test's cluster) keeps it."""
    ray = _import_ray()
    address = settings.address
    if address not in ("auto", "local"):
        _reachable(address)
    if ray.is_initialized():
        _logs_to_stderr()
        return False
    kw = {"log_to_driver": True, "include_dashboard": False, "logging_level": logging.WARNING}
    if address == "local":
        # more logical CPUs than cores: actors that took every slot would leave none for Ray's own tasks (ray#44687)
        need = int(settings.workers * max(settings.worker_cpus, 1)) + 1
        ray.init(num_cpus=max(need, os.cpu_count() or 1), **kw)
        _logs_to_stderr()
        return True
    try:
        ray.init(address=address, **kw)
        _logs_to_stderr()
    except ConnectionError as e:
        raise UsageError(f"cannot join the Ray cluster at {address}: {str(e).splitlines()[0]} (start one with `ray start "
                         "--head`, or use --ray local; a cluster with token authentication needs its RAY_AUTH_TOKEN)",
                         flag="--ray") from None
    return True


def _logs_to_stderr() -> None:
    """Ray prints the cluster's log lines (its raylet's, a worker's stdout) on this process's stdout, which carries
    data here: send them all to stderr, but those ``shown`` drops, by replacing the handler ray.init registered (a
    private hook, so a Ray without it keeps its own)."""
    try:
        from ray._private import worker
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return
    name = "ray_print_logs"

    def forward(data):
        lines = shown(data)
        if lines:
            worker.print_to_stdstream({**data, "lines": lines, "is_err": True}, ignore_prefix=False)

    if any(pair[0] == name for pair in getattr(dispatcher, "handlers", ())):
        dispatcher.remove_handler(name)
        dispatcher.add_handler(name, forward)


def shown(data: dict) -> list[str]:
    """The lines of one batch of a cluster process's log (Ray's ``{"lines", "actor_name", "pid", …}``) that reach
    stderr: none of a ``QUIET_ACTORS`` actor's, none holding ``LOG_NOISE``."""
    if data.get("actor_name") in QUIET_ACTORS:
        return []
    return [ln for ln in data.get("lines", ()) if not any(noise in ln for noise in LOG_NOISE)]


class _Worker:
    """The actor: the target built once from its shipped pickle; ``run`` calls one of its methods."""

    def __init__(self, target, threads: int, share: int):
        stdout_onto_stderr()  # print() in a worker must never reach the driver's stdout
        os.environ["RETRCTL_LOCAL_WORKERS"] = str(share)
        os.environ["OMP_NUM_THREADS"] = str(max(1, threads))  # torch's threads, when it is imported later
        if "torch" in sys.modules:  # the target's unpickling imported it already
            torch = sys.modules["torch"]
            torch.set_num_threads(max(1, threads))
            import ray

            if ray.get_gpu_ids() and isinstance(target, torch.nn.Module):  # shipped from the driver's CPU
                target.to("cuda")
        self.target = target

    def run(self, method: str, args: tuple, kwargs: dict):
        """(True, result), or (False, the exception): the driver re-raises a unit's own error as itself."""
        try:
            return True, getattr(self.target, method)(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - handed back to the driver, which raises it
            return False, e

    def pid(self) -> int:
        return os.getpid()


class WorkerPool:
    """N actors holding ``target``; see the module docstring. A context manager: leaving it kills the actors (and
    the Ray instance it started)."""

    def __init__(self, settings: RaySettings, target, what: str = "work"):
        self.settings, self.what = settings, what
        self._started = connect(settings)
        ray = self._ray = _import_ray()
        share = _node_share(ray, settings)
        cls = ray.remote(_Worker).options(num_cpus=settings.worker_cpus, num_gpus=settings.worker_gpus,
                                          max_restarts=RESTARTS, max_task_retries=RESTARTS)
        # serialised once, whatever the number of actors; held here so a restarted actor can rebuild from it
        ref = self._target = ray.put(target)
        self.actors = [cls.remote(ref, int(max(settings.worker_cpus, 1)), share) for _ in range(settings.workers)]
        self._free: queue.Queue = queue.Queue()
        for actor in self.actors:
            self._free.put(actor)
        self._driver = threading.Lock()
        self._holds = threading.local()
        self._last_progress = time.monotonic()
        log.info("%s on %d Ray workers (%g CPU, %g GPU each) at %s", what, settings.workers, settings.worker_cpus,
                 settings.worker_gpus, settings.address)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for actor in self.actors:
            self._ray.kill(actor, no_restart=True)
        self.actors = []
        if self._started:
            self._ray.shutdown()

    # ------------------------------------------------------------ one unit

    def call(self, method: str, *args, **kwargs):
        """``target.method(*args, **kwargs)`` on a free worker; the driver lock is let go while it runs."""
        held = getattr(self._holds, "value", False)
        if held:
            self._release()
        try:
            actor = self._free.get()
            try:
                ok, value = self._wait(actor.run.remote(method, args, kwargs))
            finally:
                self._free.put(actor)
        finally:
            if held:
                self._acquire()
        if not ok:
            raise value
        return value

    def _wait(self, ref):
        ray = self._ray
        while True:
            done, _ = ray.wait([ref], timeout=POLL_SECONDS)
            if done:
                break
            idle = time.monotonic() - self._last_progress
            if idle > self.settings.timeout:
                raise RuntimeError(f"Ray: no {self.what} unit finished in {idle:.0f}s (a hung node, or no room to "
                                   f"place {self.settings.workers} workers of {self.settings.worker_cpus:g} CPU, "
                                   f"{self.settings.worker_gpus:g} GPU); raise --ray-timeout if units are this slow")
        try:
            value = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(f"Ray: a {self.what} worker died {RESTARTS + 1} times; giving up ({str(e).splitlines()[0]})") from None
        self._last_progress = time.monotonic()
        return value

    def _acquire(self) -> None:
        self._driver.acquire()
        self._holds.value = True

    def _release(self) -> None:
        self._holds.value = False
        self._driver.release()

    # ------------------------------------------------------------ many units, in order

    def ordered(self, fn: Callable, items: Iterable) -> Iterator:
        """``fn(item)`` for each item, run in driver threads with up to twice as many in flight as workers,
        yielded in submission order. Items are drawn, and the results consumed, under the driver lock."""
        in_flight: list = []
        limit = 2 * len(self.actors)

        def run(item):
            self._acquire()
            try:
                return fn(item)
            finally:
                self._release()

        self._acquire()
        try:
            for item in items:
                in_flight.append(_in_thread(run, item))
                if len(in_flight) >= limit:
                    yield self._next(in_flight)
            while in_flight:
                yield self._next(in_flight)
        finally:
            if getattr(self._holds, "value", False):
                self._release()

    def _next(self, in_flight: list):
        self._release()
        try:
            future = in_flight.pop(0)
            exc = future.exception()
        finally:
            self._acquire()
        if exc is not None:
            raise exc
        return future.result()


def _in_thread(fn: Callable, item) -> Future:
    """``fn(item)`` in a daemon thread: a unit still waiting on the cluster when the job fails never holds up the
    process's exit."""
    future: Future = Future()
    future.set_running_or_notify_cancel()

    def run():
        try:
            future.set_result(fn(item))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            future.set_exception(e)

    threading.Thread(target=run, name="retrctl-ray", daemon=True).start()
    return future


def _node_share(ray, settings: RaySettings) -> int:
    """How many workers may land on one node: the memory planner's share of a node (at most ``workers``)."""
    fits = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        res = node.get("Resources", {})
        n = res.get("CPU", 0) // max(settings.worker_cpus, 1e-9) if settings.worker_cpus else settings.workers
        if settings.worker_gpus:
            n = min(n, res.get("GPU", 0) // settings.worker_gpus)
        fits.append(int(n))
    return max(1, min(settings.workers, max(fits, default=settings.workers)))


class RemoteProxy:
    """A local object whose ``methods`` run on the pool's workers (each holding a copy of that object); every
    other attribute is the local object's. ``RemoteProxy(pool, encoder, ("encode", "encode_heads"))``."""

    def __init__(self, pool: WorkerPool, local, methods: Iterable[str]):
        self._pool, self._local, self._methods = pool, local, frozenset(methods)

    def __getattr__(self, name):
        if name in self._methods:
            return lambda *args, **kwargs: self._pool.call(name, *args, **kwargs)
        return getattr(self._local, name)


def ordered(pool: WorkerPool | None, fn: Callable, items: Iterable) -> Iterator:
    """``fn`` over ``items`` in order: on the pool's workers when there is one, else here, one after another."""
    return pool.ordered(fn, items) if pool is not None else map(fn, items)


@contextlib.contextmanager
def workers(settings: RaySettings | None, target, what: str = "work") -> Iterator[WorkerPool | None]:
    """A ``WorkerPool`` holding ``target`` for the block, or None without settings (the work runs here)."""
    if settings is None:
        yield None
        return
    with WorkerPool(settings, target, what) as pool:
        yield pool
