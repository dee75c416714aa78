"""prune's work directory: what an interrupted run leaves for ``--resume`` to continue from.

A prune writes into ``<output>.partial`` (``records.atomic_dir(resume=True)``), renamed to ``-o`` when it has
finished. Inside it, ``.prune/`` holds each phase's state: the importance scores, each training phase's
``Trainer`` output and checkpoints (self-slimming's gates and healing, the contrastive target-shape masks), the
target-shape LM loop's checkpoint, and ``prune-state.json``, the settings of the run. ``--resume`` continues
only a run with the same settings (the same model, flags and data); without it an earlier run's leftovers (ours
only) are removed first. ``.prune/`` is removed before the output is moved into place.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from retrctl import records

log = logging.getLogger("retrctl.prune")
STATE = "prune-state.json"
WORK = ".prune"


def partial_dir(output) -> Path:
    out = Path(output)
    return out.with_name(out.name + ".partial")


def prepare(output, settings: dict, resume: bool) -> None:
    """Before ``atomic_dir``: refuse a ``.partial`` that is not ours, a resume of other settings; clear ours
    when not resuming."""
    partial = partial_dir(output)
    if not partial.exists():
        return
    state = partial / WORK / STATE
    if not partial.is_dir() or (any(partial.iterdir()) and not state.is_file()):
        raise records.RecordError(partial, message="is in the way of prune's work directory and was not written by "
                                                   "retrctl prune: move it away or choose another -o")
    if resume and state.is_file():
        saved = json.loads(state.read_text())
        differ = sorted(k for k in set(saved) | set(settings) if saved.get(k) != settings.get(k))
        if differ:
            raise records.RecordError(state, message=f"--resume: this run differs from the interrupted one in "
                                                      f"{', '.join(differ)}; rerun it as it was, or drop --resume to start over")
        log.info("--resume: continuing the run in %s", partial)
        return
    shutil.rmtree(partial)


def open_work(directory, settings: dict) -> Path:
    """``.prune/`` inside the output's work dir, with the run's settings recorded."""
    work = Path(directory) / WORK
    work.mkdir(parents=True, exist_ok=True)
    if not (work / STATE).is_file():
        (work / STATE).write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    return work


def finished(model_dir) -> bool:
    """A training phase whose Trainer has moved its model into place (it is not trained again on --resume)."""
    return (Path(model_dir) / "metrics.jsonl").is_file() and (Path(model_dir) / "retrctl.json").is_file()


def last_metrics(model_dir) -> dict:
    """The last step's metrics of a finished training phase."""
    lines = (Path(model_dir) / "metrics.jsonl").read_text().splitlines()
    return json.loads(lines[-1]) if lines else {}


def close_work(directory) -> None:
    shutil.rmtree(Path(directory) / WORK, ignore_errors=True)
