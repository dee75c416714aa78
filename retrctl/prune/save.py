"""Writing a pruned encoder a user can ship: the model, what was done to it, and proof that it reloads.

The dir is what ``Encoder.save`` writes (Hugging Face weights and config, tokenizer, sentence-transformers
``modules.json``/pooling, ``retrctl.json``) plus:
- ``prune.json``: source model, method, every sub-layer's importance score, the masks (1 = kept, per source
  block), what was removed, non-embedding parameter counts before/after, the calibration data's hash. It is also
  the ``--scores`` input of a later ``retrctl prune`` that prunes differently without recomputing.
- ``importance.png``: attention vs MLP importance per block, and each block's MLP width after self-slimming
  (matplotlib, headless Agg).
- ``slim_gates.npz`` (self-slimming): every MLP neuron's trained gate value, per block.
- ``shape_masks.npz`` (``--target-shape``): each mask's learned log α and the binary mask kept (``kept_*``), in
  source numbering (what was learned: which units each mask ranked high, and the final cut).
- ``README.md``: a model card saying what was removed, from what, and how to load it.

``verify`` reloads the written dir with stock ``AutoModel.from_pretrained`` (no retrctl code, no remote code) and
compares hidden states with the in-memory pruned model before the dir is swapped into place.
"""

from __future__ import annotations

import json
from pathlib import Path

PRUNE_JSON = "prune.json"
SLIM_GATES = "slim_gates.npz"
SHAPE_MASKS = "shape_masks.npz"


