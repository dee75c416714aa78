"""Provenance: the versions of retrctl and the libraries that shape its outputs, and the manifest beside an output.

Index and model directories carry their own manifest; a run or query file (TREC and JSONL have no header) gets
``<output>.manifest.json`` beside it: scores move with library versions and BM25 variants, and a run
file alone cannot say which made it.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from retrctl.records.containers import atomic_path


def versions() -> dict:
    """Installed versions of retrctl and the libraries that shape its outputs, for manifests."""
    import importlib.metadata as md
    import platform

    out = {"python": platform.python_version()}
    for pkg in ("retrctl", "torch", "transformers", "tokenizers", "faiss-cpu", "faiss-gpu-cu12", "bm25s"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[pkg] = md.version(pkg)
    return out


def write_manifest_beside(output, manifest: dict) -> None:
    """``<output>.manifest.json``, atomically: a run or query file's provenance (TREC and JSONL have no header).
    Nothing when the output is stdout."""
    if output in (None, "-"):
        return
    with atomic_path(f"{output}.manifest.json") as tmp:
        Path(tmp).write_text(json.dumps({**manifest, "versions": versions()}, indent=2, ensure_ascii=False, default=str) + "\n")
