"""What each WiSE-FT interpolation would have delivered on the test queries: the table a guard rule is chosen on.

    python bench/wise_alpha.py WORK [--only NAME …] [--alphas 0.5]

WORK: a `bench/recipe_suite.py WORK … AUDIT=1` work dir (ADAPT=full), each collection's trained model (α = 1) kept
in WORK/NAME/trained. For each α given, the model α·trained + (1 − α)·base (`retrctl.guard.interpolate`, exactly
what the guard scores) is saved to WORK/NAME/alpha-A (unless it is the guard's pick: then the recipe's own
delivered run is that α's), the corpus indexed with it, the folder's queries searched
(`--remove-query` where the recipe searched with it), and its run fused with BM25 as the recipe fuses the adapted
model (its own held-out sweep, DENSE_WEIGHT as the prior). One real-model job at a time: it holds
/tmp/retrctl-bench.lock while it encodes.

Prints per collection the test nDCG@10 of that hybrid at α = 0 (the base hybrid), at each α and at α = 1, each
against the base hybrid with its paired p (`retrctl eval --json`); then what each rule delivers over the suite: the
guard as it runs (its pick), the guard with its candidates capped at each α (the pick among the candidates ≤ α that
pass its test, from the p-values guard.json holds), and each α delivered whatever the held-out queries say. Per
rule: the mean of delivered − the better control (base dense, base hybrid), collections significantly below a
control, collections above the better one at p < .05."""

from __future__ import annotations

import argparse
import fcntl
import json
import shutil
import sys
from pathlib import Path

from _run import retrctl
from recipe_suite import COLLECTIONS, LEVEL, SUITE, folder, fused_as_delivered, scores


def save_interpolated(trained: Path, base: str, alpha: float, out: Path) -> None:
    """``out``: a copy of model dir ``trained`` (real files, not links) holding α·trained + (1 − α)·base
    (`retrctl.guard.interpolate`, exactly what the guard scores; α > 1 extrapolates), written beside and renamed."""
    from retrctl.guard import interpolate
    from retrctl.models import Encoder

    enc = Encoder.load(trained, device="cpu")
    enc.load_state_dict(interpolate(Encoder.load(base, device="cpu").state_dict(), enc.state_dict(), alpha))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(trained, tmp)
    for f in tmp.glob("*.safetensors"):
        f.unlink()
    enc.save(tmp)
    tmp.rename(out)


def interpolated(w: Path, alpha: float) -> str:
    """``idx-alpha-A`` of collection dir ``w``: the corpus indexed with α·trained + (1 − α)·base; returns the name."""
    name = f"alpha-{alpha:g}"
    if not (w / name).exists():
        base = json.loads((w / "model" / "guard.json").read_text())["base_model"]
        save_interpolated(w / "trained", base, alpha, w / name)
    return name


def run_alpha(data: Path, w: Path, alpha: float) -> str:
    """The folder's queries searched with the α model, fused as the recipe delivers: returns the fused run's name."""
    a = interpolated(w, alpha)
    if not (w / f"idx-{a}").exists():
        retrctl("index", data, "--model", w / a, "-o", w / f"idx-{a}")
    if not (w / f"{a}.trec").exists():  # searched as the recipe searched the base model (its SEARCH_FLAGS)
        searched = json.loads((w / "base.trec.manifest.json").read_text())["settings"]
        flags = ["--remove-query"] if searched.get("remove_query") else []
        retrctl("search", w / f"idx-{a}", data, "--hits", 100, *flags, "-o", w / f"{a}.trec")
    return fused_as_delivered(w, a).name.removesuffix(".trec")


def capped_pick(guard: dict, cap: float) -> float:
    """The guard's pick had its candidates been those with α ≤ cap (its own rule, on the rows guard.json keeps)."""
    from retrctl.guard import choose

    return choose([c for c in guard["candidates"] if c["alpha"] <= cap], guard["level"])[0]


