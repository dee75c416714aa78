"""Benchmark: BGE-M3's three heads on one MiniLM backbone, with and without self-knowledge distillation.

Three trainings of all-MiniLM-L6-v2 on the same groups (SciFact train queries with judged positives + crop
pseudo-queries of SciFact docs, BM25-mined negatives; 3 epochs of 32 groups, τ 0.05, lr 2e-5, query/passage caps
64/256, as bench/light.py):

- ``dense``: today's `retrctl train` (the dense head only);
- ``m3-plain``: `--heads dense,lexical,colbert --no-self-distill` (the paper's multi-objective ablation);
- ``m3-sd``: `--heads dense,lexical,colbert` (self-knowledge distillation, BGE-M3's Eq. 4–6).

Each model indexes SciFact's 5,183 docs once with every head it has (`retrctl index`), and `retrctl search` runs the
paper's Table 1 layout on the 300 test queries: Dense, Sparse (the lexical head), Multi-vec (MaxSim re-scoring of
the dense top-100, as BGE-M3's table does for its cost), Dense+Sparse (w 1, 0.3 on raw scores), All (candidates
from dense and lexical top-100 each, re-scored by 1·dense + 0.3·lexical + 1·MaxSim). nDCG@10 by `retrctl eval`
with its paired t-test; ArguAna (8,674 docs, 1,406 queries) as the out-of-domain check (Dense and All). Then index
size per head (bytes/doc), build docs/s, per-query latency of each search mode (in-process, the index opened and
warmed first, all queries searched in batches as `retrctl search` does) and peak RSS of each training process. MCLS (the paper's Appendix B.2): the last
model indexes the longest tenth of SciFact's (and ArguAna's) docs at 512 tokens with and without `--mcls N` (a CLS
every N tokens, their states averaged), scored on the test queries whose judged docs all lie among them
(`--mcls-only MODEL` runs just that table).

    python bench/m3.py                     # ~2 h on the 2-core CPU; minutes on a GPU
    python bench/m3.py --epochs 1 --eval-docs 1000 --no-arguana    # a quick look
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from _run import DATA, ROOT, retrctl, run_measured
from light import recipe_options
from train_quality import crop_groups, slice_beir, train_groups

SETTINGS = {"dense": [], "m3-plain": ["--heads", "dense,lexical,colbert", "--no-self-distill"],
            "m3-sd": ["--heads", "dense,lexical,colbert"]}
MODES = {  # Table 1 of the paper: the search flags of each row
    "Dense": ["--heads", "dense"],
    "Sparse": ["--heads", "sparse"],
    "Multi-vec": ["--heads", "colbert", "--candidates", "dense"],
    "Dense+Sparse": ["--heads", "dense,sparse", "--fusion", "linear", "--norm", "none", "--weights", "1,0.3"],
    "All": ["--heads", "dense,sparse,colbert", "--candidates", "dense,sparse", "--weights", "1,0.3,1"],
}


def train_measured(groups: Path, out: Path, extra: list, a) -> tuple[float, float]:
    """`retrctl train` in a child process: (seconds, peak RSS in GB of that process)."""
    argv = [sys.executable, "-m", "retrctl", "train", groups, "--corpus", DATA / "scifact", "--model", "minilm",
            "-o", out, "--epochs", a.epochs, "--train-batch-size", a.batch_size, "--train-group-size", a.group_size,
            "--lr", a.lr, "--temperature", a.temperature, "--query-max-len", a.query_max_len,
            "--passage-max-len", a.passage_max_len, "--logging-steps", 10, "--overwrite", *extra]
    print("$ retrctl " + " ".join(map(str, argv[3:])), file=sys.stderr, flush=True)
    ran = run_measured(argv, stdout=None, stderr=None, what="training")
    return ran.seconds, ran.peak_bytes / 2**30


def search(idx: Path, queries: Path, run: Path, flags: list, extra: list) -> None:
    retrctl("search", idx, queries, "--hits", 100, *flags, *extra, "-o", run, "--quiet")


def latency(idx: Path, data: Path, flags: list) -> float:
    """ms per query of one search mode, in this process: the index opened and warmed first (model loading and
    the first batch are not counted), then all queries searched as `retrctl search` does (batched encoding)."""
    from retrctl import records
    from retrctl.indexes import open_index

    knobs = dict(zip((f[2:].replace("-", "_") for f in flags[::2]), flags[1::2], strict=True))
    if "weights" in knobs:
        knobs["weights"] = [float(w) for w in knobs["weights"].split(",")]
    index = open_index(idx)
    for k, v in knobs.items():
        setattr(index, k, v)
    queries = list(records.read(data, "query"))
    index.search(queries[:8], 100)
    t0 = time.perf_counter()
    index.search(queries, 100)
    return (time.perf_counter() - t0) / len(queries) * 1000


def evaluate(runs: list[Path], data: Path) -> list[dict]:
    _, out, _ = retrctl("eval", *runs, "--qrels", data, "--json", "-m", "nDCG@10", "--quiet")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def head_bytes(idx: Path) -> dict[str, float]:
    """Bytes on disk per doc of each head's files in the index's current version (the index's own accounting)."""
    from retrctl.indexes import store
    from retrctl.indexes.heads import bytes_per_doc

    version = store.resolve(idx)
    return bytes_per_doc(version.path, version.manifest)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=str(ROOT / "bench" / "work" / "m3"))
    p.add_argument("--settings", default=",".join(SETTINGS))
    recipe_options(p)
    p.add_argument("--crop-docs", type=int, default=None)
    p.add_argument("--arguana", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--mcls", default="64,128", help="MCLS intervals to measure on the longest docs ('' = skip).")
    p.add_argument("--reuse", action="store_true", help="Reuse trained models and indexes in --work.")
    p.add_argument("--mcls-only", metavar="MODEL", help="Only the MCLS table, for MODEL (e.g. minilm).")
    p.add_argument("--memory-only", action="store_true", help="Only GradCache's memory: 2 steps of the recipe with "
                   "--grad-cache on --chunk-size 8, dense vs three heads, peak RSS of each training process.")
    a = p.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    if a.memory_only:
        groups = train_groups(a, work)
        print("\n| heads (GradCache, chunk 8, batch 32 × 2, caps 64/256) | peak RSS GB | s for 2 steps |\n|---|---|---|")
        for name in ("dense", "m3-sd"):
            t, rss = train_measured(groups, work / f"mem-{name}", [*SETTINGS[name], "--grad-cache", "on",
                                                                     "--chunk-size", 8, "--max-steps", 2], a)
            print(f"| {name} | {rss:.2f} | {t:.0f} |", flush=True)
        return
    if a.mcls_only:
        data = [DATA / "scifact", *([DATA / "arguana"] if a.arguana else [])]
        print(mcls_table(a.mcls_only, data, work, [int(n) for n in a.mcls.split(",")], a))
        return
    names = [s for s in a.settings.split(",") if s]

    groups = work / "groups.jsonl"
    if not (a.reuse and groups.exists()):
        lines = [ln for part in (train_groups(a, work), crop_groups(a, work)) for ln in part.read_text().splitlines(keepends=True)]
        random.Random(0).shuffle(lines)  # judged and crop groups mixed in every batch
        groups.write_text("".join(lines))
    n_groups = len(groups.read_text().splitlines())
    caps = ["--query-max-len", a.query_max_len, "--passage-max-len", a.passage_max_len]
    sets = {"scifact": slice_beir(DATA / "scifact", work, a.eval_docs, a.eval_queries)}
    if a.arguana:
        sets["arguana"] = slice_beir(DATA / "arguana", work, a.eval_docs, a.eval_queries)

    trained, quality, speed, ood = {}, [], [], []
    for name in names:
        model = work / f"model-{name}"
        if not (a.reuse and (model / "retrctl.json").exists()):
            trained[name] = train_measured(groups, model, SETTINGS[name], a)
        runs: dict[str, Path] = {}
        for data_name, data in sets.items():
            idx = work / f"idx-{name}-{data_name}"
            t_index = 0.0
            if not (a.reuse and idx.exists()):
                t_index, *_ = retrctl("index", data, "--model", model, *caps, "--batch-size", a.eval_batch, "-o", idx,
                                      "--rebuild", "--quiet")
            n_docs = sum(1 for _ in (data / "corpus.jsonl").open())
            extra = ["--remove-query"] if data_name == "arguana" else []
            modes = {"Dense": []} if name == "dense" else MODES  # a dense-only index has no --heads to choose
            if data_name == "arguana" and name != "dense":
                modes = {k: MODES[k] for k in ("Dense", "All")}
            for mode, flags in modes.items():
                run = work / f"run-{name}-{data_name}-{mode}.trec"
                search(idx, data, run, flags, extra)
                runs[f"{data_name}:{mode}"] = run
            if data_name == "scifact":
                for mode, flags in modes.items():
                    speed.append(f"| {name} | {mode} | {latency(idx, data, flags):.2f} |")
                sizes = ", ".join(f"{h} {b:,.0f} B/doc" for h, b in head_bytes(idx).items())
                built = f"index build | {n_docs / t_index:.1f} docs/s" if t_index else "index (reused)"
                speed.append(f"| {name} | {built} | {sizes} |")
        for data_name in sets:
            keys = [k for k in runs if k.startswith(data_name + ":")]
            scores = evaluate([runs[k] for k in keys], sets[data_name])
            row = {k.split(":")[1]: s["nDCG@10"] for k, s in zip(keys, scores, strict=True)}
            (quality if data_name == "scifact" else ood).append((name, row, runs))
        print(f"{name}: {quality[-1][1]}", file=sys.stderr, flush=True)

    # the paper's two claims, with retrctl eval's paired t-test
    tests = []
    for name, row, runs in quality:
        if name == "dense":
            continue
        single = max(("Dense", "Sparse", "Multi-vec"), key=lambda m: row[m])
        res = evaluate([runs[f"scifact:{single}"], runs["scifact:All"]], sets["scifact"])
        tests.append(f"| {name}: All vs best single head ({single}) | {row[single]:.4f} → {row['All']:.4f} | "
                     f"p = {res[1]['p_value']['nDCG@10']:.3g} |")
    by = {n: r for n, _, r in quality}
    if "m3-plain" in by and "m3-sd" in by:
        for data_name in sets:
            res = evaluate([by["m3-plain"][f"{data_name}:All"], by["m3-sd"][f"{data_name}:All"]], sets[data_name])
            tests.append(f"| {data_name}: All, self-distill vs plain multi-objective | {res[0]['nDCG@10']:.4f} → "
                         f"{res[1]['nDCG@10']:.4f} | p = {res[1]['p_value']['nDCG@10']:.3g} |")

    print(f"\n{n_groups} groups; SciFact test nDCG@10 (Table 1 layout)\n")
    print("| training | " + " | ".join(MODES) + " | train min | peak RSS GB |")
    print("|---|" + "---|" * (len(MODES) + 2))
    for name, row, _ in quality:
        t, rss = trained.get(name, (float("nan"), float("nan")))
        print(f"| {name} | " + " | ".join(f"{row[m]:.4f}" if m in row else "–" for m in MODES) + f" | {t / 60:.1f} | {rss:.1f} |")
    if ood:
        print("\nArguAna nDCG@10 (out of domain)\n\n| training | Dense | All |\n|---|---|---|")
        for name, row, _ in ood:
            print(f"| {name} | {row['Dense']:.4f} | {row.get('All', float('nan')):.4f} |")
    print("\n| claim | nDCG@10 | paired t-test |\n|---|---|---|")
    print("\n".join(tests))
    print("\n| model | search mode | ms/query (or build) |\n|---|---|---|")
    print("\n".join(speed))
    if a.mcls:
        print(mcls_table(str(work / f"model-{names[-1]}"), list(sets.values()), work, [int(n) for n in a.mcls.split(",")], a))


def long_docs(data: Path, work: Path) -> tuple[Path, int, int, int]:
    """The longest tenth of ``data``'s corpus (by characters) as a corpus of its own, with the test queries whose
    judged docs all lie in it: (dir in BEIR layout, docs, queries, the length cut)."""
    from retrctl import records

    docs = list(records.read(data, "doc"))
    lengths = sorted(len(records.passage_text(d)) for d in docs)
    cut = lengths[int(0.9 * len(lengths))]
    long = [d for d in docs if len(records.passage_text(d)) >= cut]
    ids = {d["docid"] for d in long}
    qrels = records.read_qrels(data, "test")
    keep = {q for q, judged in qrels.items() if judged and all(d in ids for d in judged)}
    out = work / f"{data.name}-long"
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    records.write(long, out / "corpus.jsonl")
    records.write([q for q in records.read(data, "query") if q["query_id"] in keep], out / "queries.jsonl")
    rows = [f"{q}\t{d}\t{r}" for q in sorted(keep) for d, r in qrels[q].items()]
    (out / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    return out, len(long), len(keep), cut


def mcls_table(model: str, sets: list[Path], work: Path, intervals: list[int], a) -> str:
    """BGE-M3's MCLS on long docs: each set's longest tenth indexed at 512 tokens with the model's own pooling, then
    with a CLS every N tokens (their states averaged); nDCG@10 of the queries judged on those docs."""
    out = [f"\nMCLS on long docs ({Path(model).name}; passages cut at 512 tokens; * paired t-test vs the model's pooling)\n",
           "| data (long docs, queries, cut) | doc vector | nDCG@10 |", "|---|---|---|"]
    for data in sets:
        sub, n_docs, n_queries, cut = long_docs(data, work)
        extra = ["--remove-query"] if "arguana" in data.name else []
        rows = []
        for every in [None, *intervals]:
            tag = f"mcls{every}" if every else "plain"
            idx, run = work / f"idx-long-{data.name}-{tag}", work / f"run-long-{data.name}-{tag}.trec"
            how = ["--mcls", every] if every else []
            retrctl("index", sub, "--model", model, "--heads", "dense", "--passage-max-len", 512, *how,
                    "--batch-size", a.eval_batch, "-o", idx, "--rebuild", "--quiet")
            retrctl("search", idx, sub, "--hits", 100, *extra, "-o", run, "--quiet")
            rows.append((tag, run))
        res = evaluate([r for _, r in rows], sub)
        for (tag, _), r in zip(rows, res, strict=True):
            mark = "*" if "nDCG@10" in r.get("significant", []) else ""
            how = "pooling as trained" if tag == "plain" else f"MCLS every {tag[4:]} tokens"
            out.append(f"| {data.name} ({n_docs} docs ≥ {cut} chars, {n_queries} queries) | {how} | {r['nDCG@10']:.4f}{mark} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
