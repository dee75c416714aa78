"""Shipping a retriever: artifacts a stack without retrctl loads, each checked against the model.

- ``st``: the sentence-transformers dir (what ``Encoder.save`` writes, plus an identity ``Dense`` before
  ``Normalize`` for ``--dim``, so stock ``SentenceTransformer`` truncates *then* renormalises)
  and its parity check with stock ``SentenceTransformer``.
- ``onnx``: ``torch.onnx.export`` (TorchScript exporter, opset 17) of backbone + pooling + truncation +
  normalisation in one graph, and onnxruntime's dynamic int8 quantisation (MatMul only, per channel).
- the graph runs in ``models.runtime`` (``OnnxEncoder``, and ``load_encoder``, which picks ONNX or torch from what a
  model path holds), so inference never imports this package.
- ``card``: README.md from the model's own records and the parity figures.

Nothing here is imported by ``retrctl --help``; onnx and onnxruntime are imported only when used.
"""

from retrctl.models.runtime import MISSING, require_runtime

__all__ = ["MISSING", "SAMPLE_TEXTS", "require_runtime"]


SAMPLE_TEXTS = [
    "what is the capital of France",
    "Paris is the capital and largest city of France.",
    "a",
    "Cats are small domesticated carnivorous mammals. They purr when content, and hunt at night.",
    "Rust is a systems programming language focused on memory safety without garbage collection.",
    "How do vaccines train the immune system to recognise a pathogen?",
    "Tea is an aromatic beverage prepared by pouring hot water over cured or fresh leaves of Camellia sinensis.",
    "0.5 mg/kg of the drug reduced the tumour volume by 42% (p < 0.01) in mice.",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    " ".join(["A long passage that is cut at the model's length cap, so truncation is exported the same way."] * 40),
]