def chart(report: dict, path: Path) -> None:
    """Attention and MLP importance per block (log scale; removed sub-layers circled, removed blocks shaded) when
    they were computed, each block's kept MLP width after self-slimming, and the learned masks' keep
    probabilities per block after ``--target-shape``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    scores, removed, slim, shape = report["scores"], report["removed"], report.get("slimming"), report.get("shape")
    panels = [p for p, on in (("importance", scores), ("width", slim), ("shape", shape)) if on]
    n = len(report["masks"]["block"])
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(6, 0.3 * n + 2), 3.6 * len(panels)), squeeze=False)
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        for i in removed["blocks"]:
            ax.axvspan(i - 0.4, i + 0.4, color="0.85", zorder=0, label="block removed" if i == removed["blocks"][0] else None)
        if panel == "importance":
            for kind, color in (("attention", "tab:blue"), ("mlp", "tab:orange")):
                ax.plot(range(n), scores[kind], marker="o", ms=4, color=color, label=f"{kind} (1 − cos)")
                gone = removed[kind]
                if gone:
                    ax.scatter(gone, [scores[kind][i] for i in gone], s=90, facecolors="none", edgecolors=color,
                               linewidths=1.5, zorder=3, label=f"{kind} removed")
            ax.set_ylabel("importance (log)")
            ax.set_yscale("log")
            ax.set_title(f"{report['source']}: sub-layer importance", fontsize=9)
        elif panel == "shape":
            for kind, color in (("layers", "0.3"), ("heads", "tab:blue"), ("intermediate", "tab:orange")):
                if kind in shape["per_block"]:
                    ax.plot(range(n), shape["per_block"][kind], marker="o", ms=4, color=color, label=f"{kind}: P(kept)")
            ax.set_ylabel("mean P(z ≠ 0)")
            ax.set_ylim(-0.05, 1.05)
            ax.set_title(f"Sheared-LLaMA masks ({shape['objective']} objective, {shape['steps']} steps): "
                         f"{_shape_text(shape['source'])} → {_shape_text(shape['target'])}", fontsize=9)
        else:
            ax.bar(slim["blocks"], slim["widths"], color="tab:orange", label="MLP neurons kept")
            ax.axhline(slim["full_width"], color="0.5", lw=1, ls="--", label="full width")
            ax.set_ylabel("MLP width")
            ax.set_title(f"self-slimming: {slim['keep']:.0%} of the MLP neurons kept, ranked globally", fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("block (source numbering)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _shape_text(shape: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


def card(report: dict) -> str:
    b, a = report["params"]["before"], report["params"]["after"]
    removed = report["removed"]
    lines = [
        "---", "library_name: transformers", "tags: [retrctl, pruned, sentence-similarity]", "---", "",
        f"# Pruned from `{report['source']}`", "",
        f"Made by `retrctl prune` ({report['method']}). Non-embedding parameters: {b:,} → {a:,} ({a / b:.1%}).", "",
        f"- whole blocks removed (source numbering): {removed['blocks'] or 'none'}",
        f"- MLP sub-layers removed (source numbering): {removed['mlp'] or 'none'}",
        f"- attention sub-layers removed (source numbering): {removed['attention'] or 'none'}", "",
    ]
    if report["scores"]:
        calib = report["calibration"]
        lines += ["Importance is EffiR's 1 − cos(input, output) of each sub-layer on the residual stream, averaged over "
                  f"{calib['texts']} calibration passages ({calib['tokens']:,} tokens, at most {calib['max_length']} "
                  f"each; data hash `{calib['hash']}`). Scores, masks and counts are in `prune.json`; the chart is "
                  "`importance.png`.", ""]
    slim = report.get("slimming")
    if slim:
        lines += [f"Self-slimmed (EffiR's fine step): gates on the MLP neurons trained {slim['slim_steps']} steps "
                  f"with InfoNCE + {slim['lambda']}·L0 on `{slim['groups']}`, the top {slim['keep']:.0%} kept across "
                  f"all blocks (widths {min(slim['widths'])}–{max(slim['widths'])} of {slim['full_width']}; per block in "
                  f"`prune.json`, the gate values in `{SLIM_GATES}`), then {slim['heal_steps']} steps of InfoNCE with the "
                  "mask frozen.", ""]
    shape = report.get("shape")
    if shape:
        lines += [f"Cut to a target shape (Sheared-LLaMA): `{_shape_text(shape['source'])}` → `{_shape_text(shape['target'])}`. "
                  f"Hard-concrete masks on blocks, hidden dims, key/value head groups and MLP neurons were trained with the "
                  f"model for {shape['steps']} steps ({shape['objective']} objective) under Lagrange multipliers pulling "
                  "them to the target; every block kept the same number of heads and neurons, so this is a plain stock "
                  f"model of that shape. Each mask's log α is in `{SHAPE_MASKS}`.", ""]
    lines += [
        "This model has not been trained after pruning: fine-tune it to recover quality, e.g. " if not (slim or shape) else
        "Fine-tune it further to recover more quality, e.g. ",
        "`retrctl mine … | retrctl train --model THIS_DIR …`.", "", "## Loading", "",
        "```python", "from transformers import AutoModel", "model = AutoModel.from_pretrained(DIR)", "```", "",
        "or `SentenceTransformer(DIR)`, or `retrctl index --model DIR`.",
    ]
    if report["removed"]["mlp"] or report["removed"]["attention"] or slim:
        lines += [
            "", "Single sub-layers or MLP neurons were removed, which no stock config can express: they are stored as zeros, so the "
            "stock load above gives the pruned model's outputs exactly but computes them. `config.retrctl_pruned` lists "
            "them (and each block's kept MLP width); `retrctl index`, `search` and `mine` skip them in memory (same outputs, less compute; "
            "`retrctl.models.skipping.skip_removed(model)` does it for your own code). "
            "A model trained from this one (`retrctl train --model DIR`) keeps the zeros (their gradients are zero).",
        ]
    return "\n".join(lines) + "\n"


def write_report(out: Path, report: dict, gates: dict | None = None, shape_masks: dict | None = None) -> None:
    """prune.json, importance.png, README.md; ``gates`` (block → gate values) to ``slim_gates.npz``, so a user can
    keep another fraction without training the gates again; ``shape_masks`` ({"kept": …, "log_alpha": …}, per
    mask) to ``shape_masks.npz``."""
    import numpy as np

    (out / PRUNE_JSON).write_text(json.dumps(report, indent=2) + "\n")
    if gates:
        np.savez(out / SLIM_GATES, **{f"block_{i}": v.numpy() for i, v in gates.items()})
    if shape_masks:
        np.savez(out / SHAPE_MASKS, **{f"{what}_{k}": v.numpy() for what, d in shape_masks.items() for k, v in d.items()})
    chart(report, out / "importance.png")
    (out / "README.md").write_text(card(report))


def verify(model, tokenizer, out: Path, texts: list[str], max_length: int, atol: float = 1e-5) -> float:
    """Max |difference| of last hidden states between ``model`` and stock ``AutoModel.from_pretrained(out)``;
    RuntimeError above ``atol``."""
    import torch

    from retrctl.models.loading import load_backbone

    stock = load_backbone(out, next(model.parameters()).dtype).to(next(model.parameters()).device).eval()
    batch = tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt").to(next(model.parameters()).device)
    with torch.inference_mode():
        ours = model(**batch).last_hidden_state
        theirs = stock(**batch).last_hidden_state
    m = batch["attention_mask"].bool()
    diff = (ours[m] - theirs[m]).abs().max().item()
    if not diff <= atol:
        raise RuntimeError(f"{out}: the saved model reloads with hidden states {diff:.2e} away from the pruned model (> {atol})")
    return diff
