"""README.md of an export: what the model is, how it was made and checked, from its own records only.

Read from the source dir: retrctl.json (encoder settings), train_config.json (base model, objective, MRL dims),
metrics.jsonl (the last logged step), prune.json (what was removed); from the export: the formats, sizes and
parity figures; from ``--eval-results`` files (``retrctl eval --json`` output): the rows whose run was searched
with this model (run → its ``.manifest.json`` → the index's encoder model), the newest file first. retrctl
keeps no eval history beside a model, so results are only what the user names. A record that is absent is said
to be absent; nothing is filled in.
"""

from __future__ import annotations

import json
from pathlib import Path

TRAIN_KEYS = ("model", "epochs", "max_steps", "batch_size", "train_group_size", "temperature", "lr", "mrl_dims",
              "distill_weight", "lora_r", "seed")
USAGE = {
    "st": "```python\nfrom sentence_transformers import SentenceTransformer\nm = SentenceTransformer(\"{dist}\")\n"
          "q = m.encode_query([\"a query\"])\nd = m.encode_document([\"a passage\"])\n```",
    "onnx": "```bash\nretrctl index corpus.jsonl --model {dist}/onnx -o idx/   # or {dist}/onnx/model_int8.onnx\n```\n"
            "Inputs `input_ids`, `attention_mask` (int64, [batch, sequence]); output `embedding` [batch, {dim}], "
            "pooled{norm} inside the graph. Tokenize with the tokenizer in `onnx/`, prefixing the prompts of the Encoder table.",
}


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def last_metrics(path: Path) -> dict | None:
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def eval_results(paths, model_root: Path) -> list[dict]:
    """Rows of ``retrctl eval --json`` files whose run came from an index built with ``model_root`` (newest file
    first); a line that is not JSON is a ``RecordError`` naming file and line."""
    from retrctl.errors import RecordError

    want = Path(model_root).resolve()
    found = []
    for path in sorted((Path(p) for p in paths), key=lambda p: -p.stat().st_mtime):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                run = Path(row["run"])
            except (ValueError, KeyError, TypeError):
                raise RecordError(path, n, message="not a `retrctl eval --json` row (needs \"run\")") from None
            manifest = _json(run.with_name(run.name + ".manifest.json")) or {}
            model = ((manifest.get("index_manifest") or {}).get("encoder") or {}).get("model")
            if model and Path(str(model)).resolve() == want:
                found.append({"file": str(path), **row})
    return found


def _eval_rows(results: list[dict] | None) -> list[str]:
    if not results:
        return ["No `retrctl eval` result names this model (pass `--eval-results FILE` from `retrctl eval --json -o FILE`; "
                "a row counts when its run's manifest says it was searched with this model)."]
    skip = {"run", "file", "counts", "settings", "p_value", "significant", "per_query"}
    measures = sorted({k for r in results for k in r if k not in skip})
    rows = ["| run | qrels | " + " | ".join(measures) + " |", "|---|---|" + "---|" * len(measures)]
    for r in results:
        vals = " | ".join(f"{r[m]:.4f}" if isinstance(r.get(m), (int, float)) else "" for m in measures)
        rows.append(f"| `{Path(r['run']).name}` | `{(r.get('settings') or {}).get('qrels')}` | {vals} |")
    return rows + ["", f"From {', '.join(sorted({'`' + r['file'] + '`' for r in results}))}."]


def render(source_root: Path, source: str, report: dict, evals: list[dict] | None = None) -> str:
    cfg = report["encoder"]
    rows = [f"# {Path(str(source)).name or source} (exported by retrctl {report['retrctl']})", "",
            f"Source: `{source}` (weights fingerprint `{report['source_fingerprint']}`).", "",
            "## Encoder", "", "| setting | value |", "|---|---|"]
    rows += [f"| {k} | `{v!r}` |" for k, v in cfg.items()]
    rows += [f"| dim | {report['dim']} |", ""]
    train = _json(source_root / "train_config.json")
    rows += ["## Training", ""]
    if train:
        rows += ["| setting | value |", "|---|---|"] + [f"| {k} | `{train.get(k)!r}` |" for k in TRAIN_KEYS if k in train]
        last = last_metrics(source_root / "metrics.jsonl")
        if last:
            rows += ["", f"Last logged step: `{json.dumps(last)}`."]
        rows += ["", "Training data hashes: none recorded with the model (train_config.json holds the settings only)."]
    else:
        rows += ["No train_config.json: this is a base model, not trained by retrctl."]
    if report.get("lora"):
        m = report["lora"]
        rows += ["", f"LoRA adapters (r={m['r']}) of `{m['base']}` merged in {m['merged_in']} before export; the merged model "
                 f"reproduces the adapter model to {m['merge_max_abs_diff']:.2g} (max abs diff)."]
    prune = _json(source_root / "prune.json")
    if prune:
        rows += ["", "## Pruning", "", f"Method: {prune.get('method')}.", f"Removed: `{json.dumps(prune.get('removed'))}`; "
                 f"non-embedding params {prune.get('params', {}).get('before')} → {prune.get('params', {}).get('after')}; "
                 f"calibration hash `{(prune.get('calibration') or {}).get('hash')}`."]
    rows += ["", "## Evaluation", "", *_eval_rows(evals), "",
             "## Files and parity", "",
             f"Each artifact was checked against retrctl's PyTorch encoder on {report['sample_texts']} sample texts "
             "(as queries and as passages) before this directory was written.", "",
             "| format | files | size | parity |", "|---|---|---|---|"]
    for name, f in report["formats"].items():
        rows.append(f"| {name} | `{f['path']}` | {f['bytes'] / 1e6:.1f} MB | {f['parity']} |")
    rows += ["", "## Use", ""]
    if "st" in report["formats"]:
        rows += [USAGE["st"].format(dist="DIST"), ""]
    if any(k.startswith("onnx") for k in report["formats"]):
        rows += [USAGE["onnx"].format(dist="DIST", dim=report["dim"], norm=(", truncated" if cfg.get("dims") else "") + (" and L2-normalised" if cfg.get("normalize") else "")), ""]
    rows += ["## Limits", ""] + [f"- {n}" for n in report["notes"]]
    return "\n".join(rows) + "\n"
