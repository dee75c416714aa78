"""Benchmark: query encoding by token lookup vs the full query encoder of the same model.

The 300 SciFact test queries, text in → normalised vector out (tokenisation included), in one process: the
full encoder (``Encoder.encode``, torch) and the token table (``TokenLookupEncoder.encode``: tokenize → look up →
average → normalise), at batch 1 (each query alone) and batch 300 (all at once), best of ``--repeats``,
interleaved so machine load hits both alike. The last line is ``speedup <ratio>`` at batch 300.

MODEL is a model dir trained with ``retrctl train --query-encoder token-lookup`` (its table is used), or any model
(a shipped name such as ``minilm`` or ``smollm2``): then the table is built here from its untrained weights into
``--work`` and the time that took is printed — speed does not depend on what the weights learned.

    python bench/query_encode.py minilm
    python bench/query_encode.py smollm2 --pooling mean --bidirectional --instruction
    python bench/query_encode.py bench/work/light/light-trained
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from _run import DATA, ROOT


def interleaved_best(a, b, rounds: int) -> tuple[float, float]:
    """Best wall time of each of two callables over ``rounds`` alternating runs (load changes hit both)."""
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, fn in enumerate((a, b)):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best[0], best[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--work", default=str(ROOT / "bench" / "work" / "query_encode"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pooling")
    p.add_argument("--bidirectional", action="store_true")
    p.add_argument("--instruction", action="store_true", help="both sides encode queries under bench/light.py's "
                   "SciFact instruction (LightRetriever's; a SmolLM2 table is trained with it)")
    a = p.parse_args()

    import light
    import torch

    from retrctl import records
    from retrctl.models import Encoder, lookup

    qrels = records.read_qrels(DATA / "scifact", "test")
    texts = [q["query_text"] for q in records.read(DATA / "scifact", "query") if q["query_id"] in qrels]
    settings = {k: v for k, v in (("pooling", a.pooling), ("bidirectional", a.bidirectional or None),
                                  ("query_prompt", light.SMOLLM2_PROMPT if a.instruction else None)) if v is not None}
    full = Encoder.load(a.model, device="cpu", inference=True, **settings)
    where, built = Path(a.model), None
    if not lookup.has_table(where):
        where = Path(a.work) / Path(a.model).name
        if not lookup.has_table(where):
            where.mkdir(parents=True, exist_ok=True)
            full.save(where)
            lookup.save_table(full, where)
        import json

        built = json.loads((where / lookup.TABLE_DIR / "config.json").read_text())["seconds"]
    light = lookup.TokenLookupEncoder.load(where)
    light.encode(texts[:2])
    full.encode(texts[:2], kind="query")  # warm both up

    rows = []
    for batch in (1, len(texts)):
        def run_full(batch=batch):
            for s in range(0, len(texts), batch):
                full.encode(texts[s : s + batch], kind="query", batch_size=batch)

        def run_light(batch=batch):
            for s in range(0, len(texts), batch):
                light.encode(texts[s : s + batch])

        t_full, t_light = interleaved_best(run_full, run_light, a.repeats)
        rows.append((batch, t_full, t_light))

    agree = float((full.encode(texts, kind="query") * light.encode(texts)).sum(1).mean())
    print(f"query encoding, {len(texts)} SciFact test queries, {a.model} ({full.model.config.model_type}, "
          f"{sum(p.numel() for p in full.model.parameters()) / 1e6:.0f}M params), best of {a.repeats}, "
          f"{torch.get_num_threads()} threads")
    if built is not None:
        print(f"table built here from the untrained weights: {light.table.shape[0]}×{light.table.shape[1]} in {built} s")
    print(f"mean cosine full vs token-lookup query vectors: {agree:.3f}")
    print("| batch | full (ms/query) | token lookup (ms/query) | speed-up |")
    print("|---|---|---|---|")
    for batch, t_full, t_light in rows:
        n = len(texts)
        print(f"| {batch} | {1000 * t_full / n:.3f} | {1000 * t_light / n:.4f} | {t_full / t_light:.0f}× |")
    print(f"speedup {rows[-1][1] / rows[-1][2]:.1f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
