"""GPU paths on a lent CUDA machine: DeepSpeed ZeRO 0-3 (nccl), GradCache, LoRA, bf16, encode on CUDA, faiss-gpu.

Builds a tiny random BERT (2 layers, hidden 32) with the all-MiniLM tokenizer and a few groups, then runs
`retrctl train` under torchrun with each configuration and prints a Markdown table: configuration, exit
status, wall time, first and last loss. Also checks that batched and one-at-a-time CUDA encodes agree and
whether faiss sees a GPU.

    RETRCTL_TOKENIZER_DIR=... python bench/gpu_check.py [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tokenizer_dir() -> str:
    if os.environ.get("RETRCTL_TOKENIZER_DIR"):
        return os.environ["RETRCTL_TOKENIZER_DIR"]
    from retrctl.models import locate_shipped

    return str(locate_shipped("minilm"))


def make_fixture(work: Path) -> tuple[Path, Path, Path]:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    model = work / "tiny"
    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=128, max_position_embeddings=128)
    BertModel(cfg).save_pretrained(model)
    tok.save_pretrained(model)
    rng = random.Random(0)
    words = "cat dog tea coffee python rust memory safety language bean leaf water wolf purr code".split()
    docs = [{"docid": f"d{i}", "title": "", "text": " ".join(rng.choices(words, k=rng.randint(8, 40)))} for i in range(400)]
    corpus = work / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    groups = work / "groups.jsonl"
    with groups.open("w") as f:
        for i in range(256):
            pos = docs[i]
            negs = rng.sample([d["docid"] for d in docs if d["docid"] != pos["docid"]], 7)
            q = " ".join(pos["text"].split()[:5])
            f.write(json.dumps({"query_id": f"q{i}", "query_text": q, "positive_document_ids": [pos["docid"]],
                                "negative_document_ids": negs}) + "\n")
    return model, corpus, groups


def run_train(name, args, work, model, corpus, groups, steps, env):
    out = work / f"out-{name}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", str(29500 + hash(name) % 400),
           "-m", "retrctl", "train", str(groups), "--corpus", str(corpus), "--model", str(model), "--max-steps", str(steps),
           "--train-batch-size", "16", "--train-group-size", "4", "--temperature", "0.05", "--lr", "1e-3", "--seed", "1",
           "--save-steps", "1000", "-o", str(out), "--quiet", *args]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.time() - t0
    losses = []
    metrics = out / "metrics.jsonl"
    if metrics.exists():
        losses = [json.loads(line)["loss"] for line in metrics.read_text().splitlines() if '"loss"' in line]
    err = "" if p.returncode == 0 else p.stderr.strip().splitlines()[-1][:160] if p.stderr.strip() else ""
    return {"config": name, "rc": p.returncode, "s": wall, "first": losses[0] if losses else None,
            "last": losses[-1] if losses else None, "error": err}


def encode_check(model: Path) -> str:
    import numpy as np
    import torch

    from retrctl.models import Encoder

    if not torch.cuda.is_available():
        return "no CUDA"
    texts = ["short", "a much longer text about cats and dogs and tea " * 4, "mid length text here"] * 8
    parts = []
    for side in ("left", "right"):
        enc = Encoder.load(model, device="cuda", pooling="mean")
        enc.tokenizer.padding_side = side
        a = enc.encode(texts, batch_size=8)
        b = np.stack([enc.encode([t], batch_size=1)[0] for t in texts])
        parts.append(f"{side} padding min cos {float((a * b).sum(1).min()):.6f}")
    return "; ".join(parts)


def faiss_check() -> str:
    try:
        import faiss
    except ImportError:
        return "faiss not installed"
    n = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    return f"faiss {faiss.__version__}: {n} GPU(s) visible" + ("" if n else " (CPU build; faiss-gpu needs CUDA 12 runtime + cuBLAS wheels, ~600 MB)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    import torch

    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    model, corpus, groups = make_fixture(work)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(work / "ext"))}
    configs = [
        ("plain fp32", []),
        ("plain bf16", ["--dtype", "bf16"]),
        ("grad-cache chunk 8", ["--grad-cache", "--chunk-size", "8"]),
        ("ZeRO-0", ["--zero-stage", "0"]),
        ("ZeRO-1", ["--zero-stage", "1"]),
        ("ZeRO-2", ["--zero-stage", "2"]),
        ("ZeRO-3", ["--zero-stage", "3"]),
        ("ZeRO-2 + LoRA r8", ["--zero-stage", "2", "--lora-r", "8"]),
        ("ZeRO-1 + grad-cache", ["--zero-stage", "1", "--grad-cache", "--chunk-size", "8"]),
        ("ZeRO-2 + grad-cache", ["--zero-stage", "2", "--grad-cache", "--chunk-size", "8"]),
        ("ZeRO-3 + grad-cache + LoRA r8", ["--zero-stage", "3", "--grad-cache", "--chunk-size", "8", "--lora-r", "8"]),
    ]
    rows = [run_train(n, a, work, model, corpus, groups, args.steps, env) for n, a in configs]
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    out = [f"## GPU paths ({dev}; torch {torch.__version__}; {platform.python_version()}; {args.steps} steps, tiny BERT)", "",
           "| configuration | exit | wall s | first loss | last loss | note |", "|---|---|---|---|---|---|"]
    for r in rows:
        f = "" if r["first"] is None else f"{r['first']:.4f}"
        la = "" if r["last"] is None else f"{r['last']:.4f}"
        out.append(f"| {r['config']} | {r['rc']} | {r['s']:.1f} | {f} | {la} | {r['error']} |")
    out += ["", f"- encode on CUDA, batched vs one at a time: {encode_check(model)}", f"- {faiss_check()}"]
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
