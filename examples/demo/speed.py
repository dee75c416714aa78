"""The demo's last lines: the exported model loads with stock sentence-transformers, and what the fast paths buy.

    python speed.py MODEL DIST CORPUS QUERIES

MODEL: the delivered retrctl model; DIST: its `retrctl export`. Prints (stdout) how close
`SentenceTransformer(DIST)` is to retrctl's vectors, the ONNX encode speed against PyTorch on the corpus's first
PASSAGES passages (two batches: enough for a ratio, a few seconds), and, for a model trained with
--query-encoder token-lookup, the token-lookup query encoding speed against the full query encoder. Each pair runs
in this process, interleaved, best of three (the machine is shared: only ratios are printed).
"""

from __future__ import annotations

import sys
import time

PASSAGES = 64


def interleaved_best(a, b, rounds: int) -> tuple[float, float]:
    """Best wall time of each of two callables over ``rounds`` alternating runs (load changes hit both)."""
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, fn in enumerate((a, b)):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best[0], best[1]


def main(model: str, dist: str, corpus: str, queries: str) -> None:
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from retrctl import records
    from retrctl.models import Encoder, lookup
    from retrctl.models.runtime import OnnxEncoder

    texts = [records.passage_text(d) for d in records.read(corpus, "doc")][:PASSAGES]
    qs = [q["query_text"] for q in records.read(queries, "query")]

    torch_enc = Encoder.load(model, device="cpu", inference=True)
    stock = SentenceTransformer(dist, device="cpu")
    diff = float(np.abs(stock.encode_document(texts[:32], batch_size=32) - torch_enc.encode(texts[:32])).max())
    print(f"SentenceTransformer('{dist}') loads the delivered model: max |diff| to retrctl's vectors {diff:.1e}")

    onnx_enc = OnnxEncoder.load(f"{dist}/onnx/model.onnx")
    t_torch, t_onnx = interleaved_best(lambda: torch_enc.encode(texts, batch_size=32),
                                       lambda: onnx_enc.encode(texts, batch_size=32), 3)
    print(f"ONNX fp32 encodes {len(texts)} passages {t_torch / t_onnx:.2f}x as fast as PyTorch (this CPU, this run)")

    if not lookup.has_table(model):
        return
    light = lookup.TokenLookupEncoder.load(model)
    t_full, t_light = interleaved_best(lambda: torch_enc.encode(qs, kind="query", batch_size=len(qs)),
                                       lambda: light.encode(qs), 3)
    print(f"token-lookup query encoding: {t_full / t_light:.0f}x as fast as the full query encoder "
          f"({len(qs)} queries, one batch, no transformer loaded)")


if __name__ == "__main__":
    main(*sys.argv[1:5])
