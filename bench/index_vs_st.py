"""Benchmark: `retrctl index --model DIST` against sentence-transformers + faiss on the same docs.

The peer: ``SentenceTransformer(DIST).encode(texts, batch_size=32, normalize_embeddings=True)`` into a faiss
``IndexFlatIP`` (what a user writes by hand). retrctl: ``retrctl index DOCS --model M -o IDX`` for M = DIST (torch),
DIST/onnx (fp32) and DIST/onnx/model_int8.onnx, each a child process as a user runs it (model load, encode,
faiss, manifest, atomic publish included); the peer runs in a child process too (`python -c`), so both pay
their imports and model load. The same 1,000 SciFact docs (bench/_run.subcorpus), rounds interleaved, best of
each. The export is the one bench/export.py makes (`retrctl export minilm`), reused from ``--work``.

    flock /work/bench.lock .venv/bin/python bench/index_vs_st.py --work /work/bench-work/e-export
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from _run import retrctl, subcorpus

from retrctl import records

PEER = """
import json, sys, faiss
from sentence_transformers import SentenceTransformer
docs = [json.loads(l) for l in open(sys.argv[1])]
texts = [(d.get("title", "") + " " + d["text"]).strip() for d in docs]
m = SentenceTransformer(sys.argv[2], device="cpu")
v = m.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
idx = faiss.IndexFlatIP(v.shape[1]); idx.add(v); faiss.write_index(idx, sys.argv[3])
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/work/bench-work/e-export"))
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    dist = args.work / "minilm-dist"
    if not (dist / "export.json").is_file():
        retrctl("export", "minilm", "-o", dist)
    docs, _, _ = subcorpus(args.docs, 100)
    corpus = args.work / "index_vs_st_docs.jsonl"
    records.write(docs, corpus)
    variants = {"sentence-transformers + faiss (torch)": None, "retrctl index, torch": dist,
                "retrctl index, onnx fp32": dist / "onnx", "retrctl index, onnx int8": dist / "onnx" / "model_int8.onnx"}
    best = {k: float("inf") for k in variants}
    for r in range(args.rounds):
        for name, model in variants.items():
            out = args.work / f"ivs-{r}-{len(name)}"
            t0 = time.perf_counter()
            if model is None:
                subprocess.run([sys.executable, "-c", PEER, str(corpus), str(dist), str(out) + ".faiss"], check=True)
            else:
                retrctl("index", corpus, "--model", model, "--batch-size", 32, "-o", out, "--rebuild", "--quiet", log=False)
            best[name] = min(best[name], time.perf_counter() - t0)
            print(f"round {r + 1}: {name} {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    peer = best["sentence-transformers + faiss (torch)"]
    print(f"{len(docs)} SciFact docs, batch 32, each a child process (imports and model load included), best of {args.rounds}\n")
    print("| indexer | best (s) | docs/s | vs ST + faiss |")
    print("|---|---:|---:|---:|")
    for name, t in best.items():
        print(f"| {name} | {t:.1f} | {len(docs) / t:.1f} | {peer / t:.2f}× |")


if __name__ == "__main__":
    main()
