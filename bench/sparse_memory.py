"""Benchmark: peak memory of the sparse head's projection, chunked over the vocabulary vs the textbook
[batch, tokens, vocab] one, forward and backward, each in a fresh child process (peak RSS over the
process's own baseline after the model is loaded and the backbone has run without gradients), and the bytes autograd
keeps for backward (``memory.probe``, what the training memory plan counts).

    python bench/sparse_memory.py                      # minilm, 32 passages × 256 tokens
    python bench/sparse_memory.py --model smollm2 --batch 8

Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from _run import peak_bytes  # also puts the checkout on sys.path


def child(model: str, mode: str, batch: int, tokens: int, chunk: int) -> dict:
    import torch

    from retrctl import memory
    from retrctl.models import Encoder

    enc = Encoder.load(model, device="cpu", passage_max_len=tokens)
    enc.add_sparse_head()
    enc.sparse.chunk = chunk
    texts = ["retrieval of scientific claims " * 64] * batch
    b = enc.tokenize(texts, "passage")
    with torch.no_grad():  # the backbone's activations would raise the high-water mark the head is measured from
        hidden = enc.model(**b).last_hidden_state
    hidden.requires_grad_()
    head = enc.sparse.naive if mode == "naive" else enc.sparse
    base = peak_bytes()
    t = time.perf_counter()
    w = head(hidden, b["attention_mask"], b["input_ids"])
    w.sum().backward()
    seconds = time.perf_counter() - t
    peak = peak_bytes()
    del w
    hidden.grad = None  # what autograd keeps for backward (the training memory plan's measure), after the peak
    kept = memory.probe(lambda x: head(hidden, x["attention_mask"], x["input_ids"]), lambda n: b, enc, rows=batch) * batch
    return {"mode": mode, "extra_mb": (peak - base) / 2**20, "kept_mb": kept / 2**20, "seconds": seconds,
            "shape": list(b["input_ids"].shape), "vocab": enc.sparse.vocab}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="minilm")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--chunk", type=int, default=8192)
    p.add_argument("--child", default=None)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.model, a.child, a.batch, a.tokens, a.chunk)))
        return
    rows = []
    for mode in ("naive", "chunked"):
        out = subprocess.run([sys.executable, __file__, "--child", mode, "--model", a.model, "--batch", str(a.batch),
                              "--tokens", str(a.tokens), "--chunk", str(a.chunk)], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    b, t = rows[0]["shape"]
    lines = [f"| projection ({a.model}, {b} × {t} tokens, vocab {rows[0]['vocab']}) | peak extra RSS (MB), forward + backward | kept for backward (MB) | s |",
             "|---|---:|---:|---:|",
             *[f"| {r['mode']}{' (' + str(a.chunk) + ' terms per slice)' if r['mode'] == 'chunked' else ''} | "
               f"{r['extra_mb']:.0f} | {r['kept_mb']:.0f} | {r['seconds']:.1f} |" for r in rows]]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
