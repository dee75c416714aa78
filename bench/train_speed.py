"""Benchmark: training throughput of `retrctl train` vs sentence-transformers' MultipleNegativesRankingLoss, and
GradCache's peak memory.

Throughput: query groups per second (1 query + its positive + group_size-1 hard negatives) for the same model, the
same groups in the same order, the same batch size, max lengths, temperature (MNRL scale = 1/τ), AdamW and lr,
measured in one process, one after the other. Step 1 of each is left out of the timing (retrctl pads step 1 to
the max lengths on purpose, so an out-of-memory shows at once). The peer is MNRL's forward/backward driven by a
plain loop (model.tokenize per column + MNRL + AdamW + clipping): the compute of SentenceTransformerTrainer without
its data pipeline, so a conservative peer; with `datasets` installed the script also times the full
SentenceTransformerTrainer. Groups are SciFact train queries with a judged positive and random corpus negatives
(seeded): throughput depends on lengths, not on which negatives.

Memory (--memory): peak memory of one training step at batch 64 × group size 8 with and without --grad-cache,
each in a fresh process: torch.cuda.max_memory_allocated on a GPU, growth of the peak RSS on a CPU.

    python bench/train_speed.py --groups 48 --batch-size 8 --group-size 4 --passage-max-len 128   # small, ~4 min
    python bench/train_speed.py                   # full CPU: 128 groups, batch 16, group 8, len 256: ~40 min on 2 cores
    python bench/train_speed.py --synthetic --device cuda --model DIR --groups 1024 --batch-size 64 --memory  # GPU, ~2 min
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _run import ROOT, machine, peak_bytes  # also puts the checkout on sys.path

DATA = ROOT.parent / "shared" / "data" / "scifact"


def make_groups(data: Path, n: int, group_size: int, seed: int = 0) -> tuple[list[dict], dict]:
    import numpy as np

    from retrctl import records

    corpus = records.read_corpus(data)
    queries = {q["query_id"]: q["query_text"] for q in records.read(data, "query")}
    qrels = records.read_qrels(data, "train")
    ids = sorted(corpus)
    rng = np.random.default_rng(seed)
    groups = []
    for qid in sorted(qrels, key=lambda q: int(q) if q.isdigit() else q)[:n]:
        pos = [d for d, r in qrels[qid].items() if r > 0 and d in corpus]
        if not pos or qid not in queries:
            continue
        negs = []
        while len(negs) < group_size - 1:
            d = ids[int(rng.integers(len(ids)))]
            if d not in pos and d not in negs:
                negs.append(d)
        groups.append({"query_id": qid, "query_text": queries[qid], "positive_document_ids": pos[:1], "negative_document_ids": negs})
    return groups, corpus


def synthetic_groups(n: int, group_size: int, seed: int = 0) -> tuple[list[dict], dict]:
    """Random-word queries (6-20 words) and passages (30-250 words): for machines without the BEIR data."""
    import numpy as np

    rng = np.random.default_rng(seed)
    vocab = ["".join(rng.choice(list("abcdefghijklmnoprstuvwy"), int(rng.integers(3, 9)))) for _ in range(3000)]
    text = lambda lo, hi: " ".join(rng.choice(vocab, int(rng.integers(lo, hi))))  # noqa: E731
    corpus = {f"d{i}": {"title": "", "text": text(30, 250)} for i in range(n * group_size)}
    groups = [{"query_id": f"q{i}", "query_text": text(6, 20), "positive_document_ids": [f"d{i * group_size}"],
               "negative_document_ids": [f"d{i * group_size + j}" for j in range(1, group_size)]} for i in range(n)]
    return groups, corpus


def rate(times: list[float], batch: int) -> float:
    """Groups/s over steps 2..n (step 1 is warm-up)."""
    return (len(times) - 1) * batch / (times[-1] - times[0])


def run_retrctl(groups, corpus, a) -> float:
    from stages.train import train

    times: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        train(groups, corpus=corpus, output=Path(tmp) / "m", model=a.model, batch_size=a.batch_size,
              train_group_size=a.group_size, query_max_len=a.query_max_len, passage_max_len=a.passage_max_len,
              temperature=a.temperature, lr=a.lr, group_by_length=False, device=a.device, max_steps=len(groups) // a.batch_size,
              logging_steps=10**9, on_step=lambda step, m: times.append(time.perf_counter()))
    return rate(times, a.batch_size)


def _st_model(a):
    from sentence_transformers import SentenceTransformer

    from retrctl.models import resolve

    model = SentenceTransformer(str(resolve(a.model)), device=a.device)
    model.max_seq_length = a.passage_max_len
    return model


def _columns(groups, corpus, start, size):
    from retrctl.records import passage_text

    batch = groups[start : start + size]
    cols = [[g["query_text"] for g in batch], [passage_text(corpus[g["positive_document_ids"][0]]) for g in batch]]
    for j in range(len(batch[0]["negative_document_ids"])):
        cols.append([passage_text(corpus[g["negative_document_ids"][j]]) for g in batch])
    return cols


def run_st_loop(groups, corpus, a) -> float:
    import torch
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    torch.manual_seed(0)
    model = _st_model(a)
    model.train()
    loss_fn = MultipleNegativesRankingLoss(model, scale=1.0 / a.temperature)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    times = []
    for start in range(0, len(groups) - a.batch_size + 1, a.batch_size):
        cols = _columns(groups, corpus, start, a.batch_size)
        features = []
        for col in cols:  # the query column is cut at the query length, as retrctl does
            feats = {k: v for k, v in model.tokenize(col).items() if torch.is_tensor(v)}
            if col is cols[0]:
                feats = {k: v[:, : a.query_max_len] for k, v in feats.items()}
            features.append({k: v.to(model.device) for k, v in feats.items()})
        loss = loss_fn(features, None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter())
    return rate(times, a.batch_size)


def run_st_trainer(groups, corpus, a) -> float | None:
    try:
        from datasets import Dataset
    except ImportError:
        return None
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import TrainerCallback

    cols = _columns(groups, corpus, 0, len(groups) // a.batch_size * a.batch_size)
    names = ["anchor", "positive"] + [f"negative_{j}" for j in range(1, len(cols) - 1)]
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter())

    model = _st_model(a)
    with tempfile.TemporaryDirectory() as tmp:
        args = SentenceTransformerTrainingArguments(output_dir=tmp, per_device_train_batch_size=a.batch_size, learning_rate=a.lr,
                                                    num_train_epochs=1, save_strategy="no", report_to=[], logging_steps=10**9,
                                                    use_cpu=a.device == "cpu", dataloader_drop_last=True, seed=0)
        SentenceTransformerTrainer(model=model, args=args, train_dataset=Dataset.from_dict(dict(zip(names, cols, strict=True))),
                                   loss=MultipleNegativesRankingLoss(model, scale=1.0 / a.temperature), callbacks=[Clock()]).train()
    return rate(times, a.batch_size)


# ---------------------------------------------------------------- GradCache memory


def memory_child(a) -> None:
    """One training step at the given batch in this fresh process; prints the peak memory it added (MiB)."""
    import torch

    from retrctl.models import Encoder
    from stages.train import train

    groups, corpus = synthetic_groups(a.batch_size, a.group_size) if a.synthetic else make_groups(Path(a.data), a.batch_size, a.group_size)
    cuda = a.device.startswith("cuda")
    Encoder.load(a.model, device=a.device).encode(["warm up"])
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    base = peak_bytes(a.device)
    peak = {}

    def on_step(step, m):
        peak["v"] = peak_bytes(a.device)

    with tempfile.TemporaryDirectory() as tmp:
        train(groups, corpus=corpus, output=Path(tmp) / "m", model=a.model, batch_size=a.batch_size, train_group_size=a.group_size,
              query_max_len=a.query_max_len, passage_max_len=a.passage_max_len, device=a.device, max_steps=1,
              grad_cache=a.grad_cache, chunk_size=a.chunk_size, on_step=on_step)
    print(json.dumps({"peak_mib": (peak["v"] - base) / 2**20}))


def memory(a) -> list[str]:
    rows = {}
    for gc in (False, True):
        cmd = [sys.executable, __file__, "--memory-child", "--model", a.model, "--device", a.device, "--data", str(a.data),
               "--batch-size", str(a.memory_batch), "--group-size", str(a.group_size), "--query-max-len", str(a.query_max_len),
               "--passage-max-len", str(a.passage_max_len), "--chunk-size", str(a.chunk_size)] + (["--grad-cache"] if gc else [])
        cmd += ["--synthetic"] if a.synthetic else []
        out = subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE)
        rows[gc] = json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]
    what = "max_memory_allocated" if a.device.startswith("cuda") else "peak RSS growth"
    return [f"### GradCache peak memory, one step at batch {a.memory_batch} × group {a.group_size} ({what})", "",
            "| step | peak MiB | vs uncached |", "|---|---|---|",
            f"| uncached | {rows[False]:.0f} | 1.00 |",
            f"| --grad-cache --chunk-size {a.chunk_size} | {rows[True]:.0f} | {rows[True] / rows[False]:.2f} |"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--model", default="minilm")
    p.add_argument("--device", default="cpu")
    p.add_argument("--groups", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--query-max-len", type=int, default=64)
    p.add_argument("--passage-max-len", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.02)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--memory", action="store_true", help="Also measure GradCache peak memory.")
    p.add_argument("--memory-batch", type=int, default=64)
    p.add_argument("--chunk-size", type=int, default=16)
    p.add_argument("--synthetic", action="store_true", help="Random-word groups instead of SciFact (no data needed).")
    p.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--grad-cache", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if a.memory_child:
        return memory_child(a)
    groups, corpus = synthetic_groups(a.groups, a.group_size) if a.synthetic else make_groups(Path(a.data), a.groups, a.group_size)
    source = "synthetic random-word" if a.synthetic else "SciFact train"
    lines = [f"## Training throughput ({time.strftime('%Y-%m-%d')})", "",
             f"Machine: {machine(a.device)}. Model {a.model}, {len(groups)} {source} groups, batch {a.batch_size}, "
             f"group size {a.group_size}, max len {a.query_max_len}/{a.passage_max_len}.", "",
             "| trainer | query groups/s | retrctl / peer |", "|---|---|---|"]
    st = run_st_loop(groups, corpus, a)
    ours = run_retrctl(groups, corpus, a)
    trainer = run_st_trainer(groups, corpus, a)
    lines.append(f"| retrctl train (plain torch) | {ours:.2f} | |")
    lines.append(f"| sentence-transformers MNRL, plain loop | {st:.2f} | {ours / st:.2f}x |")
    if trainer is not None:
        lines.append(f"| sentence-transformers MNRL, SentenceTransformerTrainer | {trainer:.2f} | {ours / trainer:.2f}x |")
    else:
        lines.append("| sentence-transformers MNRL, SentenceTransformerTrainer | (needs `datasets`) | |")
    if a.memory:
        lines += [""] + memory(a)
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
