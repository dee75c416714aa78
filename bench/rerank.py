"""Bench: LLM reranking of a first stage's top 20 on SciFact test with SmolLM2 (listwise, pointwise, query
likelihood): nDCG@10 against the first stage.

The first stage is BM25, or (`--first-stage fused`) BM25 + all-MiniLM-L6-v2 fused linearly over min-max scores at
0.5/0.5, the teacher the zero-label recipe starts from. The peer in the same run is the first stage itself: the table gives nDCG@10 of each run, its change, the
paired t-test p-value (from `retrctl eval`), the cost (LLM calls, prompt/generated tokens, seconds per query) and
the listwise parse-failure rate. A 135M model may well hurt; the numbers are reported as measured. Everything runs
through the CLI: `retrctl index` + `search` (BM25, Lucene k1=0.9 b=0.4), `retrctl rerank`, `retrctl eval`.

    python bench/rerank.py --max-queries 5        # a small run
    python bench/rerank.py                        # all 300 SciFact test queries
    python bench/rerank.py --modes qlm --first-stage fused   # UPR's query likelihood over the fused teacher

Prints a Markdown table on stdout; the commands run go to stderr.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from _run import ROOT, machine, retrctl


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "scifact"), help="BEIR folder.")
    ap.add_argument("--max-queries", type=int, help="First N test queries (in qrels order).")
    ap.add_argument("--llm", default="smollm2")
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--modes", default="listwise,pointwise", help="Comma-separated: listwise, pointwise, qlm.")
    ap.add_argument("--first-stage", choices=["bm25", "fused"], default="bm25")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--work", default=None, help="Work dir (kept; a re-run resumes reranking per query).")
    args = ap.parse_args()

    data = Path(args.data)
    work = Path(args.work or ROOT / "bench" / "work" / "rerank")
    work.mkdir(parents=True, exist_ok=True)
    qrels = data / "qrels" / "test.tsv"
    test_ids = list(dict.fromkeys(line.split("\t")[0] for line in qrels.read_text().splitlines()[1:] if line.strip()))
    if args.max_queries is not None:
        test_ids = test_ids[: args.max_queries]
    wanted = set(test_ids)
    # judgments of the chosen queries only: eval scores judged queries missing from a run as 0 (trec_eval -c)
    qrels_sel = work / "qrels.tsv"
    qrels_sel.write_text("".join(line + "\n" for i, line in enumerate(qrels.read_text().splitlines())
                                 if line.strip() and (i == 0 or line.split("\t")[0] in wanted)))
    queries = work / "queries.jsonl"
    with open(data / "queries.jsonl") as f, open(queries, "w") as out:
        for line in f:
            if json.loads(line)["_id"] in wanted:
                out.write(line)

    index = work / "bm25"
    if not (index / "index.json").exists():
        retrctl("index", data / "corpus.jsonl", "--method", "bm25", "-o", index, "-q")
    bm25 = work / "bm25.trec"
    retrctl("search", index, queries, "--hits", 100, "-o", bm25, "-q")
    first = bm25
    if args.first_stage == "fused":
        dense = work / "minilm"
        if not (dense / "index.json").exists():
            retrctl("index", data / "corpus.jsonl", "--model", "minilm", "-o", dense, "-q")
        minilm = work / "minilm.trec"
        retrctl("search", dense, queries, "--hits", 100, "-o", minilm, "-q")
        first = work / "fused.trec"
        retrctl("fuse", bm25, minilm, "--fusion", "linear", "--norm", "minmax", "--weights", "0.5,0.5", "--hits", 100,
                "-o", first, "-q")

    runs, cost = [first], {}
    for mode in args.modes.split(","):
        out = work / f"{args.first_stage}-{mode}.trec"
        secs, _, err = retrctl("rerank", first, "--queries", queries, "--corpus", data / "corpus.jsonl", "--llm", args.llm,
                               "--top-k", args.top_k, "--mode", mode, "--batch-size", args.batch_size, "-o", out)
        m = json.loads(Path(f"{out}.manifest.json").read_text())
        w = m["windows"]
        fail = re.search(r"parse-failure rate ([\d.]+)%", err)
        # a resumed run's LLM calls and time cover only the queries it reranked now; window outcomes cover all
        cost[out.name] = {"secs": secs, "usage": m["usage"], "ran": m["queries"] - m["resumed"],
                          "fail": f"{w['ok']}/{w['repaired']}/{w['failed']} ({fail.group(1)}% failed)" if fail else "-"}
        runs.append(out)
    _, stdout, _ = retrctl("eval", *runs, "--qrels", qrels_sel, "-m", "nDCG@10", "--json")
    rows = [json.loads(x) for x in stdout.splitlines() if x.strip()]
    base = rows[0]["nDCG@10"]

    print(f"rerank of {args.first_stage} top-{args.top_k} on {data.name} test, {len(test_ids)} queries, with {args.llm}")
    for name, c in cost.items():
        if c["ran"] < len(test_ids):
            print(f"{name}: {len(test_ids) - c['ran']} queries resumed from the checkpoint; LLM calls, tokens and s/query "
                  f"are those of the {c['ran']} reranked by this run")
    print(f"machine: {machine()} (shared)")
    print()
    print("| run | nDCG@10 | vs first stage | p (paired t) | LLM calls | prompt tok | gen tok | s/query (wall) | windows ok/repaired/failed |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        name = Path(row["run"]).name
        c = cost.get(name)
        p = (row.get("p_value") or {}).get("nDCG@10")
        delta = f"{row['nDCG@10'] - base:+.4f}" if c else "-"
        if c:
            u = c["usage"]
            print(f"| {name.removesuffix('.trec')} | {row['nDCG@10']:.4f} | {delta} | {p:.3g} | {u['calls']} | "
                  f"{u['prompt_tokens']} | {u['generated_tokens']} | {c['secs'] / max(c['ran'], 1):.1f} | {c['fail']} |")
        else:
            print(f"| {args.first_stage} (first stage) | {row['nDCG@10']:.4f} | - | - | - | - | - | - | - |")


if __name__ == "__main__":
    main()
