"""Benchmark: a SmolLM2 retriever cut to about half its blocks and healed by distillation from itself, on a CPU.
The teacher is bench/light.py's CPU SmolLM2 recipe; the slice is light.py's 500-doc SciFact slice.

Every step a CLI call as a user runs it:

1. **teacher**: `retrctl train GROUPS --corpus scifact --model smollm2` with light.py's SmolLM2 recipe at its CPU
   size (60 steps × 16 groups of SciFact's train queries, judged positive and one BM25-mined negative; lr 1e-4;
   128 passage tokens; bidirectional, mean pooling, GradCache in chunks of 16; LightRetriever's instruction as the
   query prompt), the dense head only: the heal distils dense vectors (light.py trains its token lookup and sparse
   head from the same steps);
2. **cut**: `retrctl prune W/teacher --drop-layers K --calibration SLICE`;
3. **heal**: `retrctl train --corpus HEAL --model W/drop-K --teacher W/teacher` with the command's defaults (a
   corpus alone, no labels; ``--heal-flags`` adds flags, for a second heal beside the default one, or instead of
   it with ``--no-default-heal``; another ``--drop-layers`` names its heals drop-K-healed…); its wall time
   is the ≤ 60 min figure. HEAL is the slice unless ``--heal-docs`` names another cut of SciFact. With
   ``--group-heal`` also `train GROUPS --corpus scifact --model W/drop-K --teacher W/teacher --embed-distill-weight 1`
   with the teacher's recipe and steps: InfoNCE on its groups, KL to its scores of each group's passages and MSE to
   its vectors of the group's texts;
4. **speed**: docs per CPU-second of the teacher and the cut model (inference loads: removed blocks skipped), the
   same ``--speed-docs`` docs of the slice, rounds interleaved in one process (bench/_run.py's ``throughput``);
5. **quality**: `retrctl index` / `search --hits 100` / `eval` on the slice with light.py's caps (256 tokens each
   side), eval's paired t-test against the teacher.

    flock /tmp/retrctl-bench.lock .venv/bin/python bench/heal_smollm2.py --work /tmp/heal-smollm2   # ~75 min; --group-heal ~20 more
    .venv/bin/python bench/heal_smollm2.py --model TINY --teacher-steps 2 --heal-flags "--max-steps 2" \\
        --eval-docs 40 --speed-docs 8 --rounds 1 --work /tmp/heal-smoke                              # smoke test

Commands whose output an earlier run of the same ``--work`` left complete, with the same arguments and inputs, are
reused (``W/steps.json``). Markdown table on stdout, the figures also in ``W/results.json``; logs on stderr.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from _run import DATA, machine, retrctl, throughput
from heal_encoder import Steps, count_docs, train_groups
from light import SMOLLM2_PROMPT
from train_quality import slice_beir

from retrctl import records
from retrctl.models import Encoder

TEACHER_RECIPE = ["--pooling", "mean", "--bidirectional", "--grad-cache", "--chunk-size", 16, "--train-batch-size", 16,
                  "--train-group-size", 2, "--lr", 1e-4, "--temperature", 0.05, "--query-max-len", 64,
                  "--passage-max-len", 128, "--query-prompt", SMOLLM2_PROMPT]
CAPS = ["--passage-max-len", 256, "--query-max-len", 256]  # light.py's evaluation caps
DROP_LAYERS = 15  # half of SmolLM2's 30 blocks; another cut's heals are named after it (drop-K-healed…)


def cut(data: Path, work: Path, docs: int) -> Path:
    """light.py's slice of ``data`` (``slice_beir``), written once per ``work`` and size: the commands made from it
    stay reusable, and another ``docs`` makes another slice."""
    out = work / f"slice-{docs}"
    sliced = out / f"{data.name}-slice"
    return sliced if (sliced / "qrels" / "test.tsv").is_file() else slice_beir(data, out, docs, None)


def build(a, steps: Steps, scifact: Path, sliced: Path, heal_data: Path) -> tuple[dict, dict]:
    """Teacher, cut and healed models: ({name: dir}, {name: wall seconds of the command that made it})."""
    groups = train_groups(scifact, a.work, None)
    teacher, small = a.work / "teacher", a.work / f"drop-{a.drop_layers}"
    seconds = {"teacher": steps.run("train", groups, "--corpus", scifact, "--model", a.model, *TEACHER_RECIPE,
                                    "--max-steps", a.teacher_steps, "-o", teacher, output=teacher,
                                    done="train_config.json", inputs=[groups])}
    seconds["cut"] = steps.run("prune", teacher, "--drop-layers", a.drop_layers, "--calibration", sliced, "-o", small,
                               output=small, done="prune.json", inputs=[teacher, sliced])
    models = {"teacher": teacher, "cut": small}
    heals = {} if a.heal_flags and a.no_default_heal else {"healed": []}
    if a.heal_flags:
        heals["healed+"] = shlex.split(a.heal_flags)
    stem = "healed" if a.drop_layers == DROP_LAYERS else f"{small.name}-healed"  # another cut, other heals
    for name, flags in heals.items():
        out = a.work / (stem if not flags else f"{stem}-" + "".join(f.strip("-") for f in flags))
        seconds[name] = steps.run("train", "--corpus", heal_data, "--model", small, "--teacher", teacher, *flags,
                                  "-o", out, output=out, done="train_config.json", inputs=[small, teacher, heal_data])
        models[name] = out
    if a.group_heal:  # the teacher's own recipe and groups, with its scores (KL) and its vectors (MSE) as targets
        out = models["healed-groups"] = a.work / f"{stem}-groups"
        seconds["healed-groups"] = steps.run(
            "train", groups, "--corpus", scifact, "--model", small, "--teacher", teacher, "--embed-distill-weight", 1,
            *TEACHER_RECIPE, "--max-steps", a.teacher_steps, "-o", out, output=out, done="train_config.json",
            inputs=[small, teacher, groups])
    return models, seconds


def quality(a, steps: Steps, models: dict, data: Path) -> dict:
    """{name: (nDCG@10, p against the teacher)} on ``data``'s test queries; each index and run is named after its
    model's dir, so the runs of earlier heals (other ``--heal-flags``) stay for paired tests."""
    runs = []
    for model in models.values():
        idx, run = a.work / f"idx-{model.name}", a.work / f"run-{model.name}.trec"
        steps.run("index", data, "--model", model, *CAPS, "--batch-size", a.batch_size, "-o", idx, "--quiet",
                  output=idx, done="index.json", inputs=[model, data])
        steps.run("search", idx, data, "--hits", 100, "-o", run, "--quiet", output=run, inputs=[idx, data])
        runs.append(run)
    _, out, _ = retrctl("eval", *runs, "--qrels", data, "--json", "-m", "nDCG@10", "--quiet")
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return {name: (row["nDCG@10"], row.get("p_value", {}).get("nDCG@10", 1.0)) for name, row in zip(models, rows, strict=True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2", help="the base model the teacher is trained from")
    ap.add_argument("--teacher-steps", type=int, default=60)
    ap.add_argument("--drop-layers", type=int, default=DROP_LAYERS, help="blocks cut (SmolLM2 has 30)")
    ap.add_argument("--heal-flags", default="", help="flags of a second heal, beside the default one")
    ap.add_argument("--no-default-heal", action="store_true", help="with --heal-flags, that heal alone")
    ap.add_argument("--group-heal", action="store_true", help="also heal on the teacher's groups with its recipe, "
                    "its scores and its vectors (`train GROUPS --teacher T --embed-distill-weight 1`)")
    ap.add_argument("--eval-docs", type=int, default=500, help="the slice (light.py's --eval-docs)")
    ap.add_argument("--heal-docs", type=int, default=0, help="heal on a SciFact cut of N docs (0: the slice)")
    ap.add_argument("--speed-docs", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--work", type=Path, default=Path("/tmp/heal-smollm2"))
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    steps, scifact = Steps(a.work), DATA / "scifact"
    sliced = cut(scifact, a.work, a.eval_docs)
    heal_data = cut(scifact, a.work / "heal", a.heal_docs) if a.heal_docs else sliced
    models, seconds = build(a, steps, scifact, sliced, heal_data)

    texts = [records.passage_text(d) for _, d in zip(range(a.speed_docs), records.read(sliced, "doc"), strict=False)]
    timed = {name: Encoder.load(models[name], device="cpu", inference=True, passage_max_len=256)
             for name in ("teacher", "cut")}
    timing = throughput(timed, texts, a.rounds, a.batch_size)
    scores = quality(a, steps, models, sliced)

    speedup = timing["teacher"][1] / timing["cut"][1]
    print(f"## SmolLM2 cut by `prune --drop-layers {a.drop_layers}` and healed from itself, CPU\n")
    print(f"`python bench/heal_smollm2.py {' '.join(sys.argv[1:])}`; {machine()}. Teacher {seconds['teacher'] / 60:.1f} min "
          f"({a.teacher_steps} steps), prune {seconds['cut'] / 60:.1f} min; heal data {heal_data.name} "
          f"({count_docs(heal_data)} docs); quality on {sliced.name} ({count_docs(sliced)} docs); speed: {len(texts)} docs, "
          f"batch {a.batch_size}, 256 tokens, median of {a.rounds} interleaved rounds.\n")
    print("| model | made in min | encode vs teacher (CPU) | nDCG@10 | Δ vs teacher | p vs teacher |")
    print("|---|---:|---:|---:|---:|---:|")
    base = scores["teacher"][0]
    for name, model in models.items():
        s, p = scores[name]
        label = {"healed+": f"healed ({a.heal_flags})", "healed-groups": "healed on the teacher's groups, its scores "
                 "and vectors"}.get(name, name)
        ratio = 1.0 if name == "teacher" else speedup
        print(f"| {label} (`{model.name}`) | {seconds[name] / 60:.1f} | {ratio:.2f}× | {s:.4f} | {s - base:+.4f} | "
              f"{'—' if name == 'teacher' else format(p, '.3g')} |")
    (a.work / "results.json").write_text(json.dumps({
        "argv": sys.argv[1:], "seconds": seconds, "ndcg": {n: s for n, (s, _) in scores.items()},
        "p": {n: p for n, (_, p) in scores.items()}, "speed_cpu_s": {n: c for n, (_, c) in timing.items()},
        "speed_docs": len(texts)}, indent=1) + "\n")


if __name__ == "__main__":
    main()
