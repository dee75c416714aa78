"""What every benchmark shares, written once.

- ``retrctl``: a stage run as a user runs it, `python -m retrctl …` in a child process, offline, timed, failing
  loudly with the tail of the stage's stderr; ``subcorpus``: a SciFact test sub-corpus.
- ``ndcg``: nDCG@10 of a run (in memory, or a TREC file through `retrctl eval`); ``nearest`` and
  ``encode_and_search``: an exact-search run from vectors or from an encoder, without an index.
- ``run_measured``: a child process's seconds and peak RSS; ``peak_bytes``: this process's high-water mark.
- ``machine``: the one line naming the hardware and software a table was measured on.
- ``work_and_collections``: the command line of a benchmark over the collections of ../shared/data (WORK, --only);
  ``recipe_value``: a variable of examples/beir/Makefile as the recipe sets it.

Importing it also puts the checkout on sys.path, for the benchmarks that call the Python API in-process."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("RETRCTL_BENCH_DATA") or ROOT.parent / "shared" / "data")  # the dev collections (elsewhere on a lent device)
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


def work_and_collections(doc: str, collections) -> tuple[Path, list[str]]:
    """WORK (resolved) and the collections --only names, all of ``collections`` without it: the command line of a
    benchmark that runs over the collections of ../shared/data."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work", type=Path)
    ap.add_argument("--only", action="append", choices=list(collections), help="these collections only")
    a = ap.parse_args()
    return a.work.resolve(), a.only or list(collections)


def recipe_value(expr: str, corpus: Path, work: Path | None = None) -> str:
    """``expr`` expanded by examples/beir/Makefile as the recipe sets it for ``corpus`` (and work dir ``work``):
    "$(MODEL)", "--model $(MODEL) $(FULL_FLAGS)" and the like."""
    show = f"show: ; @echo {expr}"
    out = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(ROOT / "examples" / "beir"), f"DATA={corpus}",
                          f"PY={sys.executable}", *([f"W={work}"] if work else []), f"--eval={show}", "show"],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


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


# ---------------------------------------------------------------- scores


def nearest(query_vectors, doc_vectors, qids: list[str], docids: list[str], hits: int = 100) -> dict:
    """Exact inner-product search of every query against every doc: a run {qid: [(docid, score), …]} of the top
    ``hits`` per query (unit vectors: cosine, what a Flat faiss index returns)."""
    import numpy as np

    sims = query_vectors @ doc_vectors.T
    return {q: [(docids[j], float(sims[i, j])) for j in np.argsort(-sims[i])[:hits]] for i, q in enumerate(qids)}


def encode_and_search(encoder, docs: list[dict], queries: dict[str, str], batch_size: int) -> dict:
    """A run from ``encoder`` in this process: docs as passages, ``queries`` ({qid: text}) as queries, then
    ``nearest``; no index is written."""
    from retrctl import records

    doc_vectors = encoder.encode([records.passage_text(d) for d in docs], batch_size=batch_size)
    qids = list(queries)
    query_vectors = encoder.encode([queries[q] for q in qids], kind="query", batch_size=batch_size)
    return nearest(query_vectors, doc_vectors, qids, [d["docid"] for d in docs])


def ndcg(run: dict | Path, qrels) -> float:
    """nDCG@10 of one run, the measure every benchmark table reports.

    ``run`` as a dict ({qid: [(docid, score), …]}) is scored in this process by ``retrctl.metrics`` against
    ``qrels`` ({qid: {docid: grade}}); ``run`` as a TREC file is scored by `retrctl eval RUN --qrels QRELS`, as a
    user scores it (``qrels``: a BEIR folder or a qrels file; the stage's defaults, such as dropping
    self-retrieval on ArguAna, apply)."""
    if isinstance(run, dict):
        from retrctl import metrics

        return metrics.evaluate(run, qrels, ["nDCG@10"]).mean["nDCG@10"]
    _, out, _ = retrctl("eval", run, "--qrels", qrels, "--json", "-m", "nDCG@10", "--quiet")
    return json.loads(out.splitlines()[-1])["nDCG@10"]


# ---------------------------------------------------------------- memory and the machine


class Measured(NamedTuple):
    seconds: float
    peak_bytes: int  # the child's peak resident set (wait4's ru_maxrss, what `/usr/bin/time -v` reports)
    stdout: str
    stderr: str


def run_measured(argv: list, *, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd: Path | None = None,
                 env: dict | None = None, what: str | None = None) -> Measured:
    """Run ``argv`` as a child process and measure it: wall seconds and the peak RSS of that child only (not of
    this process nor of other children). ``stdout``/``stderr`` as for ``subprocess``: ``PIPE`` captures (into a
    temporary file, so a chatty child never blocks on a full pipe), None passes the stream through, ``DEVNULL``
    drops it. A failure exits with ``what`` (default: the command) and the tail of the captured stderr."""
    argv = [str(a) for a in argv]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, text=True, cwd=cwd, env=env,
                                stdout=out if stdout == subprocess.PIPE else stdout,
                                stderr=err if stderr == subprocess.PIPE else stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        captured_out, captured_err = out.read(), err.read()
    if code:
        sys.exit(f"failed ({code}): {what or ' '.join(argv)}\n{captured_err[-3000:]}")
    return Measured(seconds, usage.ru_maxrss * 1024, captured_out, captured_err)


def peak_bytes(device: str = "cpu") -> int:
    """This process's memory high-water mark so far: ``torch.cuda.max_memory_allocated`` on a GPU, the peak
    resident set (ru_maxrss) on a CPU. A measurement takes the difference of two readings around the work."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated()
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def machine(device: str = "cpu") -> str:
    """One line naming what a benchmark ran on: the CPU model and cores (or the GPU), the OS, Python, and torch
    with its thread count when torch is installed."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    parts = [f"{cpu}, {os.cpu_count()} cores"]
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and device.startswith("cuda"):
        parts.append(torch.cuda.get_device_name(0))
    parts.append(f"{platform.system()} {platform.release()}, python {platform.python_version()}")
    if torch is not None:
        parts.append(f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    return ", ".join(parts)


def throughput(models: dict, texts: list[str], rounds: int, batch_size: int) -> dict:
    """name -> (median wall seconds, median CPU seconds of this process) to encode ``texts`` ``rounds`` times,
    the models interleaved. On a box shared with other jobs the CPU seconds are the steadier ratio."""
    import torch

    times = {k: ([], []) for k in models}
    with torch.inference_mode():
        for e in models.values():  # warm-up: the first batch pays for allocations
            e.encode(texts[:batch_size], batch_size=batch_size)
        for r in range(rounds):
            for name, e in models.items():
                t0, c0 = time.perf_counter(), time.process_time()
                e.encode(texts, batch_size=batch_size)
                times[name][0].append(time.perf_counter() - t0)
                times[name][1].append(time.process_time() - c0)
                print(f"round {r + 1}: {name} wall {times[name][0][-1]:.1f}s cpu {times[name][1][-1]:.1f}s", file=sys.stderr, flush=True)
    return {k: (statistics.median(w), statistics.median(c)) for k, (w, c) in times.items()}
