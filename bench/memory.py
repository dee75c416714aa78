"""Benchmark: retrctl's memory estimate of one training step against the measured peak RSS of the process.

Each row runs `retrctl train` for one step (`--max-steps 1`) in a child process on SciFact groups (train queries,
their judged positive, random corpus negatives; SciFact abstracts are longer than 256 tokens, so passages run at
the max length, and step 1 is padded to it anyway), with the mode forced (`--grad-cache off`, or `on` with a
chunk), and reads the plan retrctl wrote to train_config.json. "estimated" is the plan's peak (what the process
held when planning + gradients and AdamW state + activations); "measured" is the child's peak resident set
(`wait4` ru_maxrss, what `/usr/bin/time -v` reports). A ratio above 1 means retrctl over-estimates (safe).

    python bench/memory.py                  # minilm and smollm2, three plain shapes each + one GradCache row
    python bench/memory.py --models minilm  # one model

Then the same for inference batches (what index/mine/search run): a child encodes 2 batches of SciFact docs at
the max length; "estimated" is what it held after loading + the weights (mapped lazily) + batch ×
memory.inference_per_text.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

from _run import DATA, ROOT, run_measured

DATA = Path(os.environ.get("RETRCTL_DATA", DATA))  # a copy of the checkout elsewhere still finds ../shared/data

# (model, batch, group size, max len, grad-cache mode, chunk)
CASES = [
    ("minilm", 8, 4, 256, "off", None),
    ("minilm", 32, 2, 256, "off", None),
    ("minilm", 16, 8, 128, "off", None),
    ("minilm", 16, 4, 256, "on", 8),
    ("smollm2", 4, 2, 512, "off", None),
    ("smollm2", 8, 2, 256, "off", None),
    ("smollm2", 16, 4, 128, "off", None),
    ("smollm2", 8, 2, 512, "on", 4),
]


# (model, batch, max len): inference batches (index/mine/search), no graph kept
ENCODE_CASES = [("minilm", 64, 256), ("smollm2", 16, 512), ("smollm2", 64, 512)]

ENCODE_CHILD = """
import json, sys
from retrctl import memory, records
from retrctl.models import Encoder
model, batch, length, corpus = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
texts = [d["title"] + " " + d["text"] for d, _ in zip(records.read(corpus, "doc"), range(2 * batch))]
enc = Encoder.load(model, device="cpu", passage_max_len=length)
held = memory.rss()
used = enc.fit_batch("passage", batch)
per_text = memory.inference_per_text(enc.model.config, length)
enc.encode(texts, batch_size=batch)
print(json.dumps({"held": held + enc.weight_bytes(), "per_text": per_text, "batch": used}))
"""


def groups_file(work: Path, n: int = 64) -> Path:
    from retrctl import records

    data = DATA / "scifact"
    qrels = records.read_qrels(data / "qrels" / "train.tsv")
    queries = {q["query_id"]: q["query_text"] for q in records.read(data / "queries.jsonl", "query")}
    docids = [d["docid"] for d in records.read(data / "corpus.jsonl", "doc")]
    rng = random.Random(0)
    out = []
    for qid in sorted(qrels)[:n]:
        pos = sorted(qrels[qid])
        negs = [d for d in rng.sample(docids, 12) if d not in pos][:8]
        out.append({"query_id": qid, "query_text": queries[qid], "positive_document_ids": pos, "negative_document_ids": negs})
    path = work / "groups.jsonl"
    path.write_text("".join(json.dumps(g) + "\n" for g in out))
    return path


def run(case, groups: Path, work: Path) -> dict:
    model, b, g, length, mode, chunk = case
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    args = [sys.executable, "-m", "retrctl", "train", str(groups), "--corpus", str(DATA / "scifact" / "corpus.jsonl"),
            "--model", model, "--train-batch-size", str(b), "--train-group-size", str(g), "--query-max-len", str(length),
            "--passage-max-len", str(length), "--max-steps", "1", "--grad-cache", mode, "--save-minutes", "0",
            "-o", str(out), "-q"]
    if chunk:
        args += ["--chunk-size", str(chunk)]
    if model == "smollm2":
        args += ["--pooling", "mean", "--bidirectional"]
    ran = run_measured(args, stdout=None, env={**os.environ, "PYTHONPATH": str(ROOT)})
    plan = json.loads((out / "train_config.json").read_text())["plan"]
    return {"plan": plan, "measured": ran.peak_bytes, "seconds": ran.seconds}


def run_encode(case) -> dict:
    model, batch, length = case
    args = [sys.executable, "-c", ENCODE_CHILD, model, str(batch), str(length), str(DATA / "scifact" / "corpus.jsonl")]
    ran = run_measured(args, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, what=f"encode {case}")
    r = json.loads(ran.stdout.strip().splitlines()[-1])
    return {**r, "estimate": r["held"] + r["batch"] * r["per_text"], "measured": ran.peak_bytes, "seconds": ran.seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["minilm", "smollm2"])
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--encode-only", action="store_true", help="only the inference rows")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="retrctl-memory-"))
    groups = groups_file(work)
    rows = []
    print("| model | batch × group × max len | mode | estimated peak | measured peak RSS | estimate / measured | s |")
    print("|---|---|---|---|---|---|---|")
    for case in CASES:
        if case[0] not in a.models or a.encode_only:
            continue
        r = run(case, groups, work)
        plan, measured = r["plan"], r["measured"]
        mode = f"GradCache, chunk {plan['chunk_size']}" if plan["grad_cache"] else "plain"
        est = plan["peak_bytes"]
        print(f"| {case[0]} | {case[1]} × {case[2]} × {case[3]} | {mode} | {est / 1e9:.2f} GB | {measured / 1e9:.2f} GB "
              f"| {est / measured:.2f} | {r['seconds']:.0f} |", flush=True)
        rows.append({"case": case, **r})
    print()
    print("| model | encode batch × max len | estimated peak | measured peak RSS | estimate / measured | s |")
    print("|---|---|---|---|---|---|")
    for case in ENCODE_CASES:
        if case[0] not in a.models:
            continue
        r = run_encode(case)
        print(f"| {case[0]} | {r['batch']} × {case[2]} | {r['estimate'] / 1e9:.2f} GB | {r['measured'] / 1e9:.2f} GB "
              f"| {r['estimate'] / r['measured']:.2f} | {r['seconds']:.0f} |", flush=True)
        rows.append({"encode": case, **r})
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
