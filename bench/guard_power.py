"""How much evidence the guard would have with more held-out pseudo-queries: a counterfactual on finished recipe runs.

    python bench/guard_power.py SUITE_WORK [--per-doc 4] [--only NAME …]

For each collection of a `bench/recipe_suite.py … AUDIT=1` run (WORK/<name> holding idx-base, idx-trained and
model/guard.json), crops every held-out document (shard 0 of the guard's 10, the documents training never saw)
``--per-doc`` times with another seed than the recipe's, searches them with the base model and with the trained
one (α = 1, the dense head, the whole corpus), and prints the paired gain and p beside the guard's own evidence on
α = 1 and its true change on the test queries: would a guard with more queries of the same kind have decided
otherwise, and rightly?"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _run import retrctl
from recipe_suite import COLLECTIONS, SUITE, folder

SHARDS = 10  # the recipe's GUARD_SHARDS


def crops_evidence(w: Path, data: Path, per_doc: int) -> dict:
    crops = w / f"dev-crops{per_doc}.jsonl"
    if not crops.exists():
        retrctl("crop", data, "--per-doc", per_doc, "--max-words", 32, "--seed", 2, "--shard-id", 0,
                "--shard-num", SHARDS, "-o", crops)
    runs = {}
    for system in ("base", "trained"):
        runs[system] = w / f"dev-crops{per_doc}-{system}.trec"
        if not runs[system].exists():
            retrctl("search", w / f"idx-{system}", crops, "--heads", "dense", "--hits", 100, "-o", runs[system])
    out = retrctl("eval", runs["base"], runs["trained"], "--qrels", crops, "-m", "nDCG@10", "--json", "--quiet",
                  log=False).stdout
    base, trained = (json.loads(line) for line in out.splitlines() if line.strip())
    return {"gain": trained["nDCG@10"] - base["nDCG@10"], "p": trained["p_value"]["nDCG@10"],
            "queries": trained["counts"]["evaluated"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work", type=Path)
    ap.add_argument("--per-doc", type=int, default=4)
    ap.add_argument("--only", action="append", choices=list(COLLECTIONS))
    a = ap.parse_args()
    work = a.work.resolve()
    print(f"| collection | guard: α = 1 held-out gain (p), queries | {a.per_doc} fresh crops a held-out doc: "
          "α = 1 gain (p), queries | α = 1 on the test queries − base dense |")
    print("|---|---|---|---:|")
    for name in a.only or SUITE:
        w = work / name
        if not (w / "idx-trained").exists():
            print(f"{name}: no AUDIT=1 run in {w}", file=sys.stderr)
            continue
        data = folder(name, work)
        guard = json.loads((w / "model" / "guard.json").read_text())
        full = next(c for c in guard["candidates"] if c["alpha"] == 1.0)
        ev = crops_evidence(w, data, a.per_doc)
        out = retrctl("eval", w / "base.trec", w / "trained.trec", "--qrels", data, "-m", "nDCG@10", "--json",
                      "--quiet", log=False).stdout
        base, trained = (json.loads(line) for line in out.splitlines() if line.strip())
        print(f"| {name} | {full['gain']:+.4f} ({full['p']:.2g}), {guard['queries']} | {ev['gain']:+.4f} "
              f"({ev['p']:.2g}), {ev['queries']} | {trained['nDCG@10'] - base['nDCG@10']:+.4f} "
              f"({trained['p_value']['nDCG@10']:.2g}) |")


if __name__ == "__main__":
    main()
