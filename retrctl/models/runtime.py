"""Loading an encoder for inference: the one place that picks torch or an exported ONNX graph from a model path.

``load_encoder(model, backend=None, …)`` gives an ``Encoder`` (torch) or an ``OnnxEncoder``:

- ``backend="onnx"`` or a path to a ``.onnx`` file, or to a dir holding ``model.onnx`` (an export's ``onnx/``)
  or only ``onnx/model.onnx`` and no torch weights → ONNX;
- anything else → ``Encoder.load`` (a dir holding both torch weights and ``onnx/`` stays on torch: the weights
  are the reference; ``--model DIST/onnx`` or ``DIST/onnx/model_int8.onnx`` picks the exported graph).

``OnnxEncoder`` has the surface the dense index uses (``encode``, ``describe``, ``dim``, ``config``,
``report_truncation``). Tokenizing is ``models.backbone.Tokenizer``, the one ``Encoder`` uses, so prompts, cuts
and EOS are the same; settings baked into the graph (pooling, normalize, dims, bidirectional) cannot be
overridden and are refused, prompts and length caps can.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import numpy as np

from retrctl.errors import UsageError
from retrctl.models import loading
from retrctl.models.config import EncoderConfig

log = logging.getLogger("retrctl.models")

GRAPH_KEYS = ("pooling", "normalize", "dims", "bidirectional")
MISSING = "ONNX export and encoding need onnx and onnxruntime: pip install 'retrctl[onnx]'"
TORCH_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def require_runtime() -> None:
    """onnx and onnxruntime are an extra (retrctl[onnx]): a clear usage error when they are absent."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        raise UsageError(MISSING) from None


def onnx_file(model) -> Path | None:
    """The ONNX graph ``model`` names, or None when it names torch weights (or is not a path)."""
    p = Path(str(model))
    if p.is_file() and p.suffix == ".onnx":
        return p
    if not p.is_dir():
        return None
    if (p / "model.onnx").is_file():
        return p / "model.onnx"
    if (p / "onnx" / "model.onnx").is_file() and not any((p / w).exists() for w in TORCH_WEIGHTS):
        return p / "onnx" / "model.onnx"
    return None


def load_encoder(model, *, backend: str | None = None, device: str | None = None, dtype: str | None = None, **settings):
    """An encoder for ``model`` on the backend its path holds (or ``backend``)."""
    path = onnx_file(model)
    if backend == "onnx" and path is None:
        p = Path(str(model))
        path = p / "onnx" / "model.onnx" if (p / "onnx" / "model.onnx").is_file() else None
        if path is None:
            raise UsageError(f"--backend onnx: {model} holds no model.onnx (make one with retrctl export)")
    if backend == "torch" and path is not None:  # an export's graph named: its dir's torch weights, if it has them
        root = path.parent.parent if path.parent.name == "onnx" else path.parent
        if not any((root / w).exists() for w in TORCH_WEIGHTS):
            raise UsageError(f"--backend torch: {model} is an ONNX graph with no torch weights beside it")
        model, path = root, None
    if path is None:
        from retrctl.models import Encoder

        return Encoder.load(model, device=device, dtype=dtype, inference=True, **settings)
    if dtype not in (None, "fp32"):
        log.warning("%s: --dtype %s ignored: the ONNX graph's precision is fixed at export", path, dtype)
    return OnnxEncoder.load(path, **settings)


class OnnxEncoder:
    """An exported graph (token ids → finished vectors) behind ``Encoder``'s encode surface."""

    def __init__(self, path: Path, tokenizer, config: EncoderConfig, source: str = ""):
        import onnxruntime as ort

        from retrctl.models import backbone

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        threads = int(os.environ.get("RETRCTL_ONNX_THREADS", "0"))
        opts.intra_op_num_threads = threads  # 0 = onnxruntime's choice (one per physical core)
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.path, self.tokenizer, self.config, self.source = path, tokenizer, config, source or str(path)
        self._tok = backbone.Tokenizer(tokenizer)
        self.truncated = self._tok.truncated
        dim = self.session.get_outputs()[0].shape[-1]
        self.dim = int(dim) if isinstance(dim, int) else int(self._run(["a"], "passage").shape[1])

    @classmethod
    def load(cls, path, **overrides) -> OnnxEncoder:
        from transformers import AutoTokenizer

        require_runtime()
        path = Path(path)
        d = path.parent
        saved = loading.read_json(d / "retrctl.json")
        if not saved:
            raise ValueError(f"{d}: no retrctl.json beside {path.name} (not a retrctl export)")
        config = EncoderConfig.from_settings(saved)
        for k, v in overrides.items():
            if v is None or not hasattr(config, k):
                continue
            if k in GRAPH_KEYS and v != getattr(config, k):
                raise ValueError(f"{path}: {k}={getattr(config, k)!r} is part of the exported graph; it cannot be set to {v!r}")
            setattr(config, k, v)
        return cls(path, AutoTokenizer.from_pretrained(str(d)), config, source=str(path))

    def tokenize(self, texts: list[str], kind: str = "passage"):
        return self._tok(texts, kind, self.config.prompt(kind), self.config.max_len(kind), self.config.pooling == "eos")

    def _run(self, texts: list[str], kind: str) -> np.ndarray:
        t = self.tokenize(texts, kind)
        feed = {"input_ids": t["input_ids"].numpy(), "attention_mask": t["attention_mask"].numpy()}
        return self.session.run(None, feed)[0]

    def encode(self, texts: list[str], kind: str = "passage", batch_size: int = 32, progress=None) -> np.ndarray:
        """Vectors (float32, input order); batches length-sorted, as ``Encoder.encode`` does."""
        if kind not in ("query", "passage"):
            raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        batches = range(0, len(order), batch_size)
        if progress is not None:
            batches = progress(batches, total=len(batches))
        for start in batches:
            idx = order[start : start + batch_size]
            out[idx] = self._run([texts[i] for i in idx], kind)
        return out

    def report_truncation(self, total: dict | None = None) -> None:
        for kind, n in self.truncated.items():
            if n:
                of = f" of {total[kind]}" if total and kind in total else ""
                log.warning("%d%s %s texts were cut at %d tokens", n, of, kind, self.config.max_len(kind))

    def describe(self) -> dict:
        return {"model": self.source, **dataclasses.asdict(self.config), "dim": self.dim, "backend": "onnx"}


def read_export(d: Path) -> dict:
    """export.json of an export dir ({} when absent)."""
    f = Path(d) / "export.json"
    return json.loads(f.read_text()) if f.is_file() else {}
