"""What fusing adapted models with the base model and BM25 would deliver: the table a multi-model delivery is chosen on.

    python bench/ensembles.py OUT NAME=WORK[:RUN] [NAME=WORK[:RUN] …]

Each WORK is a `bench/recipe_suite.py WORK … AUDIT=1` work dir; NAME labels the dense run WORK/<collection>/RUN.trec
(default RUN: trained, the model the guard weighed at α = 1; alpha-0.5 is bench/wise_alpha.py's halfway model), the
folder's test queries searched with that model. The controls are the first WORK's: base dense (base.trec) and the
base hybrid (base-hybrid.trec); the first WORK's delivered.trec is what its recipe delivered. Every other row is a
linear min-max fusion (`retrctl fuse`) at the recipe's DENSE_WEIGHT w on the dense side, fixed (no held-out sweep),
split equally among its dense lists, 1 − w on BM25: each model + BM25; the base, each model and BM25 (w/2 each
dense list); and, given several models, all of them with and without the base. The guarded row is what a recipe
could deliver: the base, the first model and BM25 where the first WORK's guard passes training (its pick among the
candidates up to GUARD_ALPHAS, guard.json's own test), else the base hybrid. Runs are written to OUT/<collection>.

Prints per rule and collection delivered − the better control (base dense, base hybrid) with the paired p against
it (`retrctl eval --json`), then per rule the mean over the collections, the collections significantly below a
control (p < .05, against either) and those above the better one at p < .05: the issue's acceptance counts. Reads
runs only: nothing is encoded."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _run import retrctl
from recipe_suite import LEVEL, SUITE, folder, makefile_default
from wise_alpha import capped_pick


def rules(models: list[str], w: float) -> dict[str, list[tuple[str, float]]]:
    """Rule label -> the runs fused (model names, "base", "bm25") with their weights."""
    out = {}
    for m in models:
        out[f"{m} + BM25"] = [(m, w), ("bm25", 1 - w)]
        out[f"base + {m} + BM25"] = [("base", w / 2), (m, w / 2), ("bm25", 1 - w)]
    if len(models) > 1:
        out["all models + BM25"] = [*((m, w / len(models)) for m in models), ("bm25", 1 - w)]
        n = len(models) + 1
        out["base + all models + BM25"] = [("base", w / n), *((m, w / n) for m in models), ("bm25", 1 - w)]
    return out


def evaluate(data: Path, baseline: Path, runs: list[Path]) -> dict[Path, dict]:
    """nDCG@10 of ``baseline`` and each run, with each run's paired p against ``baseline``."""
    out = retrctl("eval", baseline, *runs, "--qrels", data, "-m", "nDCG@10", "--json", "--quiet", log=False).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return {Path(r["run"]): r for r in rows}


def collection(name: str, work: Path, models: dict[str, Path], out: Path, table: dict[str, list]) -> dict:
    """Per rule: (nDCG@10, p against base dense, p against the base hybrid) on collection ``name``; ``work``: the
    first WORK's collection dir (the controls), ``models``: each model's run."""
    data = folder(name, work.parent)
    files = {"base": work / "base.trec", "bm25": work / "bm25.trec", **models}
    out.mkdir(parents=True, exist_ok=True)
    runs = {"delivered (the first WORK's recipe)": work / "delivered.trec"}
    guarded = next(label for label in table if label.startswith("base + "))
    for label, parts in table.items():
        path = out / (label.replace(" + ", "+").replace(" ", "-") + ".trec")
        if not path.exists():
            retrctl("fuse", *(files[m] for m, _ in parts), "--fusion", "linear", "--norm", "minmax", "--weights",
                    ",".join(f"{x:g}" for _, x in parts), "--hits", 100, "-o", path, log=False)
        runs[label] = path
    passed = capped_pick(json.loads((work / "model" / "guard.json").read_text()),
                         max(float(x) for x in makefile_default("GUARD_ALPHAS").split(","))) > 0
    runs["guarded: " + guarded + " where the guard passes training"] = runs[guarded] if passed else work / "base-hybrid.trec"
    vs_base = evaluate(data, work / "base.trec", list(runs.values()))
    vs_hybrid = evaluate(data, work / "base-hybrid.trec", list(runs.values()))
    base, hybrid = vs_base[work / "base.trec"]["nDCG@10"], vs_hybrid[work / "base-hybrid.trec"]["nDCG@10"]
    return {"base": base, "hybrid": hybrid,
            "rules": {label: (vs_base[p]["nDCG@10"], vs_base[p]["p_value"]["nDCG@10"], vs_hybrid[p]["p_value"]["nDCG@10"])
                      for label, p in runs.items()}}


def report(rows: dict[str, dict]) -> str:
    names = list(rows)
    labels = list(next(iter(rows.values()))["rules"])
    lines = ["| rule | " + " | ".join(names) + " | mean | below a control | above the better at p < .05 |",
             "|---|" + "---:|" * (len(names) + 1) + "---|---|"]
    for label in labels:
        cells, deltas, below, above = [], [], [], []
        for n in names:
            r = rows[n]
            ndcg, p_base, p_hybrid = r["rules"][label]
            better, p = (r["base"], p_base) if r["base"] >= r["hybrid"] else (r["hybrid"], p_hybrid)
            deltas.append(ndcg - better)
            cells.append(f"{ndcg - better:+.4f} ({p:.2g})")
            if (ndcg < r["base"] and p_base < LEVEL) or (ndcg < r["hybrid"] and p_hybrid < LEVEL):
                below.append(n)
            if ndcg > better and p < LEVEL:
                above.append(n)
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {sum(deltas) / len(deltas):+.4f} | "
                     f"{', '.join(below) or 'none'} | {len(above)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="where the fused runs are written (one folder per collection)")
    ap.add_argument("models", nargs="+", help="NAME=WORK[:RUN]: a suite work dir and the dense run to fuse")
    a = ap.parse_args()
    sources: dict[str, tuple[Path, str]] = {}
    for spec in a.models:
        name, sep, rest = spec.partition("=")
        work, _, run = rest.partition(":")
        if not sep or not name or not work:
            sys.exit(f"{spec}: expected NAME=WORK[:RUN]")
        sources[name] = (Path(work).resolve(), run or "trained")
    names = [n for n in SUITE if all((w / n / f"{r}.trec").exists() for w, r in sources.values())]
    if not names:
        sys.exit("no collection of the suite has every model's run")
    table = rules(list(sources), float(makefile_default("DENSE_WEIGHT")))
    first = next(iter(sources.values()))[0]
    rows = {n: collection(n, first / n, {m: w / n / f"{r}.trec" for m, (w, r) in sources.items()}, a.out / n, table)
            for n in names}
    print(f"# ensembles: delivered − the better control (p), dense weight {makefile_default('DENSE_WEIGHT')}; "
          + ", ".join(f"{m} = {w}/…/{r}.trec" for m, (w, r) in sources.items()))
    print(report(rows))


if __name__ == "__main__":
    main()