def collection(name: str, data: Path, w: Path, alphas: list[float]) -> dict:
    guard = json.loads((w / "model" / "guard.json").read_text())
    runs = {0.0: "base-hybrid", 1.0: "trained-hybrid"}
    fused_as_delivered(w, "trained")
    for a in alphas:  # the α the guard picked is the recipe's own delivered run: nothing to encode
        runs[a] = "delivered" if a == guard["pick"] else run_alpha(data, w, a)
    vs_hybrid = scores(w, data, "base-hybrid", [runs[a] for a in sorted(runs) if a])
    base = scores(w, data, "base", [runs[a] for a in sorted(runs)])
    return {"name": name, "guard": guard, "base": base["base"]["nDCG@10"],
            "alphas": {a: {"ndcg": base[r]["nDCG@10"], "p_base": base[r]["p_value"]["nDCG@10"],
                           "p_hybrid": 1.0 if a == 0 else vs_hybrid[r]["p_value"]["nDCG@10"]}
                       for a, r in runs.items()}}


def outcome(row: dict, alpha: float) -> tuple[float, bool, bool]:
    """(delivered − the better control, significantly below a control, above the better control at p < LEVEL) had
    the collection delivered the α hybrid."""
    r, hybrid = row["alphas"][alpha], row["alphas"][0.0]["ndcg"]
    better, p_better = (row["base"], r["p_base"]) if row["base"] >= hybrid else (hybrid, r["p_hybrid"])
    below = (r["ndcg"] < row["base"] and r["p_base"] < LEVEL) or (r["ndcg"] < hybrid and r["p_hybrid"] < LEVEL)
    return r["ndcg"] - better, below, r["ndcg"] > better and p_better < LEVEL


def table(rows: list[dict], alphas: list[float]) -> str:
    grid = sorted({0.0, 1.0, *alphas})
    lines = ["| collection | base dense | " + " | ".join(f"α = {a:g} + BM25" for a in grid) + " | guard's pick |",
             "|---|---:|" + "---:|" * len(grid) + "---|"]
    for row in rows:
        cells = []
        for a in grid:
            r = row["alphas"][a]
            d = r["ndcg"] - row["alphas"][0.0]["ndcg"]
            cells.append(f"{r['ndcg']:.4f}" + ("" if a == 0 else f" ({d:+.4f}, p {r['p_hybrid']:.2g})"))
        lines.append(f"| {row['name']} | {row['base']:.4f} | " + " | ".join(cells) + f" | α = {row['guard']['pick']:g} |")
    rules = {"the guard (its pick)": lambda row: row["guard"]["pick"]}
    rules |= {f"the guard capped at α = {a:g}": (lambda row, a=a: capped_pick(row["guard"], a)) for a in alphas}
    rules |= {f"α = {a:g} always": (lambda row, a=a: a) for a in grid}
    lines += ["", "| rule | mean delivered − better control | significantly below a control | above the better at p < .05 |",
              "|---|---:|---|---|"]
    for label, pick in rules.items():
        done = [(row["name"], outcome(row, pick(row))) for row in rows]
        mean = sum(o[0] for _, o in done) / len(done)
        below = [n for n, o in done if o[1]]
        above = [n for n, o in done if o[2]]
        lines.append(f"| {label} | {mean:+.4f} | {', '.join(below) or 'none'} | {len(above)} ({', '.join(above) or 'none'}) |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work", type=Path)
    ap.add_argument("--only", action="append", choices=list(COLLECTIONS))
    ap.add_argument("--alphas", default="0.5", help="comma-separated interpolations to encode (0 and 1 exist)")
    a = ap.parse_args()
    alphas = [float(x) for x in a.alphas.split(",")]
    names = [n for n in (a.only or SUITE) if (a.work / n / "trained").is_dir()]
    if not names:
        sys.exit(f"{a.work}: no collection with a kept trained model (run recipe_suite.py with AUDIT=1)")
    with open("/tmp/retrctl-bench.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = [collection(n, folder(n, a.work), a.work / n, alphas) for n in names]
    print(f"# WiSE-FT interpolations delivered, {a.work}")
    print(table(rows, alphas))


if __name__ == "__main__":
    main()
