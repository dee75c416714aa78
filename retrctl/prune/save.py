"""Writing a pruned encoder a user can ship: the model, what was done to it, and proof that it reloads.

The dir is what ``Encoder.save`` writes (Hugging Face weights and config, tokenizer, sentence-transformers
``modules.json``/pooling, ``retrctl.json``) plus:
- ``prune.json``: source model, method, every sub-layer's importance score, the masks (1 = kept, per source
  block), what was removed, non-embedding parameter counts before/after, the calibration data's hash. It is also
  the ``--scores`` input of a later ``retrctl prune`` that prunes differently without recomputing (PEER 19).
- ``importance.png``: attention vs MLP importance per block (matplotlib, headless Agg).
- ``README.md``: a model card saying what was removed, from what, and how to load it.

``verify`` reloads the written dir with stock ``AutoModel.from_pretrained`` (no retrctl code, no remote code) and
compares hidden states with the in-memory pruned model before the dir is swapped into place (PEER 16, 18).
"""

from __future__ import annotations

import json
from pathlib import Path

PRUNE_JSON = "prune.json"


def chart(scores: dict, removed: dict, path: Path, title: str) -> None:
    """Attention and MLP importance per block (log scale); removed sub-layers circled, removed blocks shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    n = len(scores["attention"])
    fig, ax = plt.subplots(figsize=(max(6, 0.3 * n + 2), 3.6))
    for i in removed["blocks"]:
        ax.axvspan(i - 0.4, i + 0.4, color="0.85", zorder=0, label="block removed" if i == removed["blocks"][0] else None)
    for kind, color in (("attention", "tab:blue"), ("mlp", "tab:orange")):
        ax.plot(range(n), scores[kind], marker="o", ms=4, color=color, label=f"{kind} (1 − cos)")
        gone = removed[kind]
        if gone:
            ax.scatter(gone, [scores[kind][i] for i in gone], s=90, facecolors="none", edgecolors=color, linewidths=1.5,
                       zorder=3, label=f"{kind} removed")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("block")
    ax.set_ylabel("importance (log)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
        "Importance is EffiR's 1 − cos(input, output) of each sub-layer on the residual stream, averaged over "
        f"{report['calibration']['texts']} calibration passages ({report['calibration']['tokens']:,} tokens, at most "
        f"{report['calibration']['max_length']} each; data hash `{report['calibration']['hash']}`). "
        "Scores, masks and counts are in `prune.json`; the chart is `importance.png`.", "",
        "This model has not been trained after pruning: fine-tune it to recover quality, e.g. "
        "`retrctl mine … | retrctl train --model THIS_DIR …`.", "", "## Loading", "",
        "```python", "from transformers import AutoModel", "model = AutoModel.from_pretrained(DIR)", "```", "",
        "or `SentenceTransformer(DIR)`, or `retrctl index --model DIR`.",
    ]
    if report["removed"]["mlp"] or report["removed"]["attention"]:
        lines += [
            "", "Single sub-layers were removed, which no stock config can express: they are stored as zeros, so the "
            "stock load above gives the pruned model's outputs exactly but computes them. `config.retrctl_pruned` lists "
            "them; `retrctl index`, `search` and `mine` skip them in memory (same outputs, less compute; "
            "`retrctl.models.skipping.skip_removed(model)` does it for your own code). "
            "A model trained from this one (`retrctl train --model DIR`) keeps the zeros (their gradients are zero).",
        ]
    return "\n".join(lines) + "\n"


def write_report(out: Path, report: dict) -> None:
    (out / PRUNE_JSON).write_text(json.dumps(report, indent=2) + "\n")
    chart(report["scores"], report["removed"], out / "importance.png", f"{report['source']}: sub-layer importance")
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
