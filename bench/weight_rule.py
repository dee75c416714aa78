"""Bench: which rule should pick the recipe's fusion weight (dense, BM25) from its held-out generated queries?

Over the finished collections of recipe_suite.py work dirs, three rules scored on the test queries: the recipe's
(the best mean on the held-out queries, `fuse --weights-from` of `eval --sweep`, ties to 0.5), a gated one (leave
0.5 only when the best weight beats 0.5 there at p < 0.05, eval's paired t-test) and 0.5 fixed. Reads each
collection's dev-base/dev-bm25 (held-out) and base/bm25 (test) runs; writes fused runs under --work.

    python bench/recipe_suite.py W ADAPT=query AUDIT=1 && python bench/weight_rule.py W [W2 …] --work WR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _run import retrctl
from recipe_suite import SUITE, scores

WEIGHTS = [round(i / 10, 1) for i in range(11)]
LEVEL = 0.05


def fused(a: Path, b: Path, w: float, out: Path) -> str:
    """``a`` and ``b`` fused at weight ``w`` (dense), written once to ``out``; its run name (``scores``' key)."""
    if not out.exists():
        retrctl("fuse", a, b, "--fusion", "linear", "--norm", "minmax", "--weights", f"{w},{round(1 - w, 1)}",
                "--hits", 100, "-o", out, "--quiet", log=False)
    return out.name.removesuffix(".trec")


def collection(w: Path, work: Path) -> tuple:
    """(held-out queries, the recipe's weight, its held-out p vs 0.5, the gated weight, test nDCG@10 of the
    recipe's, the gated and 0.5)."""
    tag = f"{w.parent.name}-{w.name}"
    dev = {x: fused(w / "dev-base.trec", w / "dev-bm25.trec", x, work / f"{tag}-dev-{x}.trec") for x in WEIGHTS}
    held = scores(work, w / "dev-qgen.jsonl", dev[0.5], [dev[x] for x in WEIGHTS if x != 0.5])
    mean = {x: held[dev[x]]["nDCG@10"] for x in WEIGHTS}
    p = {x: held[dev[x]].get("p_value", {}).get("nDCG@10", 1.0) for x in WEIGHTS}  # 0.5: the reference
    best = max(WEIGHTS, key=lambda x: (mean[x], -abs(x - 0.5)))
    gated = best if p[best] < LEVEL else 0.5
    queries = json.loads((w / "base.trec.manifest.json").read_text())["queries"]
    test = {x: fused(w / "base.trec", w / "bm25.trec", x, work / f"{tag}-test-{x}.trec") for x in {best, gated, 0.5}}
    t = scores(work, queries, test[0.5], [test[x] for x in {best, gated} - {0.5}])
    return (held[dev[0.5]]["counts"]["evaluated"], best, p[best], gated, t[test[best]]["nDCG@10"],
            t[test[gated]]["nDCG@10"], t[test[0.5]]["nDCG@10"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suites", nargs="+", type=Path, help="recipe_suite.py work dirs.")
    ap.add_argument("--work", type=Path, required=True, help="Where the fused runs go.")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    print("| suite | collection | held-out queries | recipe's weight (dense) | its held-out p vs 0.5 | gated weight | "
          "test: recipe's | gated | 0.5 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for suite in a.suites:
        rows = [(name, *collection(suite / name, a.work)) for name in SUITE if (suite / name / "eval.txt").exists()]
        for name, n, best, p, gated, t_best, t_gated, t_half in rows:
            print(f"| {suite.name} | {name} | {n} | {best} | {p:.2g} | {gated} | {t_best:.4f} | {t_gated:.4f} | "
                  f"{t_half:.4f} |")
        means = [sum(r[i] for r in rows) / len(rows) for i in (5, 6, 7)] if rows else []
        print(f"| {suite.name} | mean of {len(rows)} | | | | | " + " | ".join(f"{m:.4f}" for m in means) + " |")


if __name__ == "__main__":
    main()
