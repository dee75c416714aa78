"""Query-side adaptation over a frozen index (train --passage-index, index --query-model) on a tiny model: the
passages come from the index and are never encoded, the loss falls, a 0-lr run keeps the base's query encodings,
the index records the query tower, and the guard scores towers against the stored vectors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from trainkit import FAST, corpus, groups, losses, write_jsonl

FLAGS = [f"--{k.replace('_', '-')}={v}" for k, v in FAST.items()]


@pytest.fixture
def base_index(tiny_bert, tmp_path, runner):
    docs = corpus()
    corpus_file = write_jsonl(tmp_path / "corpus.jsonl", [{"_id": d, **v} for d, v in docs.items()])
    r = runner("index", corpus_file, "--model", tiny_bert, "-o", tmp_path / "idx")
    assert r.exit_code == 0, r.output
    return corpus_file, tmp_path / "idx"


def train_tower(runner, tiny_bert, base_index, tmp_path, *flags):
    """`retrctl train` of a query tower over ``base_index``'s vectors on 16 groups, as a user runs it: (result, out)."""
    corpus_file, idx = base_index
    groups_file = write_jsonl(tmp_path / "groups.jsonl", groups(16))
    out = tmp_path / "m"
    r = runner("train", groups_file, "--corpus", corpus_file, "--model", tiny_bert, "--passage-index", idx, *flags,
               *FLAGS, "-o", out)
    return r, out


def _trainer(tiny_bert, corpus_file, idx, out, **settings):
    from retrctl import records
    from retrctl.train.config import TrainConfig
    from retrctl.train.query_side import QuerySideTrainer

    cfg = TrainConfig(model=str(tiny_bert), passage_index=str(idx), **{**FAST, **settings})
    return QuerySideTrainer.build(cfg, groups(16), records.read_corpus(corpus_file), out)


def test_passages_are_the_index_vectors_and_never_encoded(tiny_bert, base_index, tmp_path, monkeypatch):
    from retrctl import records
    from retrctl.indexes.dense import stored_vectors
    from retrctl.models import Encoder
    from retrctl.train.engines import PlainEngine
    from retrctl.train.loop import Position

    corpus_file, idx = base_index
    trainer = _trainer(tiny_bert, corpus_file, idx, tmp_path / "m", max_steps=2)
    _, docids, vectors = stored_vectors(idx)
    picked = ["d3", "d0", "d39"]
    expect = vectors[[docids.index(d) for d in picked]]
    assert np.array_equal(trainer.passages.rows(picked).numpy(), expect)
    base = Encoder.load(tiny_bert, device="cpu")
    encoded = base.encode([records.passage_text(trainer.source.corpus[d]) for d in picked], kind="passage")
    np.testing.assert_allclose(expect, encoded, atol=1e-5)  # the index holds the base model's passage vectors
    kinds = []
    forward = PlainEngine.forward
    monkeypatch.setattr(PlainEngine, "forward", lambda self, batch, kind="passage", layout=None:
                        kinds.append(kind) or forward(self, batch, kind, layout))
    trainer.partial.mkdir()  # fit() makes it; the loop alone writes its metrics there
    trainer._loop(Position())
    assert kinds and set(kinds) == {"query"}  # only queries run through the trained model
    assert trainer.plan.cost.passages == 0  # the memory plan counts no passage activations


def test_zero_lr_keeps_the_base_query_encodings(tiny_bert, base_index, tmp_path):
    from retrctl.models import Encoder
    from retrctl.train.loop import Position

    corpus_file, idx = base_index
    trainer = _trainer(tiny_bert, corpus_file, idx, tmp_path / "m", max_steps=3, lr=0.0)
    trainer.partial.mkdir()  # fit() makes it; the loop alone writes its metrics there
    trainer._loop(Position())
    texts = [g["query_text"] for g in groups(4)]
    trainer.enc.eval()
    after = trainer.enc.encode(texts, kind="query")
    base = Encoder.load(tiny_bert, device="cpu", query_max_len=FAST["query_max_len"]).encode(texts, kind="query")
    np.testing.assert_allclose(after, base, atol=1e-6)


def test_query_side_training_lowers_the_loss_and_the_index_records_the_tower(tiny_bert, base_index, tmp_path, runner):
    from retrctl.indexes import open_index
    from retrctl.indexes.dense import stored_vectors
    from retrctl.models import Encoder

    corpus_file, idx = base_index
    r, out = train_tower(runner, tiny_bert, base_index, tmp_path, "--max-steps", 40, "--contrastive-weight", 1)
    assert r.exit_code == 0, r.output
    loss = losses(out)
    assert np.mean(loss[-5:]) < np.mean(loss[:5])
    assert json.loads((out / "train_config.json").read_text())["passage_index"] == str(idx)
    before = json.loads((idx / "index.json").read_text())["current"]
    r = runner("index", corpus_file, "--query-model", out, "-o", idx)
    assert r.exit_code == 0, r.output
    manifest = json.loads((idx / "index.json").read_text())
    assert manifest["current"] != before and manifest["query_model"]["model"] == str(out.resolve())
    # a search with no flag: the tower's queries against the base vectors, which the update did not re-encode
    _, docids, vectors = stored_vectors(idx)
    queries = [{"query_id": g["query_id"], "query_text": g["query_text"]} for g in groups(4)]
    q = Encoder.load(out, device="cpu").encode([x["query_text"] for x in queries], kind="query")
    expect = [docids[int(np.argmax(row))] for row in q @ vectors.T]
    hits = open_index(idx).search(queries, 1)
    assert [hits[x["query_id"]][0][0] for x in queries] == expect
    base_q = Encoder.load(tiny_bert, device="cpu").encode([x["query_text"] for x in queries], kind="query")
    assert not np.allclose(q, base_q, atol=1e-4)  # the tower moved, so the check above tells it from the base
    r = runner("index", corpus_file, "--query-model", out, "-o", idx)  # the same tower again: nothing to publish
    assert r.exit_code == 0 and json.loads((idx / "index.json").read_text())["current"] == manifest["current"]


