"""Bench: do the recipe's two held-out choices, the fusion weight and the guard's veto, improve with more held-out
generated queries?

The recipe generates queries for DEV_QGEN_DOCS = 50 held-out documents (shard 0 of its 10 guard shards); its
filters keep 12-34, on which it picks the fusion weight (the sweep's best) and vetoes the trained model. For each
finished collection of recipe_suite.py work dirs (the first dir holding it; AUDIT=1 runs: the trained tower is
kept), this generates queries for up to --docs held-out documents with the recipe's own qgen settings (the 50
resumed from its checkpoint when it ran qgen in-process, so the small set is inside the large one), searches them with the base model, BM25
and the trained model (α = 1), and sets the two sets side by side:

- weight: the sweep's best on each set (`eval --sweep`, `fuse --weights-from`, as the recipe does) and the test
  nDCG@10 of the base model and BM25 fused at it, 0.5 beside;
- veto: α = 1 − the base model on each set (mean nDCG@10 and eval's paired p), beside the same on the test queries.

    python bench/recipe_suite.py W ADAPT=query ENSEMBLE=0 AUDIT=1 && python bench/held_out_size.py W [W2 …] --work H --docs 200
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from _run import retrctl
from recipe_suite import SUITE, folder, scores
from weight_rule import fused

from retrctl.fusion import weights_from

SHARDS = 10  # the recipe's GUARD_SHARDS
FUSE = ("--fusion", "linear", "--norm", "minmax")


def held_out_queries(data: Path, recipe: Path, out: Path, docs: int) -> Path:
    """Generated queries for up to ``docs`` held-out documents, the recipe's settings; its own resumed."""
    path = out / "dev-qgen.jsonl"
    if not path.exists():
        seed = recipe / "dev-qgen.jsonl.candidates.jsonl"
        made = json.loads((recipe / "dev-qgen.jsonl.manifest.json").read_text())["settings"]["model"]["backend"]
        if seed.exists() and made == "hf":  # a server's generations are not resumed in-process (other settings)
            shutil.copy(seed, out / f"{path.name}.candidates.jsonl")
        retrctl("qgen", data, "--llm", "smollm2", "--per-doc", 1, "--seed", 1, "--shard-id", 0, "--shard-num", SHARDS,
                "--sample", docs, "-o", path)
    return path


def chosen_weight(runs: Path, qrels: Path, sweep: Path) -> float:
    """The weight the recipe's rule picks (``fusion.weights_from``: the sweep's best, ties to 0.5) from ``runs``'
    dev-base and dev-bm25 on the held-out set ``qrels``; the sweep is written to ``sweep`` once (the recipe's own, for
    its set)."""
    if not sweep.exists():
        retrctl("eval", runs / "dev-base.trec", runs / "dev-bm25.trec", "--qrels", qrels, "--sweep", "0:1:0.1", *FUSE,
                "-m", "nDCG@10", "--json", "-o", sweep, "--quiet", log=False)
    return weights_from(sweep)[0][0]


def tower(runs: Path, qrels: Path) -> tuple[float, float, int]:
    """α = 1 − the base model on ``qrels``'s queries, ``runs``' dev-trained against dev-base: (gain, paired p,
    queries)."""
    rows = scores(runs, qrels, "dev-base", ["dev-trained"])
    r = rows["dev-trained"]
    return r["nDCG@10"] - rows["dev-base"]["nDCG@10"], r["p_value"]["nDCG@10"], r["counts"]["evaluated"]


def collection(name: str, recipe: Path, out: Path, docs: int) -> dict:
    data = folder(name, recipe.parent)
    out.mkdir(parents=True, exist_ok=True)
    large = held_out_queries(data, recipe, out, docs)
    for run, index, heads in (("base", "idx-base", ("--heads", "dense")), ("bm25", "idx-bm25", ()),
                              ("trained", "idx-trained", ("--heads", "dense"))):
        if not (out / f"dev-{run}.trec").exists():
            retrctl("search", recipe / index, large, *heads, "--hits", 100, "-o", out / f"dev-{run}.trec",
                    "--quiet", log=False)
    row = {"name": name}
    # the recipe's set as the recipe searched and swept it: its sweep, and its dev-trained run where recipe_suite's
    # table made one (else this script's runs of the same queries: the set is inside the large one)
    small = recipe / "dev-qgen.jsonl"
    row["w_small"] = chosen_weight(recipe, small, recipe / "sweep-base.jsonl")
    row["tower_small"] = tower(recipe if (recipe / "dev-trained.trec").exists() else out, small)
    row["w_large"] = chosen_weight(out, large, out / "sweep-large.jsonl")
    row["tower_large"] = tower(out, large)
    for tag, w in (("small", row["w_small"]), ("large", row["w_large"]), ("half", 0.5)):
        row[f"test_{tag}"] = fused(recipe / "base.trec", recipe / "bm25.trec", w, out / f"test-{tag}.trec")
    test = scores(out, qrels_of(recipe), row["test_half"], [row["test_small"], row["test_large"]])
    for k in ("test_small", "test_large", "test_half"):
        row[k] = test[row[k]]["nDCG@10"]
    t = scores(recipe, qrels_of(recipe), "base", ["trained"])
    row["tower_test"] = (t["trained"]["nDCG@10"] - t["base"]["nDCG@10"], t["trained"]["p_value"]["nDCG@10"],
                         t["trained"]["counts"]["evaluated"])
    return row


def qrels_of(recipe: Path) -> str:
    """The test queries' folder, as the recipe's base run recorded it."""
    return json.loads((recipe / "base.trec.manifest.json").read_text())["queries"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suites", nargs="+", type=Path, help="recipe_suite.py work dirs (AUDIT=1), searched in order.")
    ap.add_argument("--work", type=Path, required=True, help="Where the queries and runs go.")
    ap.add_argument("--docs", type=int, default=200, help="Held-out documents to generate for (shard 0 caps it).")
    a = ap.parse_args()
    rows = []
    for name in SUITE:
        recipe = next((s / name for s in a.suites if (s / name / "eval.txt").exists()), None)
        if recipe is not None and (recipe / "idx-trained").exists():
            rows.append(collection(name, recipe, a.work / name, a.docs))
    print("| collection | held-out queries (recipe / large) | weight (recipe / large) | test nDCG@10 at it (recipe / "
          "large / 0.5) | α = 1 − base, recipe's set (p) | large set (p) | test queries (p) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ts, tl, tt = r["tower_small"], r["tower_large"], r["tower_test"]
        print(f"| {r['name']} | {ts[2]} / {tl[2]} | {r['w_small']} / {r['w_large']} | {r['test_small']:.4f} / "
              f"{r['test_large']:.4f} / {r['test_half']:.4f} | {ts[0]:+.4f} ({ts[1]:.2g}) | {tl[0]:+.4f} ({tl[1]:.2g}) "
              f"| {tt[0]:+.4f} ({tt[1]:.2g}) |")
    if rows:
        mean = {k: sum(r[k] for r in rows) / len(rows) for k in ("test_small", "test_large", "test_half")}
        agree = {k: sum((r[f"tower_{k}"][0] > 0) == (r["tower_test"][0] > 0) for r in rows) for k in ("small", "large")}
        print(f"| mean of {len(rows)} | | | {mean['test_small']:.4f} / {mean['test_large']:.4f} / "
              f"{mean['test_half']:.4f} | sign right on {agree['small']} | {agree['large']} | |")


if __name__ == "__main__":
    main()
