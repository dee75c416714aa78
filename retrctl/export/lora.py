"""A PEFT LoRA adapter dir as an export source: merged into its base in fp32, checked, then exported as one model.

``retrctl train --lora-r`` already saves merged weights (train/loop.py merges in fp32 and checks), so this is for
adapter-only dirs made elsewhere (``adapter_config.json`` + ``adapter_model.safetensors``), which stock
``SentenceTransformer`` does not load (ST#2465, #2979). Merging runs in fp32 before any cast (peft#1388: merging
in bf16 shifts outputs), and the merged model must reproduce the adapter model to 1e-5 on the sample texts.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from retrctl.errors import RecordError

TOLERANCE = 1e-5


def is_adapter(root: Path) -> bool:
    return (Path(root) / "adapter_config.json").is_file() and not (Path(root) / "config.json").is_file()


def load_merged(root: Path, texts: list[str], **settings):
    """(Encoder with the adapters merged, what to record): the base from adapter_config.json, loaded in fp32."""
    from peft import PeftModel

    from retrctl.models import Encoder, loading

    cfg = json.loads((root / "adapter_config.json").read_text())
    base = cfg.get("base_model_name_or_path")
    if not base:
        raise RecordError(root / "adapter_config.json", field="base_model_name_or_path", message="no base model named")
    own = {k: v for k, v in loading.read_json(root / "retrctl.json").items() if v is not None}
    enc = Encoder.load(base, device="cpu", dtype="fp32", **{**own, **settings})
    enc.model = PeftModel.from_pretrained(enc.model, str(root)).eval()
    before = {k: enc.encode(texts, k) for k in ("query", "passage")}
    enc.model = enc.model.merge_and_unload()
    diff = max(float(np.abs(enc.encode(texts, k) - v).max()) for k, v in before.items())
    if diff > TOLERANCE:
        raise RecordError(root, message=f"merging the LoRA adapters changed the embeddings (max abs diff {diff:.3g} > {TOLERANCE})")
    return enc, {"base": str(base), "adapter": str(root), "r": cfg.get("r"), "merged_in": "fp32", "merge_max_abs_diff": diff}
