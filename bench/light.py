"""Benchmark: LightRetriever's token-lookup query encoder after training, against the full query encoder trained
in the same run, on one corpus index.

`retrctl train --query-encoder token-lookup --heads dense,sparse` trains one document encoder, two query encoders
(full and token lookup, KL-tied) and the SPLADE head; `retrctl index` builds one corpus index holding both heads;
`retrctl search` runs per query side and head: dense with `--query-encoder full|token-lookup`, the sparse head with
token-count queries (exact and Seismic), and the index's own fusion of dense + sparse (LightRetriever's hybrid).
More hybrid rows fuse a dense run with the sparse run or a BM25 run by `retrctl fuse` (RRF k 60, min-max linear
0.5/0.5). Then the sparse head's price: build time and size against a `--heads dense` index of the same model,
per-query search time of each head, Seismic's recall@10 against exact. Same recipe and groups as
bench/train_quality.py's minilm task (SciFact train queries, judged positives, BM25-mined negatives, 3 epochs of 32
groups, τ 0.05, lr 2e-5, query/passage max len 64/256), so the full row can be set beside that benchmark's plain
training. `--heads dense` leaves the sparse head out (the earlier rows only). `--model smollm2` trains it as
bench/train_quality.py's smollm2 task does: bidirectional attention, mean pooling, GradCache in chunks of 16 (the
trained model dir keeps pooling and attention, so index and search need no flags); the rest of the recipe is the same.

    python bench/light.py                      # minilm, the recipe above (~60 min on the idle 2-core CPU)
    python bench/light.py --model smollm2      # on a GPU (cuda is every stage's default device when present)
    python bench/light.py --epochs 1 --eval-docs 1000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _run import DATA, ROOT, ndcg, retrctl
from train_quality import slice_beir, train, train_groups

# bench/train_quality.py's smollm2 task: DRAMA's setting, GradCache (its memory note) in chunks of 16
SMOLLM2 = "--pooling mean --bidirectional --grad-cache --chunk-size 16"
# LightRetriever encodes each query token under its instruction: SmolLM2's tokenizer adds no BOS, so without one a
# token sees only itself (retrctl train refuses that); the instruction as E5-Mistral/LightRetriever word it for SciFact
SMOLLM2_PROMPT = "Instruct: Given a scientific claim, retrieve documents that support or refute the claim\nQuery: "


def top10(run: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in run.read_text().splitlines():
        q, _, d, rank, *_ = line.split()
        if int(rank) <= 10:
            out.setdefault(q, []).append(d)
    return out


def index_costs(a, work: Path, scifact: Path, model: Path, idx: Path, caps: list, t_both: float, runs: dict) -> list[str]:
    """The sparse head's price: build time and size against a dense-only index of the same model, query time of
    each head (one process per search, loading included, so a search of one query is subtracted: search refuses
    an empty input), and Seismic's recall@10 against exact search."""
    dense_idx = work / "idx-dense-only"
    t_dense, *_ = retrctl("index", scifact, "--model", model, "--heads", "dense", *caps, "--batch-size", a.eval_batch,
                          "-o", dense_idx, "--quiet", "--rebuild")
    from retrctl.indexes import store

    version = store.resolved(idx)
    n = version.manifest["doc_count"]
    size = {p.name: p.stat().st_size for p in version.path.iterdir()}
    from retrctl import records

    first = next(iter(top10(runs["full"])))
    one = work / "one-query.jsonl"
    records.write([q for q in records.read(scifact, "query") if q["query_id"] == first], one)
    lat, nq = {}, 0
    heads = (("dense Flat, full queries", ["--heads", "dense", "--query-encoder", "full"]),
             ("dense Flat, token lookup", ["--heads", "dense", "--query-encoder", "token-lookup"]),
             ("sparse, exact", ["--heads", "sparse", "--sparse-search", "exact"]),
             ("sparse, seismic", ["--heads", "sparse", "--sparse-search", "seismic"]))
    for name, args in heads[: 3 if a.no_seismic else 4]:
        t0, *_ = retrctl("search", idx, one, *args, "-o", work / "one.trec", "--quiet")
        t1, *_ = retrctl("search", idx, scifact, "--hits", 100, *args, "-o", work / "timed.trec", "--quiet")
        nq = len(top10(work / "timed.trec"))
        lat[name] = 1000 * (t1 - t0) / max(1, nq - 1)
    exact, approx = top10(runs["sparse-exact"]), top10(runs.get("sparse-seismic", runs["sparse-exact"]))
    recall = sum(len(set(exact[q]) & set(approx.get(q, []))) for q in exact) / sum(len(v) for v in exact.values())
    dense_mb = size.get("index.faiss", 0) / 2**20
    sparse_mb = (size.get("terms.npy", 0) + size.get("weights.npy", 0)) / 2**20
    lines = [f"| index ({n} docs) | build s | docs/s | size MB |", "|---|---|---|---|",
             f"| dense only (`--heads dense`) | {t_dense:.0f} | {n / t_dense:.1f} | {dense_mb:.1f} |"]
    lines.append(f"| dense + sparse, one pass (default) | {t_both:.0f} | {n / t_both:.1f} | {dense_mb:.1f} + {sparse_mb:.1f} |")
    lines += ["", f"| search ({nq} queries, top 100) | ms/query, model load excluded |", "|---|---|",
              *[f"| {k} | {v:.1f} |" for k, v in lat.items()], ""]
    if not a.no_seismic:
        lines.append(f"Seismic recall@10 against exact sparse search: {recall:.3f} (query cut 20, heap factor 0.9; "
                     f"{nq} queries).")
    return lines


