"""Benchmark: what `retrctl train --corpus C --model SMALL --teacher T` costs with its default settings, measured
on a sample of the corpus and projected to the whole corpus (or ``--target-docs``).

The defaults from a corpus alone (``TrainConfig.settle``): 1 epoch, batch 32, so ceil(docs / 32) steps of 32
passages and 32 sentence crops, after the teacher's one pass over every doc's passage and crop. Measured here, in
this process, with CPU seconds (steadier than wall time on a box shared with other jobs):

1. the teacher's encode of ``--sample-docs`` passages and their crops (a seeded sample of the corpus, so the
   lengths are the corpus's);
2. ``--steps`` training steps of the default run on that sample (`stages.train.train` with ``max_steps``), the
   first step left out (it is padded to the max lengths on purpose, to show an out-of-memory at once).

The projection to an idle machine scales CPU seconds by the teacher's measured docs per CPU-second against
``--idle-docs-per-s``, the same teacher's wall docs/s on the idle box (20.8 for MiniLM on SciFact:
bench/RESULTS.md, "Corpus encode throughput").

    nice -n 10 /work/main/.venv/bin/python bench/distill_cost.py --student /tmp/minilm-drop-3
    nice -n 10 /work/main/.venv/bin/python bench/distill_cost.py --student small/ --corpus other/ --idle-docs-per-s 0

One Markdown table on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from pathlib import Path

from _run import DATA, machine


def say(*a):
    print(*a, file=sys.stderr, flush=True)


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of ``fn()``."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=DATA / "scifact")
    ap.add_argument("--student", required=True, help="the pruned model (retrctl prune's -o)")
    ap.add_argument("--teacher", default="minilm")
    ap.add_argument("--sample-docs", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after the first)")
    ap.add_argument("--target-docs", type=int, default=0, help="project to this many docs (0: the corpus's)")
    ap.add_argument("--idle-docs-per-s", type=float, default=20.8, help="the teacher's docs/s on the idle box (0: no "
                    "projection)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    import torch

    from retrctl import records
    from retrctl.models import Encoder
    from retrctl.train.config import TrainConfig
    from retrctl.train.distill import corpus_texts
    from stages.train import train

    corpus = records.read_corpus(a.corpus)
    n_target = a.target_docs or len(corpus)
    ids = random.Random(a.seed).sample(sorted(corpus), min(a.sample_docs, len(corpus)))
    sample = {d: corpus[d] for d in ids}
    pairs = corpus_texts(sample, 42)
    teacher = Encoder.load(a.teacher, device="cpu", inference=True)
    student = Encoder.load(a.student, device="cpu")
    for key in ("query_max_len", "passage_max_len"):  # as the run caps the teacher (TeacherVectors.read_as)
        setattr(teacher.config, key, min(getattr(teacher.config, key), getattr(student.config, key)))
    cfg = TrainConfig().settle(teacher=True, groups=False)
    with torch.inference_mode():
        teacher.encode([p.passage for p in pairs[:8]], batch_size=cfg.chunk_size)  # warm-up
        t_pass = timed(lambda: teacher.encode([p.passage for p in pairs], batch_size=cfg.chunk_size))
        t_crop = timed(lambda: teacher.encode([p.query for p in pairs], kind="query", batch_size=cfg.chunk_size))
    say(f"teacher: {len(pairs)} passages {t_pass[0]:.1f} s wall / {t_pass[1]:.1f} CPU-s, crops {t_crop[0]:.1f} / {t_crop[1]:.1f}")

    marks = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sample.jsonl"
        records.write([{"docid": d, **v} for d, v in sample.items()], path)
        start = (time.perf_counter(), time.process_time())
        train(None, corpus=str(path), output=Path(tmp) / "out", model=str(a.student), teacher=str(a.teacher),
              max_steps=a.steps + 1, on_step=lambda step, m: marks.append((time.perf_counter(), time.process_time())))
        end = (time.perf_counter(), time.process_time())
    per_step = [(marks[-1][i] - marks[0][i]) / a.steps for i in (0, 1)]
    before_step_1 = [marks[0][i] - start[i] for i in (0, 1)]  # loads, crops, teacher pass over the sample, step 1
    after = [end[i] - marks[-1][i] for i in (0, 1)]  # saving and the reload check
    say(f"student: {per_step[0]:.1f} s wall / {per_step[1]:.1f} CPU-s per step of {cfg.batch_size}; save {after[0]:.1f} s")

    steps = math.ceil(n_target / cfg.batch_size) * cfg.epochs
    per_doc_cpu = (t_pass[1] + t_crop[1]) / len(pairs)
    cpu = {"teacher pass": n_target * per_doc_cpu, f"{steps} steps": steps * per_step[1], "save and check": after[1]}
    wall = {"teacher pass": n_target * (t_pass[0] + t_crop[0]) / len(pairs), f"{steps} steps": steps * per_step[0],
            "save and check": after[0]}
    idle = len(pairs) / t_pass[1] / a.idle_docs_per_s if a.idle_docs_per_s else None  # idle wall s per CPU-s here
    print(f"## Default cost of `train --corpus {a.corpus.name} --model {Path(a.student).name} --teacher {a.teacher}` "
          f"for {n_target} docs\n")
    print(f"Defaults: {cfg.epochs} epoch, batch {cfg.batch_size}, lr {cfg.lr:g}: {steps} steps. Measured on "
          f"{len(pairs)} sampled docs and {a.steps} steps (step 1 left out; it took {before_step_1[0]:.0f} s with the "
          f"loads and the sample's teacher pass); {machine()}; load average {open('/proc/loadavg').read().split()[0]}"
          f" at the end.\n")
    print("| part | CPU-s (measured, projected) | wall s at this load | idle wall s (projected) |")
    print("|---|---:|---:|---:|")
    for part in cpu:
        print(f"| {part} | {cpu[part]:.0f} | {wall[part]:.0f} | {f'{cpu[part] * idle:.0f}' if idle else '—'} |")
    total_cpu, total_wall = sum(cpu.values()), sum(wall.values())
    print(f"| **total** | {total_cpu:.0f} | {total_wall / 60:.1f} min | "
          f"{f'{total_cpu * idle / 60:.1f} min' if idle else '—'} |")
    if idle:
        print(f"\nIdle projection: the teacher encodes {len(pairs) / t_pass[1]:.1f} passages per CPU-s here against "
              f"{a.idle_docs_per_s} docs/s wall on the idle box, so 1 CPU-s here ≈ {idle:.2f} s idle wall.")


if __name__ == "__main__":
    main()
