"""Bench: which rule should pick the recipe's fusion weight (dense, BM25) from its held-out generated queries?

Over the finished collections of recipe_suite.py work dirs, rules scored on the test queries:
- free: the best mean on the held-out queries (`eval --sweep`, `fuse --weights-from`, ties to 0.5), the recipe's
  rule before DENSE_WEIGHT;
- gated 0.5: leave 0.5 only for a weight better there at p < 0.05 (eval's paired t-test);
- prior: leave --prior (the Makefile's DENSE_WEIGHT) only for a weight better there at p < 0.05, what
  `eval --sweep-prior` and `--weights-from` do now;
- 0.5 fixed.
Then the test curve: each collection's base model and BM25 fused at every weight of the grid, `*` where that is
significantly below the base model alone (p < 0.05), and the mean over the collections: the table DENSE_WEIGHT is
chosen on (the best mean among the weights no collection is significantly below the base model at). Reads each
collection's dev-base/dev-bm25 (held-out) and base/bm25 (test) runs; writes sweeps and fused runs under --work.

    python bench/recipe_suite.py W ADAPT=query ENSEMBLE=0 AUDIT=1 && python bench/weight_rule.py W [W2 …] --work WR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _run import retrctl
from recipe_suite import SUITE, makefile_default, scores

from retrctl.fusion import weights_from

WEIGHTS = [round(i / 10, 1) for i in range(11)]
LEVEL = 0.05


def fused(a: Path, b: Path, w: float, out: Path) -> str:
    """``a`` and ``b`` fused at weight ``w`` (dense), written once to ``out``; its run name (``scores``' key)."""
    if not out.exists():
        retrctl("fuse", a, b, "--fusion", "linear", "--norm", "minmax", "--weights", f"{w},{round(1 - w, 1)}",
                "--hits", 100, "-o", out, "--quiet", log=False)
    return out.name.removesuffix(".trec")


def held_out_weight(w: Path, work: Path, tag: str, prior: float | None) -> tuple[float, int]:
    """The weight a rule picks on the held-out generated queries, through the recipe's own mechanism (`eval
    --sweep`, with `--sweep-prior` when ``prior`` is given, then ``fusion.weights_from``), and the queries counted."""
    sweep = work / f"{tag}-sweep{'' if prior is None else f'-{prior:g}'}.jsonl"
    if not sweep.exists():
        retrctl("eval", w / "dev-base.trec", w / "dev-bm25.trec", "--qrels", w / "dev-qgen.jsonl", "--sweep", "0:1:0.1",
                *(() if prior is None else ("--sweep-prior", prior)), "--fusion", "linear", "--norm", "minmax",
                "-m", "nDCG@10", "--json", "-o", sweep, "--quiet", log=False)
    first = json.loads(sweep.read_text().splitlines()[0])
    return weights_from(sweep)[0][0], first["counts"]["evaluated"]


def test_curve(w: Path, work: Path, name: str) -> dict[float, tuple[float, float]]:
    """The test queries' nDCG@10 of the base model and BM25 fused at each weight, with its paired p against the
    base model alone (signed: negative where below it)."""
    queries = json.loads((w / "base.trec.manifest.json").read_text())["queries"]
    d = work / name
    d.mkdir(exist_ok=True)
    runs = {x: fused(w / "base.trec", w / "bm25.trec", x, d / f"test-{x}.trec") for x in WEIGHTS}
    if not (d / "base.trec").exists():
        (d / "base.trec").symlink_to(w / "base.trec")
    rows = scores(d, queries, "base", list(runs.values()))
    base = rows["base"]["nDCG@10"]
    return {x: (rows[runs[x]]["nDCG@10"], rows[runs[x]]["p_value"]["nDCG@10"] * (1 if rows[runs[x]]["nDCG@10"] >= base else -1))
            for x in WEIGHTS}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suites", nargs="+", type=Path, help="recipe_suite.py work dirs.")
    ap.add_argument("--work", type=Path, required=True, help="Where the fused runs go.")
    ap.add_argument("--prior", type=float, default=float(makefile_default("DENSE_WEIGHT")),
                    help="The prior weight (default: the recipe's DENSE_WEIGHT).")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    curves: dict[str, dict] = {}
    print(f"| suite | collection | held-out queries | free weight | gated 0.5 | prior {a.prior:g} gated | test: free | "
          f"gated 0.5 | prior {a.prior:g} gated | 0.5 fixed |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for suite in a.suites:
        picked = []
        for name in SUITE:
            w = suite / name
            if not (w / "eval.txt").exists():
                continue
            curve = curves.setdefault(name, test_curve(w, a.work, name))
            tag = f"{suite.name}-{name}"
            free, n = held_out_weight(w, a.work, tag, None)
            rules = (free, held_out_weight(w, a.work, tag, 0.5)[0], held_out_weight(w, a.work, tag, a.prior)[0], 0.5)
            picked.append([curve[x][0] for x in rules])
            print(f"| {suite.name} | {name} | {n} | " + " | ".join(f"{x:g}" for x in rules[:3]) + " | "
                  + " | ".join(f"{curve[x][0]:.4f}" for x in rules) + " |")
        means = [sum(col) / len(picked) for col in zip(*picked, strict=True)] if picked else []
        print(f"| {suite.name} | mean of {len(picked)} | | | | | " + " | ".join(f"{m:.4f}" for m in means) + " |")
    print()
    print("| collection (test queries) | " + " | ".join(f"{x:g}" for x in WEIGHTS) + " |")
    print("|---|" + "---:|" * len(WEIGHTS))
    for name, curve in curves.items():
        print(f"| {name} | " + " | ".join(f"{v:.4f}{'*' if p < 0 and -p < LEVEL else ''}" for v, p in curve.values()) + " |")
    if curves:
        print(f"| mean of {len(curves)} | " + " | ".join(
            f"{sum(c[x][0] for c in curves.values()) / len(curves):.4f}" for x in WEIGHTS) + " |")
    print(f"\n*: significantly below the base model alone (paired t-test, p < {LEVEL})")


if __name__ == "__main__":
    main()
