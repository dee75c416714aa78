"""Benchmark: `retrctl prune` on a BERT-family encoder (all-MiniLM-L6-v2): whole layers dropped by Block Influence,
no healing. Speed and SciFact quality for `--drop-layers` 1..4 against the unpruned model.

1. Prune as a user does, one CLI call per setting:
   `retrctl prune minilm --drop-layers K --calibration scifact -o WORK/minilm-drop-K` (256 calibration passages).
2. Encode throughput of every model in this one process on the same SciFact docs and batch, loaded as retrctl's
   index loads them, rounds interleaved so load changes on the shared box hit every model alike: docs/s (median
   wall and CPU seconds) and the ratio to the unpruned model.
3. SciFact test nDCG@10 with no training after pruning: `retrctl index` / `search` / `eval` on each dir. All of
   SciFact by default; `--eval-docs N` cuts the corpus to every doc judged for a test query plus other docs in
   corpus order up to N (bench/beir_retrieval.py's `slice_dataset`), so every test query keeps its judged docs.

    flock /tmp/retrctl-bench.lock .venv/bin/python bench/prune_encoder.py                   # all of SciFact
    flock /tmp/retrctl-bench.lock .venv/bin/python bench/prune_encoder.py --eval-docs 1000  # a sub-corpus, faster

A Markdown table on stdout; the commands' logs and progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _run import DATA, retrctl, throughput
from beir_retrieval import machine, score, slice_dataset


def say(*a):
    print(*a, file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--drops", default="1,2,3,4", help="--drop-layers settings, comma-separated")
    ap.add_argument("--data", type=Path, default=DATA / "scifact")
    ap.add_argument("--work", type=Path, default=Path("/tmp/prune-encoder"))
    ap.add_argument("--eval-docs", type=int, default=0, help="cut the corpus for nDCG@10 (0: all of it)")
    ap.add_argument("--speed-docs", type=int, default=512, help="docs encoded per throughput round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()

    import torch

    from retrctl import records
    from retrctl.models import Encoder

    args.work.mkdir(parents=True, exist_ok=True)
    drops = [int(k) for k in args.drops.split(",")]
    dirs = {0: args.model}
    for k in drops:
        out = args.work / f"{Path(str(args.model)).name}-drop-{k}"
        retrctl("prune", args.model, "--drop-layers", k, "--calibration", args.data, "-o", out)
        dirs[k] = out
    reports = {k: json.loads((d / "prune.json").read_text()) for k, d in dirs.items() if k}

    models = {k: Encoder.load(d, device="cpu", inference=True) for k, d in dirs.items()}
    layers = {k: e.model.config.num_hidden_layers for k, e in models.items()}
    cap = models[0].config.passage_max_len
    texts = [records.passage_text(d) for _, d in zip(range(args.speed_docs), records.read(args.data, "doc"), strict=False)]
    speed = throughput(models, texts, args.rounds, args.batch_size)
    del models

    data = slice_dataset(args.data, args.eval_docs, args.work) if args.eval_docs else args.data
    n_docs = sum(1 for _ in records.read(data, "doc"))
    quality = {}
    for k, d in dirs.items():
        idx, run = args.work / f"idx-{k}", args.work / f"run-{k}.trec"
        t_index, *_ = retrctl("index", data, "--model", d, "--batch-size", args.batch_size, "-o", idx, "--quiet", "--rebuild")
        retrctl("search", idx, data, "--hits", 100, "-o", run, "--quiet")
        quality[k] = {**score(run, data), "index_s": t_index}
        say(f"drop {k}: nDCG@10 {quality[k]['nDCG@10']:.4f}")

    base_wall, base_cpu = speed[0]
    print(f"## `retrctl prune {args.model} --drop-layers K --calibration scifact` (no healing)\n")
    print(f"Encode: {len(texts)} SciFact docs (title + text, <= {cap} tokens), batch "
          f"{args.batch_size}, median of {args.rounds} interleaved rounds in one process; {machine()}, "
          f"{torch.get_num_threads()} torch threads, box shared with other jobs. Quality: SciFact test nDCG@10 over "
          f"{n_docs} docs{' (all)' if not args.eval_docs else f' (--eval-docs {args.eval_docs}: every judged doc + corpus order)'}, "
          "`retrctl index` / `search --hits 100` / `eval`.\n")
    print("| --drop-layers | layers kept | layers removed (Block Influence, least first) | docs/s (wall) | vs unpruned (wall) "
          "| docs per CPU-s | vs unpruned (CPU) | nDCG@10 | R@100 | index s |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for k in dirs:
        wall, cpu = speed[k]
        removed = reports[k]["removed"]["blocks"] if k else "—"
        q = quality[k]
        print(f"| {k} | {layers[k]} | {removed} | {len(texts) / wall:.1f} | {base_wall / wall:.2f}× | {len(texts) / cpu:.1f} "
              f"| {base_cpu / cpu:.2f}× | {q['nDCG@10']:.4f} | {q['R@100']:.4f} | {q['index_s']:.0f} |")
    if reports:
        scores = next(iter(reports.values()))["scores"]
        print("\nImportance on the calibration passages (1 − cos of the stream around each part; the block column ranks layers):\n")
        print("| layer | attention (+ its LayerNorm) | MLP (+ its LayerNorm) | Block Influence |")
        print("|---:|---:|---:|---:|")
        for i, b in enumerate(scores["block"]):
            print(f"| {i} | {scores['attention'][i]:.4f} | {scores['mlp'][i]:.4f} | {b:.4f} |")
    print(f"\ntorch {torch.__version__}")


if __name__ == "__main__":
    main()
