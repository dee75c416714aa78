"""The backend interface (retrctl.indexes.base.Index): a backend registered in BACKENDS is listed by `retrctl index
--help`, built, reopened from its manifest, searched and mined with, with no stage knowing its name; ``score``
equals what search ranks by; one function rebuilds an encoder from a manifest; the core raises its own usage
error, which the CLI shows exactly as click's."""

import json
from collections import Counter
from pathlib import Path

import click
import numpy as np
import pytest
from conftest import DOCS, QUERIES

from retrctl import records
from retrctl.errors import UsageError
from retrctl.indexes import BACKENDS, BM25Index, DenseIndex, open_index, store
from retrctl.indexes import base as index_base
from retrctl.indexes.dense import encoder_from_manifest
from retrctl.models import Encoder
from retrctl.retrievers import IndexRetriever, check_spec, open_retriever


class ToyIndex(index_base.Index):
    """Word overlap: a doc scores the number of query words in it (times ``weight``). Only what a backend must do."""

    name = "toy"
    summary = "word overlap"
    flags = ("k1",)  # borrows --k1 as its weight

    def __init__(self, weight: float = 1.0):
        super().__init__()
        self.weight = float(weight)
        self.words: list[Counter] = []

    @classmethod
    def create(cls, encoder=None, *, k1: float = 1.0):
        return cls(weight=k1)

    def config(self) -> dict:
        return {"weight": self.weight}

    def sync(self, docs, delete=True):
        stats, seen = index_base.new_stats(), set()
        for doc, h, pos in list(self._classify(docs, seen, stats)):
            if pos is not None:
                self._hash[pos], self.words[pos] = h, Counter(records.passage_text(doc).lower().split())
            else:
                self._append_ids([doc["docid"]], [h])
                self.words.append(Counter(records.passage_text(doc).lower().split()))
        gone = set(self._missing_rows(seen)) if delete else set()
        stats["removed"] = len(gone)
        if gone:
            keep = np.array([i not in gone for i in range(len(self.docids))])
            self.words = [w for w, k in zip(self.words, keep, strict=True) if k]
            self._keep_rows(keep)
        return stats

    def _all(self, query) -> np.ndarray:
        q = query["query_text"].lower().split()
        return np.array([self.weight * sum(w[t] > 0 for t in q) for w in self.words], dtype=np.float32)

    def search(self, queries, k):
        out = {}
        for q in queries:
            s = self._all(q)
            rows = [r for r in index_base.top_k(s, self.order_key(), k) if s[r] > 0] if len(s) else []
            out[q["query_id"]] = [(self.docids[r], float(s[r])) for r in rows]
        return out

    def score(self, query, docids):
        s = self._all(query)
        return {d: float(s[self._pos[d]]) for d in docids if d in self._pos}

    def manifest(self) -> dict:
        return {"backend": self.name, "settings": self.config(), "doc_count": len(self), "files": {"docids": index_base.DOCIDS,
                "words": "words.json"}, **self.meta}

    def write_files(self, directory: Path) -> None:
        (directory / "words.json").write_text(json.dumps([dict(w) for w in self.words]))
        index_base.write_docids(directory, self.docids, self._hash)
        index_base.write_manifest(directory, self.manifest())

    def save(self, directory, keep=store.KEEP) -> None:
        with store.new_version(directory, keep) as tmp:
            self.write_files(tmp)

    @classmethod
    def load(cls, directory, **_ignored):
        version = store.resolved(directory)
        idx = cls(**version.manifest["settings"])
        idx._set_ids(*index_base.read_docids(version.path))
        idx.words = [Counter(w) for w in json.loads((version.path / "words.json").read_text())]
        idx.meta = {k: version.manifest[k] for k in ("source", "shard") if k in version.manifest}
        idx.version = version
        return idx


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(BACKENDS, "toy", ToyIndex)
    return ToyIndex


def write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


# ---------------------------------------------------------------- a backend known only through BACKENDS


def test_a_registered_backend_is_a_method_choice(toy, runner):
    r = runner("index", "--help")
    assert r.exit_code == 0 and "[dense|sparse|bm25|toy]" in r.stdout


def test_method_choices_are_the_registered_backends(runner):
    r = runner("index", "--help")
    assert r.exit_code == 0 and "[dense|sparse|bm25]" in r.stdout


