"""Benchmark: pruned SmolLM2-135M retrievers before and after the same short training as the unpruned model:
EffiR/ShortGPT dropping and Sheared-LLaMA's target shape, as a bidirectional mean-pooled retriever.

1. For each setting, `retrctl prune smollm2 …` as the README runs it: the coarse settings on importance from
   `--calibration-size` SciFact corpus passages (computed by the first, reused by the others with `--scores`);
   `target-shape` learns its masks for `--shape-steps` on next-token loss over SciFact corpus passages,
   `target-shape-contrastive` on InfoNCE over the training groups below (through Trainer).
2. The same short `retrctl train` recipe (`--heal-steps` steps of `--batch-size` SciFact train groups: judged
   positives, BM25-mined negatives, bench/train_quality.py's `train_groups`) on every pruned model and on the
   unpruned one.
3. Non-embedding parameters, encode throughput (retrctl's inference loads: removed sub-layers skipped; same docs,
   interleaved rounds, one process) and SciFact test nDCG@10 on an N-doc sub-corpus (bench/_run.py's
   `subcorpus`), right after pruning and after training.

    flock /work/bench.lock .venv/bin/python bench/heal.py                            # every setting, ~45 min
    flock /work/bench.lock .venv/bin/python bench/heal.py --settings target-shape,target-shape-contrastive

Markdown table on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from _run import DATA, retrctl
from slim import compare, recipe_args, setup

from retrctl.models import Encoder

SHAPE = "layers=24,hidden=480,heads=6,intermediate=1152"  # 48.6 % of SmolLM2's non-embedding parameters
SETTINGS = {"drop-mlp-8": ["--drop-mlp", 8], "drop-mlp-15": ["--drop-mlp", 15], "drop-layers-10": ["--drop-layers", 10],
            "drop-layers-15": ["--drop-layers", 15], "target-params-0.5": ["--target-params", 0.5],
            "target-shape": ["--target-shape", SHAPE, "--objective", "lm"],
            "target-shape-contrastive": ["--target-shape", SHAPE, "--objective", "contrastive"]}
DEFAULT = "drop-mlp-8,drop-mlp-15,drop-layers-10,drop-layers-15,target-shape"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--work", default="/work/bench-work/heal")
    ap.add_argument("--settings", default=DEFAULT, help=f"comma-separated, of: {', '.join(SETTINGS)}")
    ap.add_argument("--calibration-size", type=int, default=64)
    ap.add_argument("--shape-steps", type=int, default=30)
    ap.add_argument("--mask-lr", type=float, default=1.0)
    ap.add_argument("--heal-steps", type=int, default=20)
    a = recipe_args(ap).parse_args()
    work, groups, enc = setup(a)
    train = [groups, "--corpus", DATA / "scifact", "--max-steps", a.heal_steps, "--train-batch-size", a.batch_size,
             "--train-group-size", a.group_size, "--lr", a.lr, "--overwrite"]
    corpus = DATA / "scifact" / "corpus.jsonl"
    scores, notes, trained = None, [], {}
    t_base, *_ = retrctl("train", *train, "--model", a.model, *enc, "-o", work / "trained", capture_stderr=False)
    notes.append(f"unpruned training {t_base / 60:.1f} min")
    for name in a.settings.split(","):
        flags = list(SETTINGS[name])
        if name == "target-shape":
            flags += ["--calibration", corpus, "--shape-steps", a.shape_steps, "--mask-lr", a.mask_lr, "--train-batch-size",
                      a.batch_size, "--lr", a.lr, "--max-length", a.max_length]
        elif name == "target-shape-contrastive":  # the masks trained on the same groups as the heal, through Trainer
            flags += ["--groups", groups, "--corpus", DATA / "scifact", "--train-group-size", a.group_size, "--shape-steps",
                      a.shape_steps, "--mask-lr", a.mask_lr, "--train-batch-size", a.batch_size, "--lr", a.lr]
        else:  # importance once, then reused
            flags += ["--scores", scores] if scores else ["--calibration", corpus, "--calibration-size", a.calibration_size,
                                                          "--max-length", a.max_length]
        out = work / name
        t_prune, *_ = retrctl("prune", a.model, *flags, *enc, "-o", out, capture_stderr=False)
        scores = scores or (out / "prune.json" if not name.startswith("target-shape") else None)
        t_train, *_ = retrctl("train", *train, "--model", out, "-o", work / f"{name}-trained", capture_stderr=False)
        trained[name] = (out, work / f"{name}-trained")
        notes.append(f"{name}: prune {t_prune / 60:.1f} min, training {t_train / 60:.1f} min")
        if name.startswith("target-shape"):
            shape = json.loads((out / "prune.json").read_text())["shape"]
            m = shape["metrics"]
            loss = (f"LM loss on the first batch {m['lm_loss_unpruned']} unpruned → {m['lm_loss_pruned']} pruned"
                    if "lm_loss_pruned" in m else f"last step's loss {m.get('loss', float('nan')):.4f}")
            sparsity = ", ".join(f"{k} {v['expected_sparsity']} (target {v['target_sparsity']})" for k, v in shape["masks"].items())
            notes.append(f"{name}: {loss}; expected sparsity after {a.shape_steps} steps {sparsity}; "
                         f"kept blocks {shape['kept_layers']}")
    caps = {"passage_max_len": a.max_length, "query_max_len": 64}
    models = {"unpruned": Encoder.load(a.model, device="cpu", pooling="mean", bidirectional=True, **caps),
              f"unpruned, trained {a.heal_steps} steps": Encoder.load(work / "trained", device="cpu", inference=True)}
    for name, (out, healed) in trained.items():
        models[f"{name}, right after pruning"] = Encoder.load(out, device="cpu", inference=True)
        models[f"{name}, trained {a.heal_steps} steps"] = Encoder.load(healed, device="cpu", inference=True)
    print(f"## Pruned {a.model} before and after the same {a.heal_steps}-step training ({time.strftime('%Y-%m-%d')})\n")
    print(f"`python bench/heal.py {' '.join(sys.argv[1:])}`: {'; '.join(notes)}; {a.batch_size} groups × "
          f"{a.group_size} per step, lr {a.lr}, {a.max_length} tokens.", end=" ")
    compare(models, a)


if __name__ == "__main__":
    main()
