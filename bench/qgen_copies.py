"""qgen's copy checks again over generated queries already made: does a change to them move any verdict?

    python bench/qgen_copies.py WORK [WORK …]

For each WORK/NAME/*qgen.jsonl.candidates.jsonl (what `retrctl qgen` wrote before its filters, with the copy and
copied-passage flags of the code that ran it; NAME a collection of bench/recipe_suite.py, its corpus from there),
the two flags computed again with this checkout's rule, and one line: candidates, and the flags that differ (the
first few such queries shown).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import _run  # noqa: F401  (puts the checkout on sys.path)
from recipe_suite import COLLECTIONS, folder


def main(works: list[Path]) -> None:
    from retrctl import records
    from stages.qgen import copy_flags

    corpora: dict[str, dict] = {}
    for f in sorted(f for w in works for f in w.glob("*/*qgen.jsonl.candidates.jsonl")):
        name = f.parent.name
        if name not in COLLECTIONS:
            continue
        if name not in corpora:
            corpora[name] = {d["docid"]: d for d in records.read(folder(name, f.parent.parent), "doc")}
        rows = [json.loads(line) for line in f.open()][1:]  # the first line is the checkpoint's settings
        differ = {"copied": [], "span": []}
        for r in rows:
            for k, v in copy_flags(r["query_text"], corpora[name][r["source_docid"]]).items():
                if bool(r.get(k)) != v:
                    differ[k].append(r["query_text"][:60])
        shown = [q for qs in differ.values() for q in qs][:4]
        print(f"{name}/{f.name}: {len(rows)} candidates; copied differs {len(differ['copied'])}, "
              f"copied passage differs {len(differ['span'])}" + "".join(f"\n    {q!r}" for q in shown))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main([Path(a).resolve() for a in sys.argv[1:]])
