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


def subcorpus(n_docs: int, n_queries: int):
    """A SciFact test sub-corpus: the first ``n_queries`` judged queries (sorted ids), all their judged docs, then
    other docs in corpus order up to ``n_docs``; returns (docs, {qid: text}, qrels)."""
    from retrctl import records

    data = DATA / "scifact"
    qrels = records.read_qrels(data, "test")
    qids = sorted(qrels)[:n_queries]
    qrels = {q: qrels[q] for q in qids}
    judged = {d for q in qids for d in qrels[q]}
    docs = list(records.read(data, "doc"))
    keep = [d for d in docs if d["docid"] in judged]
    keep += [d for d in docs if d["docid"] not in judged][: max(0, n_docs - len(keep))]
    queries = {q["query_id"]: q["query_text"] for q in records.read(data, "query") if q["query_id"] in qrels}
    return keep, queries, qrels
