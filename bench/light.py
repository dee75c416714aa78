"""Benchmark: LightRetriever's token-lookup query encoder after training, against the full query encoder trained
in the same run, on one corpus index (issue 15).

`retrctl train --query-encoder token-lookup` trains one document encoder and two query encoders (full and token
lookup, KL-tied); `retrctl index` builds one corpus index; `retrctl search` runs twice: `--query-encoder full` and
`--query-encoder token-lookup` (table lookup, no transformer). Hybrid rows fuse a dense run with a BM25 run
(`retrctl index --method bm25`; its query side is token counts, like LightRetriever's sparse queries, but the
doc weights are BM25's, not learned) by `retrctl fuse`: RRF (k 60) and min-max linear 0.5/0.5. Same recipe and groups as bench/train_quality.py's
minilm task (SciFact train queries, judged positives, BM25-mined negatives, 3 epochs of 32 groups, τ 0.05,
lr 2e-5, query/passage max len 64/256), so the full row can be set beside that benchmark's plain training.

    python bench/light.py                      # minilm, the recipe above (~40 min on the idle 2-core CPU)
    python bench/light.py --epochs 1 --eval-docs 1000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _run import DATA, ROOT, retrctl
from train_quality import slice_beir, train, train_groups


def ndcg(run: Path, data: Path) -> float:
    _, out, _ = retrctl("eval", run, "--qrels", data, "--json", "-m", "nDCG@10", "--quiet")
    return json.loads(out.splitlines()[0])["nDCG@10"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="minilm")
    p.add_argument("--work", default=str(ROOT / "bench" / "work" / "light"))
    p.add_argument("--mine-retriever", default="bm25")
    p.add_argument("--train-queries", type=int, default=None)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--group-size", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--temperature", type=float, default=0.05)
    p.add_argument("--query-max-len", type=int, default=64)
    p.add_argument("--passage-max-len", type=int, default=256)
    p.add_argument("--eval-max-len", type=int, default=256)
    p.add_argument("--eval-docs", type=int, default=None)
    p.add_argument("--eval-queries", type=int, default=None)
    p.add_argument("--eval-batch", type=int, default=64)
    p.add_argument("--heads", default="dense,sparse", help="dense, or dense,sparse: also train the SPLADE head and "
                   "add its rows (token-count queries, and fused with each dense query side).")
    p.add_argument("--reuse", action="store_true", help="Reuse the trained model and index in --work if present.")
    a = p.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    scifact = slice_beir(DATA / "scifact", work, a.eval_docs, a.eval_queries)
    model, idx = work / "light-trained", work / "idx"
    t_train = t_index = float("nan")
    if not (a.reuse and (model / "token_lookup").is_dir()):
        groups = train_groups(a, work)
        t_train = train(a, groups, a.model, model, ["--query-encoder", "token-lookup", "--heads", a.heads], a.steps, a.lr,
                        a.batch_size, a.group_size, a.passage_max_len)
    table = json.loads((model / "token_lookup" / "config.json").read_text())
    caps = ["--passage-max-len", a.eval_max_len, "--query-max-len", a.eval_max_len]
    if not (a.reuse and idx.is_dir()):
        t_index, *_ = retrctl("index", scifact, "--model", model, *caps, "--batch-size", a.eval_batch, "-o", idx, "--quiet", "--rebuild")
    retrctl("index", scifact, "--method", "bm25", "-o", work / "idx-bm25", "--quiet", "--rebuild")
    rows, runs = [], {}
    for enc in ("full", "token-lookup"):
        runs[enc] = run = work / f"run-{enc}.trec"
        t, *_ = retrctl("search", idx, scifact, "--hits", 100, "--query-encoder", enc, "-o", run, "--quiet")
        rows.append((enc, ndcg(run, scifact), f"{t:.1f}"))
    runs["bm25"] = work / "run-bm25.trec"
    retrctl("search", work / "idx-bm25", scifact, "--hits", 100, "-o", runs["bm25"], "--quiet")
    rows.append(("BM25", ndcg(runs["bm25"], scifact), ""))
    lexical = ["bm25"]
    if "sparse" in a.heads:  # the learned sparse head: docs by SPLADE, queries by token counts (no encoder)
        t_sparse = float("nan")
        if not (a.reuse and (work / "idx-sparse").is_dir()):
            t_sparse, *_ = retrctl("index", scifact, "--method", "sparse", "--model", model, *caps, "--batch-size",
                                   a.eval_batch, "-o", work / "idx-sparse", "--quiet", "--rebuild")
        runs["sparse"] = work / "run-sparse.trec"
        t, *_ = retrctl("search", work / "idx-sparse", scifact, "--hits", 100, "-o", runs["sparse"], "--quiet")
        rows.append((f"sparse (token-count queries; index {t_sparse / 60:.1f} min)", ndcg(runs["sparse"], scifact), f"{t:.1f}"))
        lexical.append("sparse")
    for lex in lexical:
        for enc in ("full", "token-lookup"):
            for fusion in (["--fusion", "rrf"], ["--fusion", "linear", "--norm", "minmax"]):
                out = work / f"run-{enc}+{lex}-{fusion[1]}.trec"
                retrctl("fuse", runs[enc], runs[lex], *fusion, "--hits", 100, "-o", out, "--quiet")
                rows.append((f"{enc} + {lex}, {' '.join(fusion[1:])}", ndcg(out, scifact), ""))
    full = rows[0][1]
    lines = [f"## LightRetriever token lookup, {a.model} on SciFact test ({time.strftime('%Y-%m-%d')})", "",
             f"`python bench/light.py {' '.join(sys.argv[1:])}`: train {t_train / 60:.1f} min "
             f"(--query-encoder token-lookup --heads {a.heads}), table {table['vocab']}×{table['hidden']} built in {table['seconds']} s, "
             f"index {t_index / 60:.1f} min (nan: reused).", "",
             "| query encoder | nDCG@10 | of full | search s (incl. load) |", "|---|---|---|---|",
             *[f"| {e} | {s:.4f} | {100 * s / full:.1f} % | {t} |" for e, s, t in rows]]
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
