"""Benchmark: EffiR layer dropping on SmolLM2-135M as a bidirectional mean-pooled retriever.

1. The importance table: 1 − cos(x_in, x_out) of each attention and MLP sub-layer (and ShortGPT's block
   influence) on `--calibration-size` SciFact corpus passages (picked as `retrctl prune` picks them: stable hash of
   the docid) at `--max-length` tokens. Are MLPs more redundant than attention here too?
2. Non-embedding parameters and encode throughput vs the unpruned model (same docs, same process, rounds
   interleaved so load changes hit every model alike), for unpruned / drop-mlp 8 / drop-mlp 15 / drop-layers 10.
   Each single-sub-layer setting is timed twice: as stock `AutoModel.from_pretrained` runs the saved dir (removed
   sub-layers are zeros: computed) and skipped (what `surgery.skip_removed` runs in memory).
3. `--dirs NAME=DIR,...`: models `retrctl prune` wrote (e.g. `--target-shape`, Sheared-LLaMA), timed and scored
   beside the settings above (loaded as retrctl's index loads them).
4. With `--ndcg-docs N`: SciFact test nDCG@10 right after pruning (no training) on an N-doc sub-corpus: every doc
   judged for the first `--ndcg-queries` test queries (sorted ids), filled up to N with other corpus docs in
   corpus order; scored by retrctl.metrics (trec_eval semantics), exact dot-product search over the sub-corpus.

    flock /work/bench.lock .venv/bin/python bench/prune.py                       # importance + speed, ~15 min on 2 cores
    flock /work/bench.lock .venv/bin/python bench/prune.py --scores S.json --threads 1   # speed only, CPU time robust to load
    flock /work/bench.lock .venv/bin/python bench/prune.py --ndcg-docs 1000 --settings unpruned,drop-mlp-8
    flock /work/bench.lock .venv/bin/python bench/prune.py --settings unpruned --dirs shape=DIR --threads 1 --ndcg-docs 1000

Markdown tables on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from _run import DATA, encode_and_search, machine, ndcg, subcorpus, throughput

from retrctl import records
from retrctl.models import Encoder
from retrctl.prune import importance, surgery
from stages.prune import calibration_texts

SETTINGS = {"unpruned": {}, "drop-mlp-8": {"drop_mlp": 8}, "drop-mlp-15": {"drop_mlp": 15}, "drop-layers-10": {"drop_layers": 10}}
DEFAULT = ",".join(SETTINGS)
# beyond the default table: where ~2x encode speed is
SETTINGS |= {"drop-layers-15": {"drop_layers": 15}, "target-params-0.5": {"target_params": 0.5},
             "drop-mlp-15+layers-5": {"drop_mlp": 15, "drop_layers": 5}}


def say(*a):
    print(*a, file=sys.stderr, flush=True)


def pruned(enc: Encoder, scores: dict, flags: dict, skipped: bool) -> Encoder:
    e = copy.deepcopy(enc)
    if flags:
        surgery.apply(e.model, surgery.plan(scores, surgery.sublayer_params(e.model), **flags))
        if skipped:
            surgery.skip_removed(e.model)
    return e


def importance_table(scores: dict) -> str:
    rows = ["| block | attention 1−cos | MLP 1−cos | block influence |", "|---:|---:|---:|---:|"]
    for i in range(len(scores["block"])):
        rows.append(f"| {i} | {scores['attention'][i]:.4f} | {scores['mlp'][i]:.4f} | {scores['block'][i]:.4f} |")
    a, m = np.array(scores["attention"]), np.array(scores["mlp"])
    rows.append(f"| median | {np.median(a):.4f} | {np.median(m):.4f} | |")
    rows.append(f"| mean | {a.mean():.4f} | {m.mean():.4f} | |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--calibration-size", type=int, default=256)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--scores", help="reuse an importance JSON written by an earlier run (--save-scores)")
    ap.add_argument("--save-scores", default="/work/bench-work/p-prune/smollm2-scores.json")
    ap.add_argument("--docs", type=int, default=32, help="docs encoded per throughput round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--settings", default=DEFAULT, help=f"comma-separated, of: {', '.join(SETTINGS)}")
    ap.add_argument("--dirs", default="", help="NAME=DIR,...: pruned model dirs to time and score beside the settings")
    ap.add_argument("--ndcg-docs", type=int, default=0)
    ap.add_argument("--ndcg-queries", type=int, default=100)
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)

    enc = Encoder.load(args.model, device="cpu", pooling="mean", bidirectional=True,
                       passage_max_len=args.max_length, query_max_len=64)
    corpus = DATA / "scifact" / "corpus.jsonl"
    wanted = args.settings.split(",")
    if not args.scores and wanted == ["unpruned"]:  # nothing to remove by importance: none needed
        scores = None
    elif args.scores:
        scores = json.loads(Path(args.scores).read_text())
    else:
        t0 = time.perf_counter()
        texts = calibration_texts(corpus, args.calibration_size)
        scores = importance.importance(enc.model, enc.tokenizer, texts, max_length=args.max_length, batch_size=args.batch_size)
        scores.update(seconds=time.perf_counter() - t0, passages=len(texts), max_length=args.max_length)
        Path(args.save_scores).parent.mkdir(parents=True, exist_ok=True)
        Path(args.save_scores).write_text(json.dumps(scores, indent=1))
    if scores is not None:
        importance_section(scores, args)
    models, params = {}, {}
    for name in wanted:
        flags = SETTINGS[name]
        uniform = not flags or not surgery.plan(scores, surgery.sublayer_params(enc.model), **flags).mlp
        forms = [("", False)] if uniform else [(" (stock load: zeros)", False), (" (skipped)", True)]
        for suffix, skipped in forms:
            e = pruned(enc, scores, flags, skipped)
            models[name + suffix] = e
            params[name + suffix] = surgery.non_embedding_params(e.model)
    removed = {n: surgery.plan(scores, surgery.sublayer_params(enc.model), **SETTINGS[n]) for n in wanted if SETTINGS[n]}
    for item in filter(None, args.dirs.split(",")):
        name, path = item.split("=", 1)
        models[name] = Encoder.load(path, device="cpu", inference=True, passage_max_len=args.max_length, query_max_len=64)
        params[name] = surgery.non_embedding_params(models[name].model)
        wanted.append(name)

    speed = {}
    if args.docs:
        docs = [records.passage_text(d) for d in list(records.read(corpus, "doc"))[: args.docs]]
        speed = throughput(models, docs, args.rounds, args.batch_size)
    base = speed.get("unpruned")
    if speed:
        speed_table(speed, base, params, removed, args)
    if args.ndcg_docs:
        ndcg_table(models, wanted, args)


def importance_section(scores, args):
    print(f"## Importance: {args.model}, {scores.get('passages', args.calibration_size)} SciFact corpus passages at "
          f"{scores.get('max_length', 256)} tokens ({scores['tokens']:,} tokens), bidirectional{' (from ' + args.scores + ')' if args.scores else ''}\n")
    print(importance_table(scores) + "\n")


def speed_table(speed, base, params, removed, args):
    print(f"## Params and encode throughput ({args.docs} SciFact docs at <= {args.max_length} tokens, batch {args.batch_size}, "
          f"median of {args.rounds} interleaved rounds; {machine()}, box shared with other jobs)\n")
    print("| model | removed | non-embedding params | docs/s (wall) | vs unpruned (wall) | docs per CPU-s | vs unpruned (CPU) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, (wall, cpu) in speed.items():
        p = removed.get(name.split(" ")[0])
        what = "—" if p is None else "; ".join(f"{k} {v}" for k, v in (("blocks", p.blocks), ("MLPs", p.mlp)) if v)
        print(f"| {name} | {what} | {params[name] / 1e6:.1f}M ({params[name] / params['unpruned']:.0%}) | "
              f"{args.docs / wall:.2f} | {base[0] / wall:.2f}× | {args.docs / cpu:.2f} | {base[1] / cpu:.2f}× |")
    print()


def ndcg_table(models, wanted, args):
    docs, queries, qrels = subcorpus(args.ndcg_docs, args.ndcg_queries)
    print(f"## SciFact test nDCG@10 right after pruning (no training): {len(docs)} docs, {len(queries)} queries\n")
    print("| model | nDCG@10 | seconds |")
    print("|---|---:|---:|")
    for name in wanted:
        key = name + " (skipped)" if name + " (skipped)" in models else name  # same vectors as the zero form, sooner
        t0 = time.perf_counter()
        score = ndcg(encode_and_search(models[key], docs, queries, args.batch_size), qrels)
        print(f"| {name} | {score:.4f} | {time.perf_counter() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()
