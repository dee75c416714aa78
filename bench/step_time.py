"""The recipe's whole-model training step on this CPU: seconds a step with the model's attention dropout and
without it, in fp32 and in bf16 mixed precision.

    python bench/step_time.py W/groups.jsonl --corpus DATA [--steps 9]      # W: a recipe work dir

Runs `retrctl train` on the first groups of a recipe's groups.jsonl with the recipe's whole-model flags, read from
examples/beir/Makefile (MODEL, BATCH, FULL_FLAGS, DISTILL_FLAGS, SEED), the dropout and dtype of each setting given
after them (click keeps an option's last value), once per setting, and prints the first
step's seconds (padded to the maximum lengths) and the mean of the later ones, from the run's metrics.jsonl, with
each setting's speed against the model's own dropout in fp32. Dropout on the attention probabilities sends CPU
attention from its fused kernel to the math path; bf16 autocast is fast only where the CPU computes bf16 natively
(AVX512-BF16 or AMX)."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from _run import ROOT, machine

sys.path.insert(0, str(ROOT / "examples" / "beir"))
from plan import timed_steps  # noqa: E402  (the recipe's cost plan times its steps the same way)

# (label, attention dropout, dtype): MiniLM's own attention dropout is BERT's 0.1
SETTINGS = (("the model's (0.1)", 0.1, "fp32"), ("0", 0, "fp32"), ("0", 0, "bf16"), ("the model's (0.1)", 0.1, "bf16"))


def recipe_flags(corpus: Path) -> list[str]:
    """The recipe's whole-model `retrctl train` flags for ``corpus``, as examples/beir/Makefile writes them."""
    show = "train-flags: ; @echo --model $(MODEL) --train-batch-size $(BATCH) $(FULL_FLAGS) $(DISTILL_FLAGS) --seed $(SEED)"
    out = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(ROOT / "examples" / "beir"), f"DATA={corpus}",
                          f"PY={sys.executable}", f"--eval={show}", "train-flags"], check=True, capture_output=True, text=True)
    return shlex.split(out.stdout)


def step_seconds(groups: Path, corpus: Path, flags: list[str], steps: int, dropout: float,
                 dtype: str) -> tuple[float, float]:
    """(the first step's seconds, the mean of the later ones) of ``steps`` training steps with these settings."""
    return timed_steps(groups, corpus, [*flags, "--attention-dropout", dropout, "--dtype", dtype], steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("groups", type=Path)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=9)
    a = ap.parse_args()
    flags = recipe_flags(a.corpus)
    rows = [(label, dtype, *step_seconds(a.groups, a.corpus, flags, a.steps, dropout, dtype))
            for label, dropout, dtype in SETTINGS]
    reference = rows[0][3]
    print(f"# {a.steps} steps of 16 groups × 4 passages on the first groups of {a.groups}; {machine()}")
    print("| attention dropout | dtype | first step (s) | later steps (s, mean) | speed |")
    print("|---|---|---:|---:|---:|")
    for label, dtype, first, later in rows:
        print(f"| {label} | {dtype} | {first:.1f} | {later:.2f} | {reference / later:.2f}× |")


if __name__ == "__main__":
    main()