def test_an_unregistered_backend_is_refused_by_the_flag(runner, corpus_file, tmp_path):
    r = runner("index", corpus_file, "--method", "toy", "-o", tmp_path / "idx")
    assert r.exit_code == 2 and "'toy' is not one of" in r.stderr


def test_a_registered_backend_is_built_reopened_searched_and_updated_by_the_stages(toy, runner, corpus_file, queries_file,
                                                                                   tmp_path):
    out = tmp_path / "idx"
    r = runner("index", corpus_file, "--method", "toy", "--k1", 2, "-o", out)
    assert r.exit_code == 0 and "toy index" in r.stderr and "6 added" in r.stderr, r.stderr
    idx = open_index(out)  # from its manifest, through BACKENDS
    assert isinstance(idx, ToyIndex) and idx.weight == 2.0 and len(idx) == 6 and idx.version.name == "000001"
    mem = ToyIndex.create(k1=2)
    mem.build(DOCS)
    assert idx.search(QUERIES, 3) == mem.search(QUERIES, 3) and any(idx.search(QUERIES, 3).values())
    run = runner("search", out, queries_file, "--hits", 2, "-o", tmp_path / "run.trec")
    assert run.exit_code == 0, run.stderr
    lines = (tmp_path / "run.trec").read_text().splitlines()
    assert lines and all(line.split()[5] == "toy" for line in lines)  # the base run tag: the backend's name
    # the same settings: an update in place (nothing changed); other settings: a rebuild
    same = runner("index", corpus_file, "--k1", 2, "-o", out)  # the backend comes from the manifest
    assert same.exit_code == 0 and "0 added, 0 updated, 6 unchanged" in same.stderr and store.resolve(out).name == "000001"
    other = runner("index", corpus_file, "--method", "toy", "--k1", 3, "-o", out)
    assert other.exit_code == 0 and "weight: 2.0 -> 3.0" in other.stderr and open_index(out).weight == 3.0
    # encoder flags mean nothing to it: warned about, not an error
    warned = runner("search", out, queries_file, "--query-prompt", "q: ")
    assert warned.exit_code == 0 and "encoder flags are ignored by a toy index" in warned.stderr


def test_a_registered_backend_without_encoder_is_a_retriever_name(toy, runner, corpus_file, queries_file, qrels_file):
    assert check_spec("toy") == "toy"
    r = open_retriever("toy", model=None, docs={d["docid"]: d for d in DOCS}, corpus_path=None)
    assert isinstance(r.index, ToyIndex)
    res = runner("mine", queries_file, "--corpus", corpus_file, "--qrels", qrels_file, "--retriever", "toy",
                 "--negative-range", "1-5", "-q")
    assert res.exit_code == 0 and res.stdout, res.stderr


def test_a_merge_of_two_backends_is_refused(toy, runner, corpus_file, tmp_path):
    assert runner("index", corpus_file, "--method", "toy", "-o", tmp_path / "a").exit_code == 0
    assert runner("index", corpus_file, "--method", "bm25", "-o", tmp_path / "b").exit_code == 0
    r = runner("index", "--merge", tmp_path / "a", tmp_path / "b", "-o", tmp_path / "m")
    assert r.exit_code == 2 and "different backends: bm25, toy" in r.stderr


# ---------------------------------------------------------------- score equals search


def _searched(idx, k):
    return {q["query_id"]: dict(idx.search([q], k)[q["query_id"]]) for q in QUERIES}


def test_bm25_score_equals_search_scores():
    idx = BM25Index()
    idx.build(DOCS)
    found = _searched(idx, len(DOCS))
    for q in QUERIES:
        got = idx.score(q, [d["docid"] for d in DOCS] + ["nope"])
        assert set(got) == {d["docid"] for d in DOCS}  # an unknown doc is left out
        for d, s in got.items():
            assert s == found[q["query_id"]].get(d, 0.0)  # bitwise; 0.0 where no query term occurs
    assert any(s == 0.0 for s in idx.score(QUERIES[0], [d["docid"] for d in DOCS]).values())
    assert idx.score({"query_id": "x", "query_text": "zzzz qqqq"}, ["d1"]) == {"d1": 0.0}


