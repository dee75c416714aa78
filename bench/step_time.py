"""The recipe's training steps on this CPU: the whole model's step with the model's attention dropout and without
it, in fp32 and in bf16 mixed precision; with --tower the query tower's step with the model's attention dropout and
without it, its queries in one length-sorted chunk of 32 (train's default) or in chunks of 8.

    python bench/step_time.py W/groups.jsonl --corpus DATA [--steps 9]      # W: a recipe work dir
    python bench/step_time.py W/groups.jsonl --corpus DATA --tower [--steps 30] [--rounds 2]   # W holds idx-base

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
import sys
from pathlib import Path

from _run import ROOT, machine, recipe_value

sys.path.insert(0, str(ROOT / "examples" / "beir"))
from plan import timed_steps  # noqa: E402  (the recipe's cost plan times its steps the same way)

# (label, attention dropout, dtype): MiniLM's own attention dropout is BERT's 0.1
SETTINGS = (("the model's (0.1)", 0.1, "fp32"), ("0", 0, "fp32"), ("0", 0, "bf16"), ("the model's (0.1)", 0.1, "bf16"))
# the query tower's (label, attention dropout, chunk size): fp32, the tower's dtype
TOWER_SETTINGS = (("the model's (0.1)", 0.1, 32), ("0", 0, 32), ("0", 0, 8))


def recipe_flags(corpus: Path, work: Path | None = None) -> list[str]:
    """The recipe's whole-model `retrctl train` flags for ``corpus``, as examples/beir/Makefile writes them; with
    ``work`` (a recipe work dir holding idx-base) the query tower's."""
    steps = "$(QUERY_FLAGS)" if work else "$(FULL_FLAGS)"
    return shlex.split(recipe_value(f"--model $(MODEL) --train-batch-size $(BATCH) {steps} $(DISTILL_FLAGS) --seed $(SEED)",
                                    corpus, work))


def step_seconds(groups: Path, corpus: Path, flags: list[str], steps: int, dropout: float,
                 dtype: str) -> tuple[float, float]:
    """(the first step's seconds, the mean of the later ones) of ``steps`` training steps with these settings."""
    return timed_steps(groups, corpus, [*flags, "--attention-dropout", dropout, "--dtype", dtype], steps)


def tower(groups: Path, corpus: Path, steps: int, rounds: int) -> None:
    """The query tower's settings, each the best of ``rounds`` runs, the settings' order reversed each round (a load
    change on a shared machine hits every setting)."""
    flags = recipe_flags(corpus, groups.parent)
    best: dict[int, tuple[float, float]] = {}
    for r in range(rounds):
        order = range(len(TOWER_SETTINGS)) if r % 2 == 0 else reversed(range(len(TOWER_SETTINGS)))
        for i in order:
            _, dropout, chunk = TOWER_SETTINGS[i]
            got = timed_steps(groups, corpus, [*flags, "--attention-dropout", dropout, "--chunk-size", chunk], steps)
            best[i] = min(best.get(i, got), got, key=lambda t: t[1])
    reference = best[0][1]
    print(f"# the query tower: {steps} steps of 16 queries (best of {rounds}) on the first groups of {groups}; {machine()}")
    print("| attention dropout | chunk | first step (s) | later steps (s, mean) | speed |")
    print("|---|---:|---:|---:|---:|")
    for i, (label, _, chunk) in enumerate(TOWER_SETTINGS):
        print(f"| {label} | {chunk} | {best[i][0]:.1f} | {best[i][1]:.3f} | {reference / best[i][1]:.2f}× |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("groups", type=Path)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=None, help="steps a run (9; 30 with --tower)")
    ap.add_argument("--tower", action="store_true", help="the query tower's steps (GROUPS' folder holds idx-base)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each tower setting (the best is kept)")
    a = ap.parse_args()
    if a.tower:
        return tower(a.groups, a.corpus, a.steps or 30, a.rounds)
    a.steps = a.steps or 9
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
