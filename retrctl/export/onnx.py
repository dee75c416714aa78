"""ONNX fp32 and dynamic int8 from an ``Encoder``: one graph from token ids to the finished vector.

The graph holds backbone → head (pooling) → Matryoshka truncation → L2 normalisation, i.e. exactly
``Encoder.forward`` (``head.finish(head(hidden, mask))``), so a runtime only tokenizes and runs it. Exported with
the TorchScript exporter (``dynamo=False``, opset 17; the dynamo exporter needs onnxscript and failed on the
Llama mask code), dynamic batch and sequence axes; attention runs as "eager" while tracing (sdpa's mask paths do
not trace to ONNX on every transformers release). Quantisation: onnxruntime's ``quantize_dynamic`` with MatMul
only and per-channel weights; its defaults (Gather/embeddings too, per tensor) gave 0.96 mean cosine on MiniLM
against 0.993 for this (issue 16). The FFN output projection of each block (BERT ``output.dense``, Llama
``down_proj``) stays fp32: its input is the widest, GELU/SiLU-shaped activation, the one dynamic per-tensor
activation quantisation hurts most; on 200 SciFact docs with MiniLM, keeping those 6 of 36 MatMuls in fp32 raised
the mean cosine to fp32 from 0.9949 to 0.9977 (min 0.9909 → 0.9964) for 25% more time (bench/RESULTS.md).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch

from retrctl.export import require_runtime as require

OPSET = 17
FFN_OUT = re.compile(r"/(output/dense|down_proj|fc2|dense_4h_to_h)/")  # the FFN's second projection, by exported name


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


def ffn_out_nodes(path: Path) -> list[str]:
    """Names of the MatMuls that are an FFN's output projection (not attention's output projection)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type == "MatMul" and FFN_OUT.search(n.name) and "attention" not in n.name]


def quantize_int8(src: Path, dst: Path) -> list[str]:
    """Dynamic int8 (weights int8 per channel, activations quantised at run time), MatMul only, the FFN output
    projections kept fp32. Returns the names kept fp32."""
    require()
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    keep = ffn_out_nodes(src)

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)  # the quantizer logs a line per tensor on the root logger
    try:
        quantize_dynamic(str(src), str(dst), op_types_to_quantize=["MatMul"], per_channel=True,
                         weight_type=QuantType.QInt8, nodes_to_exclude=keep)
    finally:
        root.setLevel(level)
    return keep
