"""The cost plan's STEP_FACTOR measured from finished recipe runs: the query tower's training seconds over the
encode of its queries (examples/beir/plan.py: a query-side step costs STEP_FACTOR × batch × the encode of a crop).

    python bench/tower_step_factor.py WORK [--only NAME …]     # WORK: a bench/recipe_suite.py work dir

For each collection of WORK whose `ADAPT=both` tower (WORK/NAME/tower) or `ADAPT=query` model (WORK/NAME/model)
trained against the base index's vectors (its train_config.json names a passage index), reads the training's steps
and seconds from its metrics.jsonl and times the encode of a crop as plan.py does (its sample of the collection's
documents cut to CROP_WORDS, the recipe's MODEL; the median of ROUNDS timings), and prints steps, seconds a step,
the crop's encode and their ratio over the batch, then the mean. Run it on an otherwise idle machine, the one the runs were measured on."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from _run import ROOT, machine, recipe_value, work_and_collections
from recipe_suite import COLLECTIONS, folder

sys.path.insert(0, str(ROOT / "examples" / "beir"))
from plan import SAMPLE, crop, per_text  # noqa: E402  (the factor is plan.py's: its crop encode, timed as it times it)

ROUNDS = 5  # the crop encode's median of this many timings: one timing, as plan.py makes it, varies by a fifth


def tower_metrics(w: Path) -> list[dict] | None:
    """The metrics of the training in ``w`` that ran against a passage index (the query tower), if one did."""
    for sub in ("tower", "model"):
        config = w / sub / "train_config.json"
        if config.exists() and json.loads(config.read_text()).get("passage_index"):
            return [json.loads(line) for line in (w / sub / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return None


def main() -> int:
    from retrctl import records
    from retrctl.hashing import sample
    from retrctl.models import Encoder

    work, names = work_and_collections(__doc__, COLLECTIONS)
    rows, encoders = [], {}
    print("| collection | steps | s a step | a crop's encode (ms) | factor |\n|---|---:|---:|---:|---:|")
    for name in names:
        metrics = tower_metrics(work / name)
        if not metrics:
            continue
        data = folder(name, work)
        model, batch, crop_words = recipe_value("$(MODEL) $(BATCH) $(CROP_WORDS)", data).split()
        batch, crop_words = int(batch), int(crop_words)
        enc = encoders.setdefault(model, Encoder.load(model, device="cpu"))
        docs = list(records.read(data, "doc"))
        crops = [crop(d, crop_words) for d in sample(docs, SAMPLE, 1, "docid")]
        t_crop = statistics.median(per_text(enc, crops, "query") for _ in range(ROUNDS))
        seconds = metrics[-1]["elapsed_s"]
        factor = seconds / (len(metrics) * batch * t_crop)
        rows.append(factor)
        print(f"| {name} | {len(metrics)} | {seconds / len(metrics):.3f} | {1000 * t_crop:.2f} | {factor:.2f} |")
    if not rows:
        raise SystemExit(f"tower_step_factor.py: no trained query tower under {work}")
    print(f"| mean of {len(rows)} | | | | {statistics.mean(rows):.2f} |")
    print(f"\n{machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