def recipe_options(p: argparse.ArgumentParser) -> None:
    """The training recipe and evaluation slice shared with bench/m3.py (bench/train_quality.py's minilm task)."""
    p.add_argument("--mine-retriever", default="bm25")
    p.add_argument("--train-queries", type=int, default=None)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--group-size", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--temperature", type=float, default=0.05)
    p.add_argument("--query-max-len", type=int, default=64)
    p.add_argument("--passage-max-len", type=int, default=256)
    p.add_argument("--eval-docs", type=int, default=None)
    p.add_argument("--eval-queries", type=int, default=None)
    p.add_argument("--eval-batch", type=int, default=64)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="minilm")
    p.add_argument("--work", default=str(ROOT / "bench" / "work" / "light"))
    recipe_options(p)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--eval-max-len", type=int, default=256)
    p.add_argument("--heads", default="dense,sparse", help="dense, or dense,sparse: also train the SPLADE head and "
                   "add its rows (token-count queries, and fused with each dense query side).")
    p.add_argument("--reuse", action="store_true", help="Reuse the trained model in --work if present.")
    p.add_argument("--encoder", default=None, help="Encoder and memory flags for train, one string (default: "
                   "smollm2's of bench/train_quality.py for --model smollm2, none for other models).")
    p.add_argument("--no-seismic", action="store_true", help="Exact sparse search only (no Seismic rows): where "
                   "pyseismic-lsr >= 0.5.4 cannot be installed (it has no cp312 wheel).")
    a = p.parse_args()
    if a.encoder is None:
        a.encoder = SMOLLM2 if a.model == "smollm2" else ""
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    scifact = slice_beir(DATA / "scifact", work, a.eval_docs, a.eval_queries)
    model, idx = work / "light-trained", work / "idx"
    t_train = float("nan")
    if not (a.reuse and (model / "token_lookup").is_dir()):
        groups = train_groups(a, work)
        prompt = ["--query-prompt", SMOLLM2_PROMPT] if a.model == "smollm2" else []
        how = [*a.encoder.split(), *prompt, "--query-encoder", "token-lookup", "--heads", a.heads]
        t_train = train(a, groups, a.model, model, how, a.steps, a.lr, a.batch_size, a.group_size, a.passage_max_len)
    table = json.loads((model / "token_lookup" / "config.json").read_text())
    caps = ["--passage-max-len", a.eval_max_len, "--query-max-len", a.eval_max_len]
    # The index is rebuilt even with --reuse: its build time is one of the figures.
    t_index, *_ = retrctl("index", scifact, "--model", model, *caps, "--batch-size", a.eval_batch, "-o", idx, "--quiet", "--rebuild")
    retrctl("index", scifact, "--method", "bm25", "-o", work / "idx-bm25", "--quiet", "--rebuild")
    rows, runs = [], {}
    dense = ["--heads", "dense"] if "sparse" in a.heads else []
    for enc in ("full", "token-lookup"):
        runs[enc] = run = work / f"run-{enc}.trec"
        t, *_ = retrctl("search", idx, scifact, "--hits", 100, "--query-encoder", enc, *dense, "-o", run, "--quiet")
        rows.append((enc, ndcg(run, scifact), f"{t:.1f}"))
    runs["bm25"] = work / "run-bm25.trec"
    retrctl("search", work / "idx-bm25", scifact, "--hits", 100, "-o", runs["bm25"], "--quiet")
    rows.append(("BM25", ndcg(runs["bm25"], scifact), ""))
    lexical, costs = ["bm25"], []
    if "sparse" in a.heads:  # the learned sparse head, in the same index: docs by SPLADE, queries by token counts
        for search in ("exact",) if a.no_seismic else ("exact", "seismic"):
            runs[f"sparse-{search}"] = run = work / f"run-sparse-{search}.trec"
            t, *_ = retrctl("search", idx, scifact, "--hits", 100, "--heads", "sparse", "--sparse-search", search, "-o", run, "--quiet")
            rows.append((f"sparse head, token-count queries ({search})", ndcg(run, scifact), f"{t:.1f}"))
        runs["sparse"] = runs["sparse-exact"]
        lexical.append("sparse")
        for enc in ("full", "token-lookup"):  # the index's own fusion of its two heads (search's default)
            run = work / f"run-{enc}+sparse-heads.trec"
            t, *_ = retrctl("search", idx, scifact, "--hits", 100, "--query-encoder", enc, "-o", run, "--quiet")
            rows.append((f"**{enc} + sparse head, one search (linear min-max)**", ndcg(run, scifact), f"{t:.1f}"))
        costs = index_costs(a, work, scifact, model, idx, caps, t_index, runs)
    for lex in lexical:
        for enc in ("full", "token-lookup"):
            for fusion in (["--fusion", "rrf"], ["--fusion", "linear", "--norm", "minmax"]):
                out = work / f"run-{enc}+{lex}-{fusion[1]}.trec"
                retrctl("fuse", runs[enc], runs[lex], *fusion, "--hits", 100, "-o", out, "--quiet")
                rows.append((f"{enc} + {lex}, {' '.join(fusion[1:])}", ndcg(out, scifact), ""))
    full = rows[0][1]
    lines = [f"## LightRetriever token lookup, {a.model} on SciFact test ({time.strftime('%Y-%m-%d')})", "",
             f"`python bench/light.py {' '.join(sys.argv[1:])}`: train {t_train / 60:.1f} min "
             f"({a.encoder + ' ' if a.encoder else ''}--query-encoder token-lookup --heads {a.heads}), table {table['vocab']}×{table['hidden']} built in {table['seconds']} s, "
             f"index {t_index / 60:.1f} min.", "",
             "| query encoder | nDCG@10 | of full | search s (incl. load) |", "|---|---|---|---|",
             *[f"| {e} | {s:.4f} | {100 * s / full:.1f} % | {t} |" for e, s, t in rows], "", *costs]
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
