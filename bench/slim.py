"""Benchmark: EffiR's self-slimming (`retrctl prune --slim-mlp`) on SmolLM2-135M as a bidirectional mean-pooled
retriever, against the unpruned model trained the same number of steps on the same groups.

1. Groups: SciFact train queries, judged positives, BM25-mined negatives (bench/train_quality.py's `train_groups`).
2. `retrctl prune smollm2 --slim-mlp F --groups … --slim-steps S --heal-steps H` (the README command with this
   recipe's batch), and the baseline `retrctl train --model smollm2 --max-steps S+H` with the same batch, lr and
   lengths: both models saw the same number of steps.
3. Non-embedding parameters, encode throughput (inference loads: the slimmed MLPs sliced to their widths; same
   docs, interleaved rounds, one process) and SciFact test nDCG@10 on an N-doc sub-corpus (bench/_run.py's
   `subcorpus`), for: unpruned, unpruned trained, slimmed (trained by its own phases).

    flock /work/bench.lock .venv/bin/python bench/slim.py                       # 50 %, 10 + 10 steps of 8 groups
    flock /work/bench.lock .venv/bin/python bench/slim.py --keep 0.3 --slim-steps 20 --heal-steps 20

Markdown table on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _run import DATA, encode_and_search, ndcg, retrctl, subcorpus
from prune import throughput
from train_quality import train_groups

from retrctl import records
from retrctl.models import Encoder
from retrctl.prune import surgery


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--work", default="/work/bench-work/slim")
    ap.add_argument("--keep", type=float, default=0.5)
    ap.add_argument("--slim-steps", type=int, default=10)
    ap.add_argument("--heal-steps", type=int, default=10)
    a = recipe_args(ap).parse_args()
    work, groups, enc = setup(a)
    slim, base = work / f"slim-{a.keep}", work / "trained"
    t_slim, *_ = retrctl("prune", a.model, "--slim-mlp", a.keep, "--groups", groups, "--corpus", DATA / "scifact",
                         "--slim-steps", a.slim_steps, "--heal-steps", a.heal_steps, "--train-batch-size", a.batch_size,
                         "--train-group-size", a.group_size, "--lr", a.lr, *enc, "-o", slim, capture_stderr=False)
    t_base, *_ = retrctl("train", groups, "--corpus", DATA / "scifact", "--model", a.model, *enc, "--max-steps",
                         a.slim_steps + a.heal_steps, "--train-batch-size", a.batch_size, "--train-group-size", a.group_size,
                         "--lr", a.lr, "--overwrite", "-o", base, capture_stderr=False)
    report = json.loads((slim / "prune.json").read_text())
    caps = {"passage_max_len": a.max_length, "query_max_len": 64}
    models = {"unpruned": Encoder.load(a.model, device="cpu", pooling="mean", bidirectional=True, **caps),
              f"unpruned, trained {a.slim_steps + a.heal_steps} steps": Encoder.load(base, device="cpu", inference=True),
              f"self-slim {a.keep:.0%} ({a.slim_steps} gate + {a.heal_steps} heal steps)": Encoder.load(slim, device="cpu", inference=True)}
    w = report["slimming"]["widths"]
    print(f"## Self-slimming {a.model}: `retrctl prune --slim-mlp {a.keep}` ({time.strftime('%Y-%m-%d')})\n")
    print(f"`python bench/slim.py {' '.join(sys.argv[1:])}`: prune {t_slim / 60:.1f} min, baseline training "
          f"{t_base / 60:.1f} min; {a.batch_size} groups × {a.group_size} per step, lr {a.lr}, {a.max_length} tokens; "
          f"kept MLP widths {min(w)}–{max(w)} of {report['slimming']['full_width']} (per block: {w}).", end=" ")
    compare(models, a)


def recipe_args(ap):
    """The training recipe, the groups and the measurements shared by the prune benchmarks."""
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
    return ap


def setup(a) -> tuple[Path, Path, list]:
    """(the work dir, the SciFact train groups, the encoder flags every command gets)."""
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    enc = ["--bidirectional", "--pooling", "mean", "--passage-max-len", a.max_length, "--query-max-len", 64]
    return work, train_groups(a, work), enc


def compare(models: dict, a) -> None:
    """Non-embedding params, encode speed (interleaved rounds, one process) and nDCG@10 on a sub-corpus of each
    model, the first being the reference; a markdown table on stdout."""
    params = {k: surgery.non_embedding_params(e.model) for k, e in models.items()}
    texts = [records.passage_text(d) for d in list(records.read(DATA / "scifact", "doc"))[: a.docs]]
    speed = throughput(models, texts, a.rounds, 16)
    docs, queries, qrels = subcorpus(a.ndcg_docs, a.ndcg_queries)
    first = next(iter(models))
    print(f"nDCG@10 on {len(docs)} SciFact docs, {len(queries)} test queries; speed: {a.docs} docs, median of "
          f"{a.rounds} interleaved rounds.\n")
    print("| model | non-embedding params | encode vs unpruned (wall) | vs unpruned (CPU) | nDCG@10 |")
    print("|---|---:|---:|---:|---:|")
    for name, e in models.items():
        score = ndcg(encode_and_search(e, docs, queries, 16), qrels)
        print(f"| {name} | {params[name] / 1e6:.1f}M ({params[name] / params[first]:.0%}) | "
              f"{speed[first][0] / speed[name][0]:.2f}× | {speed[first][1] / speed[name][1]:.2f}× | {score:.4f} |", flush=True)


if __name__ == "__main__":
    main()