def test_bm25_score_after_an_update_matches_the_updated_search():
    idx = BM25Index()
    idx.build(DOCS)
    idx.sync([*DOCS[:4], {"docid": "d7", "title": "Purr", "text": "A cat will purr."}])  # d5, d6 removed
    found = _searched(idx, 10)["q1"]
    assert idx.score(QUERIES[0], ["d7", "d1", "d3", "d6"]) == {"d7": found["d7"], "d1": found["d1"], "d3": 0.0}


@pytest.mark.parametrize("index_type", ["Flat", "IVF2,Flat"])
def test_dense_score_equals_search_scores(index_type, tiny_bert):
    idx = DenseIndex(Encoder.load(tiny_bert, device="cpu"), index_type, batch_size=4)
    idx.build(DOCS)
    fresh = {q["query_id"]: idx.score(q, [d["docid"] for d in DOCS]) for q in QUERIES}  # encodes the query itself
    found = {q["query_id"]: dict(r) for q in QUERIES for r in [idx.search(QUERIES, len(DOCS))[q["query_id"]]]}
    for q in QUERIES:
        again = idx.score(q, [d["docid"] for d in DOCS] + ["nope"])  # reuses the vector of the search just run
        assert set(again) == {d["docid"] for d in DOCS}
        for d in again:
            assert again[d] == pytest.approx(found[q["query_id"]][d], abs=1e-5)
            assert again[d] == pytest.approx(fresh[q["query_id"]][d], abs=1e-6)


def test_index_retriever_scores_through_the_backend(tiny_bert):
    bm25 = BM25Index()
    bm25.build(DOCS)
    r = IndexRetriever(bm25)
    assert r.score("q1", ["d1"]) == {}  # no query of that id searched yet
    r.search(QUERIES, 1)
    assert r.score("q2", ["d3", "d5"]) == bm25.score(QUERIES[1], ["d3", "d5"])


# ---------------------------------------------------------------- the encoder from a manifest


def test_encoder_from_manifest_takes_the_manifest_settings_and_the_given_overrides(tiny_bert, caplog):
    enc = Encoder.load(tiny_bert, device="cpu", query_prompt="query: ", pooling="cls")
    idx = DenseIndex(enc)
    manifest = idx.manifest()
    again = encoder_from_manifest(manifest, device="cpu")
    assert (again.config.query_prompt, again.config.pooling) == ("query: ", "cls")
    assert np.allclose(again.encode(["tea"]), enc.encode(["tea"]), atol=1e-6)
    over = encoder_from_manifest(manifest, device="cpu", query_prompt="q: ", pooling=None)  # None: a flag not given
    assert (over.config.query_prompt, over.config.pooling) == ("q: ", "cls") and "mismatches" not in caplog.text
    encoder_from_manifest(manifest, device="cpu", warn=Path("IDX"), pooling="mean")  # a doc-vector setting: warned
    assert "index IDX was built with pooling='cls'" in caplog.text
    assert DenseIndex.encoder_for(None, manifest, device="cpu", query_prompt="z: ").config.query_prompt == "z: "


def test_content_settings_leave_out_what_does_not_change_stored_data():
    a = {"backend": "dense", "settings": {"index_type": "Flat", "batch_size": 8, "nprobe": 4}, "encoder": {"model": "m", "pooling": "mean"}}
    b = {**a, "settings": {"index_type": "Flat", "batch_size": 64, "nprobe": 32}}
    assert DenseIndex.content_settings(a) == DenseIndex.content_settings(b)
    assert DenseIndex.content_settings(a) != DenseIndex.content_settings({**a, "encoder": {"model": "m", "pooling": "cls"}})
    bm = BM25Index().manifest()
    assert BM25Index.content_settings(bm) != BM25Index.content_settings(BM25Index(k1=1.2).manifest())


# ---------------------------------------------------------------- the core's usage error


def test_the_core_raises_its_own_usage_error_and_the_cli_shows_it_as_clicks(runner, queries_file, corpus_file):
    with pytest.raises(UsageError, match="hybrid needs --model") as e:
        check_spec("hybrid")
    assert not isinstance(e.value, click.ClickException)
    r = runner("mine", queries_file, "--corpus", corpus_file, "--retriever", "hybrid")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr == ("Usage: retrctl mine [OPTIONS] [INPUT]\nTry 'retrctl mine --help' for help.\n\n"
                        "Error: --retriever hybrid needs --model (the dense half)\n")
