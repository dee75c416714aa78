"""Bench: crop + qgen on a corpus (SciFact) with SmolLM2: throughput on this CPU and a query-quality proxy.

Quality proxy: the fraction of queries whose source document is in all-MiniLM-L6-v2's top 10 over the whole corpus,
for crop (the peer: no LLM), the raw LLM queries, and after each qgen filter in turn (length, dedupe, InPars
score, consistency). The consistency filter uses BM25 (Promptagator's round trip with another retriever); with
minilm itself the proxy would be 1.0 by construction. Filters are applied by re-running `retrctl qgen` on the same
candidates checkpoint, so generation happens once. Everything runs through the CLI, as a user would.

    python bench/qgen.py --max-docs 20            # a small run
    python bench/qgen.py                          # the whole SciFact corpus (5,183 docs)

Prints a Markdown table on stdout; the commands run go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _run import ROOT, machine, retrctl


def read_jsonl(path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def proxy(queries: Path, index: Path, work: Path) -> float | None:
    rows = read_jsonl(queries)
    if not rows:
        return None
    run = work / (queries.stem + ".minilm.trec")
    retrctl("search", index, queries, "--hits", 10, "-o", run, "-q", log=False)
    top = {}
    for line in run.read_text().splitlines():
        qid, _, docid, *_ = line.split()
        top.setdefault(qid, set()).add(docid)
    return sum(r["source_docid"] in top.get(r["query_id"], ()) for r in rows) / len(rows)


def examples(data: Path, shots: int, out: Path) -> Path:
    """Few-shot examples as Promptagator takes them: judged (query, doc) pairs of the task's train split."""
    train = [line.split("\t") for line in (data / "qrels" / "train.tsv").read_text().splitlines()[1:] if line.strip()]
    pairs = list(dict.fromkeys((q, d) for q, d, *_ in train))[:shots]
    queries = {r["_id"]: r["text"] for r in read_jsonl(data / "queries.jsonl") if r["_id"] in {q for q, _ in pairs}}
    docs = {r["_id"]: r for r in read_jsonl(data / "corpus.jsonl") if r["_id"] in {d for _, d in pairs}}
    with open(out, "w") as f:
        for q, d in pairs:
            text = " ".join(docs[d]["text"].split()[:60])  # short shots keep the prompt affordable on a CPU
            f.write(json.dumps({"title": docs[d]["title"], "document": text, "query": queries[q]}) + "\n")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "scifact"), help="BEIR folder.")
    ap.add_argument("--max-docs", type=int, help="Generate for the first N docs only (the proxy index is always the whole corpus).")
    ap.add_argument("--llm", default="smollm2")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep-top", type=float, default=0.5)
    ap.add_argument("--consistency-k", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--shots", type=int, default=3, help="Few-shot examples from the train qrels (DRAMA: 3; 0 = zero-shot).")
    ap.add_argument("--work", default=None, help="Work dir (kept; reused: the minilm index and qgen candidates).")
    args = ap.parse_args()

    work = Path(args.work or ROOT / "bench" / "work" / "qgen")
    work.mkdir(parents=True, exist_ok=True)
    corpus = Path(args.data) / "corpus.jsonl"
    docs = work / "docs.jsonl"
    with open(corpus) as f, open(docs, "w") as out:
        for i, line in enumerate(f):
            if args.max_docs is not None and i >= args.max_docs:
                break
            out.write(line)
    n_docs = sum(1 for _ in open(docs))

    index = work / "minilm"
    if not (index / "index.json").exists():
        retrctl("index", corpus, "--model", "minilm", "-o", index, "-q")

    rows = []
    if (ROOT / "stages" / "crop.py").exists():
        secs, _, _ = retrctl("crop", docs, "--seed", args.seed, "-o", work / "crop.jsonl")
        n = len(read_jsonl(work / "crop.jsonl"))
        rows.append(("crop (peer, no LLM)", n, n / secs, proxy(work / "crop.jsonl", index, work), secs))
    else:
        print("stages/crop.py is absent: no crop row", file=sys.stderr)

    # one checkpoint per generation setting (a checkpoint refuses other settings); candidates of docs beyond
    # --max-docs are simply not used, so a larger run reuses a smaller one's generations
    cands = work / f"qgen.{Path(args.llm).name}.seed{args.seed}.shots{args.shots}.candidates.jsonl"
    base = ["qgen", docs, "--llm", args.llm, "--seed", args.seed, "--batch-size", args.batch_size, "--candidates", cands]
    if args.shots:
        base += ["--examples", examples(Path(args.data), args.shots, work / "examples.jsonl"), "--shots", args.shots]
    off = ["--min-words", 0, "--max-words", 10**6, "--no-dedupe", "--keep-copies"]
    steps = [
        ("qgen raw", off),
        ("+ length 2-32 words", ["--no-dedupe", "--keep-copies"]),
        ("+ dedupe", ["--keep-copies"]),
        ("+ drop copies of the doc", []),
        (f"+ InPars score, keep top {args.keep_top:g}", ["--keep-top", args.keep_top]),
        (f"+ consistency, BM25 top-{args.consistency_k}", ["--keep-top", args.keep_top, "--retriever", "bm25",
                                                           "--consistency-k", args.consistency_k]),
    ]
    gen_rate = None
    for i, (name, flags) in enumerate(steps):
        out = work / f"qgen{i}.jsonl"
        secs, _, err = retrctl(*base, *flags, "-o", out)
        rate = None
        if i == 0:
            t = json.loads((work / f"qgen{i}.jsonl.manifest.json").read_text())["throughput"]
            gen_rate = (t["docs"] / t["seconds"] if t["seconds"] else None, t["generated_tokens"] / t["seconds"] if t["seconds"] else None)
            rate = t["docs"] / secs  # docs generated by this run: a reused checkpoint's docs cost nothing now
        n = len(read_jsonl(out))
        rows.append((name, n, rate, proxy(out, index, work), secs))

    raw = next((r for r in rows if r[0] == "qgen raw"), None)
    crop = next((r for r in rows if r[0].startswith("crop")), None)
    print(f"qgen on {n_docs} docs of {Path(args.data).name} with {args.llm} (seed {args.seed}, {args.shots} shots from "
          f"train qrels); proxy = source doc in minilm top-10 over the whole corpus")
    print(f"machine: {machine()} (shared)")
    if gen_rate and gen_rate[0]:
        print(f"generation: {gen_rate[0]:.2f} docs/s, {gen_rate[1]:.1f} generated tok/s (timed inside qgen, model load excluded)")
    print()
    print("| queries | rows | docs/s (wall, incl. load) | proxy: source in minilm top-10 | vs crop | vs qgen raw |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, n, rate, p, _ in rows:
        vs_crop = f"{p / crop[3]:.2f}x" if crop and crop[3] and p is not None else "-"
        vs_raw = f"{p - raw[3]:+.3f}" if raw and raw[3] is not None and p is not None and not name.startswith(("crop", "qgen raw")) else "-"
        print(f"| {name} | {n} | {f'{rate:.2f}' if rate else '-'} | {f'{p:.3f}' if p is not None else '-'} | {vs_crop} | {vs_raw} |")


if __name__ == "__main__":
    main()
