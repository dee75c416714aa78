"""Benchmark: Sheared-LLaMA's targeted structured pruning (`retrctl prune --target-shape`) on SmolLM2-135M as a
bidirectional mean-pooled retriever (issue 14), against the unpruned model trained the same way.

1. `retrctl prune smollm2 --target-shape S --objective lm|contrastive --shape-steps N` (lm: next-token loss on
   SciFact corpus passages; contrastive: the groups below), as the README runs it.
2. The same short `retrctl train` recipe (`--heal-steps` steps on SciFact train groups: judged positives,
   BM25-mined negatives, bench/train_quality.py's `train_groups`) on the shaped model and on the unpruned one.
3. Non-embedding parameters, encode throughput (same docs, interleaved rounds, one process) and SciFact test
   nDCG@10 on an N-doc sub-corpus (bench/_run.py's `subcorpus`): unpruned, unpruned trained, shaped right after
   pruning, shaped trained.

    flock /work/bench.lock .venv/bin/python bench/shape.py        # ≈ 50 % of the non-embedding params, lm, 30 + 20 steps

Markdown table on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _run import DATA, retrctl
from slim import compare
from train_quality import train_groups

from retrctl.models import Encoder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--work", default="/work/bench-work/shape")
    ap.add_argument("--target-shape", default="layers=24,hidden=480,heads=6,intermediate=1152")
    ap.add_argument("--objective", default="lm", choices=["lm", "contrastive"])
    ap.add_argument("--shape-steps", type=int, default=30)
    ap.add_argument("--mask-lr", type=float, default=1.0)
    ap.add_argument("--heal-steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--train-queries", type=int, default=None)
    ap.add_argument("--mine-retriever", default="bm25")
    ap.add_argument("--ndcg-docs", type=int, default=500)
    ap.add_argument("--ndcg-queries", type=int, default=100)
    ap.add_argument("--docs", type=int, default=32, help="docs encoded per throughput round")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    groups = train_groups(a, work)
    enc = ["--bidirectional", "--pooling", "mean", "--passage-max-len", a.max_length, "--query-max-len", 64]
    train = ["--batch-size", a.batch_size, "--train-group-size", a.group_size, "--lr", a.lr, "--overwrite"]
    shaped, healed, base = work / f"shaped-{a.objective}", work / f"shaped-{a.objective}-trained", work / "trained"
    data = (["--calibration", DATA / "scifact" / "corpus.jsonl"] if a.objective == "lm"
            else ["--groups", groups, "--corpus", DATA / "scifact", "--train-group-size", a.group_size])
    t_shape, *_ = retrctl("prune", a.model, "--target-shape", a.target_shape, "--objective", a.objective, *data,
                          "--shape-steps", a.shape_steps, "--mask-lr", a.mask_lr, "--train-batch-size", a.batch_size,
                          "--lr", a.lr, "--max-length", a.max_length, *enc, "-o", shaped, capture_stderr=False)
    t_heal, *_ = retrctl("train", groups, "--corpus", DATA / "scifact", "--model", shaped, "--max-steps", a.heal_steps,
                         *train, "-o", healed, capture_stderr=False)
    t_base, *_ = retrctl("train", groups, "--corpus", DATA / "scifact", "--model", a.model, *enc, "--max-steps",
                         a.heal_steps, *train, "-o", base, capture_stderr=False)
    shape = json.loads((shaped / "prune.json").read_text())["shape"]
    caps = {"passage_max_len": a.max_length, "query_max_len": 64}
    models = {"unpruned": Encoder.load(a.model, device="cpu", pooling="mean", bidirectional=True, **caps),
              f"unpruned, trained {a.heal_steps} steps": Encoder.load(base, device="cpu", inference=True),
              "shaped, right after pruning": Encoder.load(shaped, device="cpu", inference=True),
              f"shaped, trained {a.heal_steps} steps": Encoder.load(healed, device="cpu", inference=True)}
    print(f"## Target shape {a.model}: `retrctl prune --target-shape {a.target_shape} --objective {a.objective}` "
          f"({time.strftime('%Y-%m-%d')})\n")
    lm = shape["metrics"]
    lm_text = f"; LM loss on the first batch {lm['lm_loss_unpruned']} unpruned → {lm['lm_loss_pruned']} pruned" if "lm_loss_pruned" in lm else ""
    sparsity = ", ".join(f"{k} {v['expected_sparsity']} (target {v['target_sparsity']})" for k, v in shape["masks"].items())
    print(f"`python bench/shape.py {' '.join(sys.argv[1:])}`: prune {t_shape / 60:.1f} min ({a.shape_steps} mask steps"
          f"{lm_text}; expected sparsity at the end {sparsity}), "
          f"training {t_heal / 60:.1f} min shaped / {t_base / 60:.1f} min unpruned; {a.batch_size} groups × {a.group_size} per step, "
          f"lr {a.lr}, {a.max_length} tokens; kept blocks {shape['kept_layers']}.", end=" ")
    compare(models, a)


if __name__ == "__main__":
    main()
