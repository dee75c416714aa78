"""Values that live on disk or decide assignments, pinned: ids of passages without one, content hashes
(index/embedding caches), shard assignments, per-row and per-doc seeds, the LLM weight fingerprint (qgen/rerank
manifests and checkpoints), the mine cache's weights entry and the GGUF conversion dir. A change here invalidates caches, checkpoints and shard splits."""

import os
from pathlib import Path

import pytest

from retrctl import hashing, llm, records, retrievers
from stages import crop, mine, qgen


def test_ids_hashes_shards_and_seeds_are_unchanged():
    assert records.text_id("Hello wörld") == "h2a2f0d3175c83cbb"
    assert records.content_hash("T", "body text") == "0db5c8f08bbede3d14a22dd2fb11d24a"
    assert [hashing.shard_of(k, 7) for k in ["q1", "doc-42", "ü"]] == [3, 5, 3]
    assert llm.row_seeds(13, 3) == [56752582244507909, 35546246419899265, 31878689904077133]
    assert qgen._seed(0, "d1", 2) == 71911166659647141
    assert crop._rng(3, "d9").random() == 0.6194794536641257
    assert mine._rng(5, "q7").random() == 0.589659824100174
    # crop/qgen --sample: the documents a recipe generates queries for
    assert [r["docid"] for r in hashing.sample(({"docid": f"d{i}"} for i in range(20)), 3, 1, "docid")] == ["d4", "d5", "d10"]


def _weights_dir(root: Path) -> Path:
    root.mkdir()
    (root / "config.json").write_text('{"a": 1}')
    (root / "model.safetensors").write_bytes(b"x" * 10)
    (root / "pytorch_model.bin").write_bytes(b"y" * 3)
    (root / "readme.md").write_text("r")
    (root / "sub").mkdir()
    (root / "sub" / "w.safetensors").write_bytes(b"z" * 5)
    (root / "extra.pt").write_bytes(b"p")
    for p in root.rglob("*"):
        os.utime(p, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    return root


def test_weight_fingerprints_are_unchanged(tmp_path):
    root = _weights_dir(tmp_path / "m")
    assert hashing.weights_fingerprint(root) == "f0a70a4b9f8a58b0"  # config bytes + top-level weight files' names and sizes
    t = 1_700_000_000_000_000_000
    assert retrievers._fingerprint(root) == {
        "dir": str(root.resolve()),
        "files": [["extra.pt", 1, t], ["model.safetensors", 10, t], ["pytorch_model.bin", 3, t], ["sub/w.safetensors", 5, t]],
    }


def test_gguf_conversion_dir_is_unchanged(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from retrctl import models

    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" * 4)
    os.utime(gguf, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    monkeypatch.setenv("RETRCTL_CACHE", str(tmp_path / "cache"))
    import hashlib

    key = hashlib.blake2b(f"{gguf.resolve()}|16|1700000000000000000".encode(), digest_size=6).hexdigest()
    done = tmp_path / "cache" / "gguf" / f"tiny-{key}"
    done.mkdir(parents=True)
    (done / "config.json").write_text("{}")
    assert models.gguf_to_hf(gguf) == done  # found, not converted again


def test_training_data_fingerprints_are_unchanged():
    """What a resume compares (trainer_state.json's data_hash), pinned at f32c50e before it used hashing.py."""
    pytest.importorskip("torch")
    from retrctl.train.data import GroupSource

    corpus = {"d1": {"title": "Cats", "text": "Cats purr. ü"}, "d2": {"text": "Dogs bark"}, "d3": {"title": "", "text": "Tea"}}
    groups = [{"query_id": "q1", "query_text": "which purr", "positive_document_ids": ["d1"], "negative_document_ids": ["d2"]},
              {"query_id": "q2", "query_text": "drink", "positive_document_ids": ["d3"], "negative_document_ids": [],
               "positive_scores": [1.0], "negative_scores": []}]
    source = GroupSource(groups, corpus)
    assert source.validate() == 2 and source.without_negatives == 1
    assert source.fingerprint == "dfd488e3a25c98bf2a781609aa432ebd"
    assert source.corpus_fingerprint() == "0865d4d294b69c5e5efada68045a5958"
