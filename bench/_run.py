"""How every benchmark runs a retrctl stage: as a user does, `python -m retrctl …` in a child process, offline,
timed, failing loudly with the tail of the stage's stderr. Importing it also puts the checkout on sys.path, for
the benchmarks that call the Python API in-process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
for _k, _v in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
    os.environ.setdefault(_k, _v)


class Ran(NamedTuple):
    seconds: float
    stdout: str
    stderr: str  # "" when the stage's stderr went straight to ours


def retrctl(*args, capture_stderr: bool = True, log: bool = True) -> Ran:
    """Run one stage; its stdout is returned, its stderr captured (for counts it reports) or passed through (logs)."""
    argv = [str(a) for a in args]
    if log:
        print("$ retrctl " + " ".join(argv), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "retrctl", *argv], text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE if capture_stderr else None)
    secs = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"failed ({res.returncode}): retrctl {' '.join(argv)}\n{(res.stderr or '')[-3000:]}")
    return Ran(secs, res.stdout, res.stderr or "")