def test_refusals(tiny_bert, base_index, tmp_path, runner):
    from transformers import AutoTokenizer, BertConfig, BertModel

    corpus_file, idx = base_index
    groups_file = write_jsonl(tmp_path / "groups.jsonl", groups(16))
    args = [groups_file, "--corpus", corpus_file, "--passage-index", idx, *FLAGS, "--max-steps", 1]
    torch.manual_seed(1)
    other = tmp_path / "narrow"
    BertModel(BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=128)).save_pretrained(other)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(other)
    r = runner("train", *args, "--model", other, "-o", tmp_path / "m1")
    assert r.exit_code == 2 and "built by" in r.output and not (tmp_path / "m1").exists()
    missing = write_jsonl(tmp_path / "g2.jsonl", [*groups(4), {"query_id": "x", "query_text": "x",
                                                                "positive_document_ids": ["d1"],
                                                                "negative_document_ids": ["d2", "nowhere"]}])
    extra = write_jsonl(tmp_path / "c2.jsonl", [*map(json.loads, corpus_file.read_text().splitlines()),
                                                 {"_id": "nowhere", "title": "", "text": "a doc the index lacks"}])
    r = runner("train", missing, "--corpus", extra, "--passage-index", idx, *FLAGS, "--model", tiny_bert,
               "-o", tmp_path / "m2")
    assert r.exit_code == 2 and "'nowhere' is not in the passage index" in r.output and not (tmp_path / "m2").exists()
    r = runner("train", *args, "--model", tiny_bert, "--heads", "dense,sparse", "-o", tmp_path / "m3")
    assert r.exit_code == 2 and "--passage-index" in r.output and not (tmp_path / "m3").exists()
    r = runner("index", corpus_file, "--query-model", other, "-o", idx)
    assert r.exit_code == 2 and "16-dim" in r.output
    assert "query_model" not in json.loads((idx / "index.json").read_text())


def test_guard_scores_query_towers_against_the_stored_vectors(tiny_bert, base_index, tmp_path, runner):
    r, out = train_tower(runner, tiny_bert, base_index, tmp_path, "--max-steps", 3, "--guard-shards", 3)
    assert r.exit_code == 0, r.output
    record = json.loads((out / "guard.json").read_text())
    assert record["pool_docs"] == 40  # every doc of the index, none encoded
    assert [c["alpha"] for c in record["candidates"]] == [0.0, 0.5, 1.0]


def test_merged_shards_keep_their_query_tower(tiny_bert, base_index, tmp_path, runner):
    from retrctl.indexes import open_index

    corpus_file, _ = base_index
    r, tower = train_tower(runner, tiny_bert, base_index, tmp_path, "--max-steps", 2)
    assert r.exit_code == 0, r.output
    for i in (0, 1):
        r = runner("index", corpus_file, "--model", tiny_bert, "--shard-id", i, "--shard-num", 2, "-o", tmp_path / f"s{i}")
        assert r.exit_code == 0, r.output
    shard = ["--shard-num", 2, "--shard-id"]  # an update of a shard index reads its shard of the corpus
    assert runner("index", corpus_file, *shard, 0, "--query-model", tower, "-o", tmp_path / "s0").exit_code == 0
    r = runner("index", "--merge", tmp_path / "s0", tmp_path / "s1", "-o", tmp_path / "mixed")  # two query encoders
    assert r.exit_code == 2 and "different query models" in r.output and not (tmp_path / "mixed").exists()
    assert runner("index", corpus_file, *shard, 1, "--query-model", tower, "-o", tmp_path / "s1").exit_code == 0
    r = runner("index", "--merge", tmp_path / "s0", tmp_path / "s1", "-o", tmp_path / "merged")
    assert r.exit_code == 0, r.output
    merged = json.loads((tmp_path / "merged" / "index.json").read_text())
    assert merged["query_model"]["model"] == str(tower.resolve())
    queries = [{"query_id": g["query_id"], "query_text": g["query_text"]} for g in groups(4)]
    assert runner("index", corpus_file, "--query-model", tower, "-o", base_index[1]).exit_code == 0
    whole = open_index(base_index[1])
    got, want = open_index(tmp_path / "merged").search(queries, 3), whole.search(queries, 3)
    assert {q: [d for d, _ in hits] for q, hits in got.items()} == {q: [d for d, _ in hits] for q, hits in want.items()}
    # cosines near 0.9 from vectors encoded in other batches: float32 agrees to a few eps32 (1.2e-7), not bit for bit
    assert all(abs(a[1] - b[1]) < 1e-6 for q in got for a, b in zip(got[q], want[q], strict=True))
