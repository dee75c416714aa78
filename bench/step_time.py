"""The recipe's whole-model training step on this CPU: seconds a step with the model's attention dropout and
without it, in fp32 and in bf16 mixed precision.

    python bench/step_time.py W/groups.jsonl --corpus DATA [--steps 9]      # W: a recipe work dir

Runs `retrctl train` on the first groups of a recipe's groups.jsonl with the recipe's whole-model flags (MarginMSE,
16 groups of 4 passages a step, examples/beir/Makefile's DISTILL_FLAGS), once per setting, and prints the first
step's seconds (padded to the maximum lengths) and the mean of the later ones, from the run's metrics.jsonl, with
each setting's speed against the model's own dropout in fp32. Dropout on the attention probabilities sends CPU
attention from its fused kernel to the math path; bf16 autocast is fast only where the CPU computes bf16 natively
(AVX512-BF16 or AMX)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _run import ROOT, machine

sys.path.insert(0, str(ROOT / "examples" / "beir"))
from plan import timed_steps  # noqa: E402  (the recipe's cost plan times its steps the same way)

FLAGS = ("--model", "minilm", "--train-batch-size", 16, "--train-group-size", 4, "--temperature", 0.05, "--lr", 1e-5,
         "--distill-loss", "margin-mse", "--distill-weight", 1, "--contrastive-weight", 0, "--teacher-temperature",
         0.05, "--seed", 1)
SETTINGS = (("the model's (0.1)", None, "fp32"), ("0", 0, "fp32"), ("0", 0, "bf16"), ("the model's (0.1)", None, "bf16"))


def step_seconds(groups: Path, corpus: Path, steps: int, dropout: float | None, dtype: str) -> tuple[float, float]:
    """(the first step's seconds, the mean of the later ones) of ``steps`` training steps with these settings."""
    extra = () if dropout is None else ("--attention-dropout", dropout)
    return timed_steps(groups, corpus, [*FLAGS, "--dtype", dtype, *extra], steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("groups", type=Path)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=9)
    a = ap.parse_args()
    rows = [(label, dtype, *step_seconds(a.groups, a.corpus, a.steps, dropout, dtype))
            for label, dropout, dtype in SETTINGS]
    reference = rows[0][3]
    print(f"# {a.steps} steps of 16 groups × 4 passages on the first groups of {a.groups}; {machine()}")
    print("| attention dropout | dtype | first step (s) | later steps (s, mean) | speed |")
    print("|---|---|---:|---:|---:|")
    for label, dtype, first, later in rows:
        print(f"| {label} | {dtype} | {first:.1f} | {later:.2f} | {reference / later:.2f}× |")


if __name__ == "__main__":
    main()
