"""Benchmark: an exported model (ONNX fp32, ONNX int8) against retrctl's PyTorch fp32 encoder.

One process, the same 1,000 SciFact docs and the same length-sorted batches for every variant (each encoder's
``encode``), rounds interleaved (torch, onnx, int8, torch, …) so a change of load on this shared box hits all
alike; best (lowest) wall time of each. Also: file size, cosine to torch over all docs, an estimate of the FLOP/s
reached (2 × non-embedding params × tokens + attention, on the padded batches), and SciFact nDCG@10 on a
1,000-doc sub-corpus (every doc judged by the first 100 test queries by sorted id, filled up in corpus order;
exact search, ``retrctl.metrics``). The export is ``retrctl export MODEL`` (reused when ``--work`` has one);
``--formats st,onnx`` for a model whose int8 export fails its parity check (SmolLM2).

    flock /work/bench.lock .venv/bin/python bench/export.py --work /work/bench-work/e-export
    flock /work/bench.lock .venv/bin/python bench/export.py --model TRAINED_SMOLLM2 --formats st,onnx --docs 300 --work W

Markdown table on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from _run import ndcg, nearest, subcorpus

from retrctl import records
from retrctl.models import Encoder
from retrctl.models.runtime import load_encoder
from stages.export import export


def say(*a):
    print(*a, file=sys.stderr, flush=True)


def flops(enc: Encoder, texts: list[str], batch_size: int) -> float:
    """Forward FLOPs of ``encode(texts)`` on its padded, length-sorted batches (matmuls only)."""
    cfg = enc.model.config
    params = sum(p.numel() for n, p in enc.model.named_parameters() if "embeddings" not in n)
    order = sorted(texts, key=len, reverse=True)
    total = 0.0
    for s in range(0, len(order), batch_size):
        width = enc.tokenize(order[s : s + batch_size], "passage")["input_ids"].shape
        b, n = width
        total += 2 * params * b * n + 4 * cfg.num_hidden_layers * b * n * n * cfg.hidden_size
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/work/bench-work/e-export"))
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--formats", default="st,onnx,onnx-int8")
    args = ap.parse_args()
    dist = args.work / f"{Path(args.model).name}-dist"
    if not (dist / "export.json").is_file():
        t0 = time.perf_counter()
        export(args.model, output=dist, formats=args.formats)
        say(f"export: {time.perf_counter() - t0:.1f}s")
    docs, queries, qrels = subcorpus(args.docs, args.queries)
    texts = [records.passage_text(d) for d in docs]
    qids = list(queries)
    encs = {"torch fp32": Encoder.load(args.model, device="cpu"), "onnx fp32": load_encoder(dist / "onnx")}
    sizes = {"torch fp32": (dist / "model.safetensors").stat().st_size, "onnx fp32": (dist / "onnx" / "model.onnx").stat().st_size}
    if (dist / "onnx" / "model_int8.onnx").is_file():
        encs["onnx int8"] = load_encoder(dist / "onnx" / "model_int8.onnx")
        sizes["onnx int8"] = (dist / "onnx" / "model_int8.onnx").stat().st_size
    work = flops(encs["torch fp32"], texts, args.batch_size)
    for e in encs.values():  # warm-up (session init, allocator)
        e.encode(texts[:64], batch_size=args.batch_size)
    best, vecs = {k: float("inf") for k in encs}, {}
    for r in range(args.rounds):
        for name, e in encs.items():
            t0 = time.perf_counter()
            with torch.inference_mode():
                vecs[name] = e.encode(texts, batch_size=args.batch_size)
            dt = time.perf_counter() - t0
            best[name] = min(best[name], dt)
            say(f"round {r + 1}: {name} {dt:.1f}s")
    rows = []
    for name, e in encs.items():
        qv = e.encode([queries[q] for q in qids], "query", batch_size=args.batch_size)
        cos = (vecs[name] * vecs["torch fp32"]).sum(1)
        rows.append((name, best[name], sizes[name], float(cos.mean()), float(cos.min()),
                     ndcg(nearest(qv, vecs[name], qids, [d["docid"] for d in docs]), qrels)))
    base = rows[0]
    print(f"{args.model}: torch threads {torch.get_num_threads()}, onnxruntime default intra-op threads; {len(texts)} docs, batch {args.batch_size}, "
          f"{work / 1e9:.0f} GFLOP per pass (estimate)\n")
    print(f"| variant | best of {args.rounds} (s) | docs/s | vs torch | GFLOP/s | size (MB) | cos to torch mean / min | nDCG@10 | Δ nDCG@10 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, t, size, cmean, cmin, nd in rows:
        print(f"| {name} | {t:.1f} | {len(texts) / t:.1f} | {base[1] / t:.2f}× | {work / t / 1e9:.1f} | {size / 1e6:.1f} | "
              f"{cmean:.5f} / {cmin:.5f} | {nd:.4f} | {nd - base[5]:+.4f} |")


if __name__ == "__main__":
    main()
