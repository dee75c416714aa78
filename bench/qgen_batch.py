"""qgen's batch on this machine: the recipe's own qgen call at several --batch-size values, timed, the outputs compared.

    python bench/qgen_batch.py [--batch 8,16,32] [--docs 64] [--only NAME …] [--work DIR]

For each collection (default: the demo corpus and SciFact) runs `retrctl qgen DATA --llm smollm2 --per-doc 1
--seed 1 --shard-id 1 --shard-num 10 --sample DOCS` (the recipe's training-query call) once per batch size, in turn,
each into its own file with no checkpoint to resume from, and prints a table: seconds of the whole command (the
model's load included), the ratio against the first batch size's, and whether the queries written are byte for
byte the first's (qgen draws each row's sampling noise from its own seed, so the batch is a cost setting only).
The commands' own stderr goes to stderr. One real-model job at a time: holds /tmp/retrctl-bench.lock."""

from __future__ import annotations

import argparse
import fcntl
import tempfile
from pathlib import Path

from _run import machine, retrctl
from recipe_suite import COLLECTIONS, folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="8,16,32", help="batch sizes, the first the baseline")
    ap.add_argument("--docs", type=int, default=64, help="documents sampled from shard 1 (the demo's shard 1 holds 64)")
    ap.add_argument("--only", action="append", choices=list(COLLECTIONS), help="collections (default: demo, scifact)")
    ap.add_argument("--work", type=Path, help="where the demo corpus is built and the outputs written (default: a temp dir)")
    a = ap.parse_args()
    sizes = [int(b) for b in a.batch.split(",")]
    work = a.work or Path(tempfile.mkdtemp(prefix="qgen-batch-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    with open("/tmp/retrctl-bench.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in a.only or ["demo", "scifact"]:
            data = folder(name, work)
            outs, secs = [], []
            for size in sizes:
                out = work / f"{name}-b{size}.jsonl"
                out.unlink(missing_ok=True)
                ran = retrctl("qgen", data, "--llm", "smollm2", "--per-doc", 1, "--seed", 1, "--shard-id", 1,
                              "--shard-num", 10, "--sample", a.docs, "--batch-size", size, "--candidates-file", "",
                              "-o", out, capture_stderr=False)
                outs.append(out.read_bytes())
                secs.append(ran.seconds)
            for size, s, o in zip(sizes, secs, outs, strict=True):
                rows.append(f"| {name} | {size} | {s:.1f} | {secs[0] / s:.2f}x | {'yes' if o == outs[0] else 'NO'} |")
    print(f"# qgen --batch-size, {a.docs} documents of shard 1, SmolLM2 in process; {machine()}")
    print("| collection | batch | seconds | speed vs first | same queries |")
    print("|---|---:|---:|---:|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
