"""Every weight sweep of recipe work dirs made again with this checkout: does a change to fusion or eval move a
chosen weight?

    python bench/resweep.py WORK [WORK …]

For each WORK/NAME/sweep-*.jsonl (the recipe's `eval --sweep --json` files: the base's, the trained lists', the
ensemble's), the same sweep again from the settings its rows record (runs, qrels, fusion, prior, known items) into
WORK/NAME/resweep/, and one line: the weights `fuse --weights-from` takes from each file, whether they are the same,
the end rows' nDCG@10 (w = 0 and w = 1) before and after, and how many other rows moved. Nothing else is made, so
it costs one `eval` a sweep file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from _run import retrctl


def sweep_again(old: Path) -> Path:
    rows = [json.loads(line) for line in old.open()]
    s = rows[0]["settings"]
    new = old.parent / "resweep" / old.name
    new.parent.mkdir(exist_ok=True)
    known = s.get("known_items")
    retrctl("eval", *s["runs"], "--qrels", s["qrels"], "--sweep", "0:1:0.1", "--sweep-prior", str(s["prior"]),
            "--fusion", s["fusion"], "--norm", s["norm"], "-m", "nDCG@10", "--json", "-o", new,
            *(("--known-items", known.get("qrels") or known["from"]) if known else ()), log=False)
    return new


def main(works: list[Path]) -> None:
    from retrctl import fusion  # the checkout's (``_run`` put it on sys.path)

    for old in sorted(f for w in works for f in w.glob("*/sweep-*.jsonl")):
        new = sweep_again(old)
        before, after = ([json.loads(line) for line in f.open()] for f in (old, new))
        (w_old, _), (w_new, _) = fusion.weights_from(old), fusion.weights_from(new)
        moved = sum(abs(a["nDCG@10"] - b["nDCG@10"]) > 1e-12 for a, b in zip(before[1:-1], after[1:-1], strict=True))
        print(f"{old.parent.name}/{old.name}: weights {w_old} -> {w_new} "
              f"{'same' if w_old == w_new else 'CHANGED'}; w=0 {before[0]['nDCG@10']:.4f} -> {after[0]['nDCG@10']:.4f}, "
              f"w=1 {before[-1]['nDCG@10']:.4f} -> {after[-1]['nDCG@10']:.4f}; other rows moved: {moved}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main([Path(a).resolve() for a in sys.argv[1:]])
