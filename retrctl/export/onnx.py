"""ONNX fp32 and dynamic int8 from an ``Encoder``: one graph from token ids to the finished vector.

The graph holds backbone → head (pooling) → Matryoshka truncation → L2 normalisation, i.e. exactly
``Encoder.forward`` (``head.finish(head(hidden, mask))``), so a runtime only tokenizes and runs it. Exported with
the TorchScript exporter (``dynamo=False``, opset 17; the dynamo exporter needs onnxscript and failed on the
Llama mask code), dynamic batch and sequence axes; attention runs as "eager" while tracing (sdpa's mask paths do
not trace to ONNX on every transformers release). Quantisation: onnxruntime's ``quantize_dynamic`` with MatMul
only and per-channel weights; its defaults (Gather/embeddings too, per tensor) gave 0.96 mean cosine on MiniLM
against 0.993 for this. Keeping each block's FFN output projection in fp32 was tried and dropped: on
MiniLM it raised the mean cosine to fp32 over 1,000 SciFact docs from 0.9950 to 0.9977 but cost speed (1.82× →
1.41× torch) and did not improve nDCG@10 there (−0.0072 → −0.0122 against torch; bench/RESULTS.md).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from retrctl.export import require_runtime as require

OPSET = 17


class Graph(torch.nn.Module):
    """token ids + mask → finished vectors, as ``Encoder.forward`` computes them for the passage side."""

    def __init__(self, enc):
        super().__init__()
        self.model, self.head = enc.model, enc.sides["passage"].head

    def forward(self, input_ids, attention_mask):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head.finish(self.head(hidden, attention_mask))


def export_fp32(enc, path: Path) -> Path:
    """Write ``path`` (model.onnx; weights over 2 GB go to a ``.data`` file beside it)."""
    require()
    model = enc.model
    before = getattr(model.config, "_attn_implementation", None)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    try:
        sample = enc.tokenize(["export sample text", "a second, longer export sample text"], "passage")
        # the tracer warns about every Python-level branch it freezes; the parity check after export is what
        # decides whether the graph is right, so those warnings are noise on stderr
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(Graph(enc).eval(), (sample["input_ids"], sample["attention_mask"]), str(path),
                              input_names=["input_ids", "attention_mask"], output_names=["embedding"],
                              dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                                            "attention_mask": {0: "batch", 1: "sequence"}, "embedding": {0: "batch"}},
                              opset_version=OPSET, dynamo=False, do_constant_folding=True)
    finally:
        if before and hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(before)
    return path


def quantize_int8(src: Path, dst: Path) -> Path:
    """Dynamic int8 (weights int8 per channel, activations quantised at run time), MatMul only."""
    require()
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)  # the quantizer logs a line per tensor on the root logger
    try:
        quantize_dynamic(str(src), str(dst), op_types_to_quantize=["MatMul"], per_channel=True, weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)
    return dst
