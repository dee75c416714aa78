"""What qgen's filters kept in a recipe suite's runs: per collection, the counts its manifests record and some kept
queries verbatim.

    python bench/qgen_counts.py SUITE_WORK [--examples 10]

Reads WORK/<name>/qgen.jsonl and dev-qgen.jsonl with their manifests (the training and the held-out documents'
generated queries of `bench/recipe_suite.py`), sums each filter's count over the two, and prints one table, then the
first ``--examples`` kept training queries of each collection with the start of their document's text."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from recipe_suite import COLLECTIONS, folder

COUNTS = ("generated", "too_short", "too_long", "duplicate", "copied", "chatter", "kept")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work", type=Path)
    ap.add_argument("--examples", type=int, default=10)
    a = ap.parse_args()
    work = a.work.resolve()
    names = [n for n in COLLECTIONS if (work / n / "qgen.jsonl.manifest.json").exists()]
    print("| collection | " + " | ".join(COUNTS) + " | kept share |")
    print("|---|" + "---:|" * (len(COUNTS) + 1))
    for name in names:
        total = dict.fromkeys(COUNTS, 0)
        for f in ("qgen", "dev-qgen"):
            manifest = work / name / f"{f}.jsonl.manifest.json"
            if manifest.exists():
                counts = json.loads(manifest.read_text())["counts"]
                total = {k: total[k] + counts.get(k, 0) for k in COUNTS}
        share = total["kept"] / total["generated"] if total["generated"] else 0.0
        print(f"| {name} | " + " | ".join(str(total[k]) for k in COUNTS) + f" | {share:.0%} |")
    for name in names:
        from retrctl import records

        docs = {d["docid"]: d for d in records.read(folder(name, work), "doc")}
        kept = [json.loads(line) for line in (work / name / "qgen.jsonl").read_text().splitlines()][: a.examples]
        print(f"\n{name}:")
        for q in kept:
            text = " ".join(records.passage_text(docs[q["source_docid"]]).split()[:12])
            print(f"- {q['query_text']!r}  ← {text} …")


if __name__ == "__main__":
    main()
