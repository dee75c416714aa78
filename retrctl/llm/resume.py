"""Resumable LLM work: the append-only checkpoint and the one batch loop qgen and rerank both run.

LLM calls are the expensive part of both stages, so a re-run never repeats one that finished: ``resumable``
feeds items to the stage's work function a batch at a time, appends each finished batch's rows to a
``Checkpoint``, and on a re-run hands back the rows of items the checkpoint already holds instead of calling
the LLM. Items come out in input order whichever of them were resumed, so a resumed run writes what an
uninterrupted one writes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from retrctl import distributed
from retrctl.distributed import WorkerPool
from retrctl.errors import UsageError

log = logging.getLogger("retrctl.llm")


class CheckpointMismatch(UsageError):
    """A checkpoint made with other settings, or no retrctl checkpoint at all: a usage error (exit 2)."""


_HEADER = b'{"checkpoint": '


class Checkpoint:
    """Append-only JSONL of finished work for resumable LLM jobs.

    ``resume(settings)`` returns the rows already done; the file's first line records the settings that produced
    them, and resuming with other settings is refused, so a file never mixes two configurations. A line torn by
    a kill mid-write (only the last line can be: rows are appended whole) is cut off. A file that is not a
    checkpoint, or one damaged before its end, is refused and left as it is: cutting it would destroy a
    user's file given by mistake. ``append(rows)`` writes and flushes."""

    def __init__(self, path):
        self.path = Path(path)
        self.settings: dict | None = None
        self._f = None

    def resume(self, settings: dict) -> list[dict]:
        self.settings = json.loads(json.dumps(settings, default=str))
        if not self.path.exists() or self.path.stat().st_size == 0:
            return []
        rows, good = [], 0
        with open(self.path, "rb") as f:
            for n, line in enumerate(f):
                if not line.endswith(b"\n"):  # killed mid-write: the line may parse, yet the next append would join it
                    if n == 0 and not _HEADER.startswith(line[: len(_HEADER)]):
                        raise CheckpointMismatch(f"{self.path} is not a retrctl checkpoint: delete it or write elsewhere")
                    break
                try:
                    obj = json.loads(line)
                except ValueError:  # JSONDecodeError, UnicodeDecodeError
                    obj = None
                if n == 0 and not (isinstance(obj, dict) and "checkpoint" in obj):
                    raise CheckpointMismatch(f"{self.path} is not a retrctl checkpoint (no header line): delete it or "
                                             "write elsewhere")
                if not isinstance(obj, dict):
                    raise CheckpointMismatch(f"{self.path}:{n + 1}: damaged checkpoint line (not a JSON object): delete "
                                             "the file or write elsewhere")
                if n == 0:
                    old = obj.get("settings")
                    if old != self.settings:
                        diff = sorted(k for k in set(old or {}) | set(self.settings)
                                      if (old or {}).get(k) != self.settings.get(k))
                        raise CheckpointMismatch(f"{self.path} was made with other settings (differ in: "
                                                 f"{', '.join(diff) or 'format'}); delete it or write elsewhere")
                else:
                    rows.append(obj)
                good += len(line)
        if good < self.path.stat().st_size:
            log.warning("%s: dropping a torn last line (interrupted write)", self.path)
            with open(self.path, "r+b") as f:
                f.truncate(good)
        return rows

    def append(self, rows: list[dict]) -> None:
        if self.settings is None:
            raise RuntimeError("call resume(settings) before append")
        if self._f is None:
            fresh = not self.path.exists() or self.path.stat().st_size == 0
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", encoding="utf-8")
            if fresh:
                self._f.write(json.dumps({"checkpoint": 1, "settings": self.settings}) + "\n")  # starts with _HEADER
        for r in rows:
            self._f.write(json.dumps(r, ensure_ascii=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def resumable(items: Iterable, work: Callable[[list], list[dict]], *, key: Callable, batch_size: int,
              checkpoint: Checkpoint | None = None, settings: dict | None = None, owner: Callable | None = None,
              row_id: Callable | None = None, complete: Callable[[list[dict]], bool] | None = None,
              pool: WorkerPool | None = None) -> Iterator[tuple[object, list[dict], bool]]:
    """Yield ``(item, rows, resumed)`` for each item, in input order.

    ``work(batch)`` does the LLM work for up to ``batch_size`` items not yet done and returns their rows (the
    checkpoint's lines); they are appended to ``checkpoint`` (resumed with ``settings``) before anything is
    yielded, so a kill loses at most the batch in flight. ``key(item)`` and ``owner(row)`` (default ``key``) say
    which rows belong to which item; ``row_id(row)`` (default ``owner``) collapses rows written twice (a batch
    redone after a torn line: the last copy wins); ``complete(rows)`` (default: any row) says whether an item's
    checkpointed rows finish it, else it is done again. Resumed items wait behind the batch being filled, so the
    output order never depends on what the checkpoint held (rerank once zipped a resumed run's results with the
    wrong groups). With ``pool`` (retrctl.distributed: the LLM's calls run on Ray workers) several batches are in
    flight at once; their rows are still checkpointed and yielded here, in input order. The checkpoint is closed
    when the loop ends, however it ends."""
    owner = owner or key
    row_id = row_id or owner
    complete = complete or bool
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    done: dict = {}
    for row in checkpoint.resume(settings or {}) if checkpoint is not None else ():
        done.setdefault(owner(row), {})[row_id(row)] = row

    def batches():
        """(the items since the last batch, each with its checkpointed rows or None; the batch to work on)."""
        queue: list[tuple[object, list[dict] | None]] = []
        todo: list = []
        for item in items:
            got = done.get(key(item))
            got = list(got.values()) if got is not None else None
            if got is not None and complete(got):
                if not queue:  # nothing waiting ahead of it
                    yield [(item, got)], []
                else:
                    queue.append((item, got))
                continue
            queue.append((item, None))
            todo.append(item)
            if len(todo) == batch_size:
                yield queue, todo
                queue, todo = [], []
        if queue:
            yield queue, todo

    def run(batch):
        queue, todo = batch
        return queue, (work(list(todo)) if todo else [])

    try:
        for queue, rows in distributed.ordered(pool, run, batches()):
            if checkpoint is not None and rows:
                checkpoint.append(rows)
            fresh: dict = {}
            for r in rows:
                fresh.setdefault(owner(r), []).append(r)
            for item, got in queue:
                yield (item, got, True) if got is not None else (item, fresh.get(key(item), []), False)
    finally:
        if checkpoint is not None:
            checkpoint.close()
