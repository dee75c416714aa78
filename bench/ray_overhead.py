"""What `index --ray` costs on one machine: the same SciFact slice indexed by the plain process and by one Ray
worker on a one-node cluster started by the command (`--ray local --workers 1`), both as a user runs them (child
processes, imports, model load and, for Ray, the cluster's start included), and whether the vectors agree.

The Ray worker gets every core (`--worker-cpus`) or the GPU (`--worker-gpus 1` with `--device cuda`), so the two
runs encode with the same resources; the difference is Ray's start-up and the shipping of the chunks.

    python bench/ray_overhead.py --docs 60 --model /tmp/tiny                  # a smoke run
    flock /tmp/retrctl-bench.lock python bench/ray_overhead.py                # 500 SciFact docs, MiniLM, CPU
    python bench/ray_overhead.py --device cuda --docs 5183                    # a lent GPU: 1-GPU overhead
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from _run import DATA, machine, run_measured  # also puts the checkout on sys.path

from retrctl import records
from retrctl.indexes import open_index


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=500, help="SciFact docs, in corpus order")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--checkpoint-every", type=int, default=128, help="docs per unit sent to the worker")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="ray-overhead-") as tmp:
        tmp = Path(tmp)
        corpus = tmp / "corpus.jsonl"
        docs = [d for _, d in zip(range(args.docs), records.read(DATA / "scifact", "doc"), strict=False)]
        corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
        common = ["-m", "retrctl", "index", corpus, "--model", args.model, "--batch-size", args.batch_size,
                  "--checkpoint-every", args.checkpoint_every, "-q"]
        worker = ["--worker-gpus", "1"] if args.device == "cuda" else ["--worker-cpus", str(os.cpu_count() or 1)]
        plain = run_measured([sys.executable, *common, "--device", args.device, "-o", tmp / "plain"], what="plain index")
        ray = run_measured([sys.executable, *common, "-o", tmp / "ray", "--ray", "local", "--workers", "1", *worker],
                           what="index --ray")
        a, b = open_index(tmp / "plain", device="cpu"), open_index(tmp / "ray", device="cpu")
        assert a.docids == b.docids, "the two indexes hold different docs"
        va, vb = a.vectors(), b.vectors()
        cos = float(np.min(np.sum(va * vb, axis=1) / (np.linalg.norm(va, axis=1) * np.linalg.norm(vb, axis=1))))
    print(f"| {args.model} | {len(docs)} docs | {args.device} | plain {plain.seconds:.1f} s | --ray local, 1 worker "
          f"{ray.seconds:.1f} s | overhead {ray.seconds - plain.seconds:+.1f} s ({ray.seconds / plain.seconds:.2f}×) | "
          f"vectors equal: {np.array_equal(va, vb)}, max |Δ| {float(np.abs(va - vb).max()):.2e}, min cos {cos:.6f} |")
    print(f"measured on: {machine(args.device)}")


if __name__ == "__main__":
    main()
