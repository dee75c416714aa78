"""BGE-M3's index: the colbert head's token vectors beside the dense and lexical heads in one index
(retrctl/indexes/heads/, indexes/multivector.py) and the hybrid re-scoring search. Tiny random BERT; the
real-model numbers are bench/m3.py's."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from conftest import DOCS, QUERIES

from retrctl.indexes import DenseIndex, HeadsIndex, open_index
from retrctl.models import Encoder
from retrctl.models.colbert import maxsim_numpy
from retrctl.models.sparse import to_csr
from retrctl.records import passage_text
from stages.index import index

CHANGED = [{**d, "text": "Python is slow but pleasant."} if d["docid"] == "d3" else d for d in DOCS if d["docid"] != "d5"]
CHANGED += [{"docid": "d7", "title": "Leaves", "text": "Tea leaves and coffee beans."}]


@pytest.fixture(scope="module")
def m3_model(tiny_bert, tmp_path_factory):
    """tiny_bert with BGE-M3's lexical (symmetric, all terms) and colbert (dim 8) heads, saved."""
    e = Encoder.load(tiny_bert, device="cpu")
    torch.manual_seed(0)
    e.add_sparse_head(top_k=0, query="encoder", weights="lexical")
    e.add_colbert_head(dim=8)
    with torch.no_grad():
        e.sparse.linear.weight.add_(0.5)  # most tokens weigh something
    out = tmp_path_factory.mktemp("m3") / "m"
    e.save(out)
    return out


@pytest.fixture(scope="module")
def m3_index(m3_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("m3idx") / "idx"
    index(DOCS, out, model=str(m3_model))
    return out


def _ids(run):
    return {q: [d for d, _ in hits] for q, hits in run.items()}


def _same(a, b, atol=1e-5):
    assert _ids(a) == _ids(b)
    for q in a:
        np.testing.assert_allclose([s for _, s in a[q]], [s for _, s in b[q]], atol=atol)


def _searches(idx, heads=("dense", "sparse", "colbert", "dense,sparse", "dense,colbert", "dense,sparse,colbert")):
    out = {}
    for h in heads:
        idx.heads = h
        out[h] = idx.search(QUERIES, 6)
    idx.heads = list(idx.built)
    return out


def test_every_head_in_one_pass_saved_compactly_and_reloaded_with_identical_scores(m3_model, tmp_path, monkeypatch):
    enc = Encoder.load(m3_model, device="cpu")
    calls = []
    real = enc.encode_heads
    monkeypatch.setattr(enc, "encode_heads", lambda texts, kind, batch_size, heads: calls.append(heads) or real(texts, kind, batch_size, heads))
    idx = DenseIndex.create(enc)
    assert isinstance(idx, HeadsIndex)
    idx.build(DOCS)
    assert calls == [("dense", "sparse", "colbert")]  # one pass over the corpus for all three heads
    before = _searches(idx)
    idx.save(tmp_path / "idx")

    again = open_index(tmp_path / "idx")
    assert isinstance(again, HeadsIndex) and again.built == ["dense", "sparse", "colbert"]
    assert _searches(again) == before  # same floats: the fp16 tokens are stored as they were searched
    m = again.version.manifest
    want = real([passage_text(d) for d in DOCS], "passage", 32, ("colbert",))["colbert"]
    assert m["colbert"]["dim"] == 8 and m["colbert"]["tokens"] == sum(len(t) for t in want)
    assert m["sparse"]["query"] == "encoder" and m["settings"]["top_k"] == 128  # a lexical head keeps all its terms
    tokens = np.load(again.version.path / m["colbert"]["files"]["tokens"])
    offsets = np.load(again.version.path / m["colbert"]["files"]["offsets"])
    assert tokens.dtype == np.float16 and offsets.dtype == np.int64 and len(offsets) == len(DOCS) + 1
    for i, t in enumerate(want):
        np.testing.assert_allclose(tokens[offsets[i] : offsets[i + 1]], t, atol=1e-3)
    assert re.search(r"bytes per doc: dense \d+, sparse \d+, colbert \d+$", again.describe()), again.describe()


def test_candidates_then_rescore_equal_brute_force_when_depth_covers_the_corpus(m3_index):
    idx = open_index(m3_index)
    idx.depth = len(DOCS)
    for heads in ("dense,sparse,colbert", "dense,colbert", "sparse,colbert", "colbert"):
        idx.heads, idx.candidates = heads, "all"
        brute = idx.search(QUERIES, 6)
        for cands in (None, "dense", "sparse", "dense,lexical"):
            idx.candidates = cands
            _same(idx.search(QUERIES, 6), brute)
    # a shallow depth finds fewer docs, each scored as brute force scores it
    idx.heads, idx.candidates, idx.depth = "dense,sparse,colbert", "all", 1
    brute = {q: dict(hits) for q, hits in idx.search(QUERIES, 6).items()}
    idx.candidates = "dense"
    for q, hits in idx.search(QUERIES, 1).items():
        assert len(hits) == 1 and hits[0][1] == pytest.approx(brute[q][hits[0][0]], abs=1e-5)


def _hand(enc, query: str, docs: list[dict], weights=(1.0, 0.3, 1.0)) -> np.ndarray:
    d = enc.encode_heads([passage_text(x) for x in docs], "passage")
    q = enc.encode_heads([query], "query")
    vocab = enc.sparse.vocab
    lex = (to_csr(*d["sparse"], vocab) @ to_csr(*q["sparse"], vocab).T).toarray()[:, 0]
    mul = np.array([maxsim_numpy(q["colbert"][0], [t])[0] for t in d["colbert"]])
    return weights[0] * d["dense"] @ q["dense"][0] + weights[1] * lex + weights[2] * mul


def test_s_rank_is_the_weighted_sum_of_the_raw_head_scores(m3_index):
    idx = open_index(m3_index)
    ids = [d["docid"] for d in DOCS]
    for q in QUERIES:
        want = _hand(idx.encoder, q["query_text"], DOCS)
        got = idx.score(q, [*ids, "nope"])
        np.testing.assert_allclose([got[d] for d in ids], want, atol=2e-3)  # tokens stored as fp16
        assert dict(idx.search([q], 6)[q["query_id"]]) == pytest.approx(got, abs=1e-6)  # search ranks by score()
    idx.weights = [0.5, 2.0, 1.5]
    q = QUERIES[1]
    np.testing.assert_allclose(list(idx.score(q, ids).values()), _hand(idx.encoder, q["query_text"], DOCS, (0.5, 2.0, 1.5)),
                               atol=5e-3)
    idx.weights, idx.heads = None, "dense,colbert"
    np.testing.assert_allclose(list(idx.score(q, ids).values()), _hand(idx.encoder, q["query_text"], DOCS, (1.0, 0.0, 1.0)),
                               atol=2e-3)


def test_three_heads_update_like_a_fresh_build(m3_model, tmp_path):
    index(DOCS, tmp_path / "idx", model=str(m3_model))
    stats = index(CHANGED, tmp_path / "idx")
    assert (stats["added"], stats["updated"], stats["removed"], stats["encoded"]) == (1, 1, 1, 2)
    index(CHANGED, tmp_path / "fresh", model=str(m3_model))
    a, b = open_index(tmp_path / "idx"), open_index(tmp_path / "fresh")
    assert a.docids == b.docids
    ta, oa = a.stores["colbert"].arrays()
    tb, ob = b.stores["colbert"].arrays()
    assert np.array_equal(oa, ob)
    np.testing.assert_allclose(ta, tb, atol=2e-3)  # d3 and d7 were encoded in another batch
    ra, rb = _searches(a), _searches(b)
    for heads in ra:
        _same(ra[heads], rb[heads], atol=2e-3)
    assert index(CHANGED, tmp_path / "idx")["written"] is False  # nothing changed: nothing rewritten


def test_a_killed_three_head_build_resumes_from_its_chunks(m3_model, tmp_path, monkeypatch):
    real, calls = Encoder.encode_heads, []

    def dies(self, texts, kind="passage", batch_size=32, heads=()):
        calls.append(kind)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return real(self, texts, kind, batch_size, heads)

    monkeypatch.setattr(Encoder, "encode_heads", dies)
    with pytest.raises(KeyboardInterrupt):
        index(DOCS, tmp_path / "idx", model=str(m3_model), checkpoint_every=2)
    assert len(list((tmp_path / "idx.partial").glob("*.json"))) == 2 and not (tmp_path / "idx" / "index.json").exists()
    monkeypatch.setattr(Encoder, "encode_heads", real)
    stats = index(DOCS, tmp_path / "idx", model=str(m3_model), checkpoint_every=2)
    assert stats["encoded"] == 2  # chunks 0 and 1 (4 docs) came from the checkpoints
    assert not (tmp_path / "idx.partial").exists()
    index(DOCS, tmp_path / "clean", model=str(m3_model), checkpoint_every=2)
    a, b = open_index(tmp_path / "idx"), open_index(tmp_path / "clean")
    assert np.array_equal(a.stores["colbert"].arrays()[0], b.stores["colbert"].arrays()[0])
    assert _searches(a) == _searches(b)


def test_three_head_shards_merge_to_the_whole(m3_model, corpus_file, queries_file, tmp_path, runner):
    for s in (0, 1):
        r = runner("index", corpus_file, "--model", m3_model, "--shard-id", s, "--shard-num", 2, "-o", tmp_path / f"s{s}")
        assert r.exit_code == 0, r.stderr
    assert runner("index", "--merge", tmp_path / "s0", tmp_path / "s1", "-o", tmp_path / "merged").exit_code == 0
    r = runner("index", corpus_file, "--model", m3_model, "-o", tmp_path / "whole")
    assert r.exit_code == 0 and re.search(r"index size per doc: dense \d+ bytes, sparse \d+ bytes, colbert \d+ bytes", r.stderr)
    runs = {}
    for name in ("merged", "whole"):
        for cands in ("dense,sparse", "all"):
            r = runner("search", tmp_path / name, queries_file, "--hits", 4, "--candidates", cands, "-o", tmp_path / f"{name}-{cands}.trec")
            assert r.exit_code == 0, r.stderr
            runs[name, cands] = (tmp_path / f"{name}-{cands}.trec").read_text()
    assert runs["merged", "dense,sparse"] == runs["whole", "dense,sparse"]
    assert runs["merged", "all"] == runs["whole", "all"]
    m = json.loads((tmp_path / "whole-all.trec.manifest.json").read_text())
    assert m["settings"]["heads"] == ["dense", "sparse", "colbert"] and m["settings"]["candidates"] == "all"
    assert "bytes per doc" in r.stderr  # the search log describes the index


def test_a_subset_of_heads(m3_model, corpus_file, queries_file, tmp_path, runner):
    r = runner("index", corpus_file, "--model", m3_model, "--heads", "dense,colbert", "-o", tmp_path / "dc")
    assert r.exit_code == 0, r.stderr
    idx = open_index(tmp_path / "dc")
    assert idx.built == ["dense", "colbert"] and "sparse" not in idx.version.manifest
    assert not list((tmp_path / "dc").rglob("terms.npy"))
    for heads in ("dense,colbert", "colbert"):  # candidates: dense's top 100; colbert alone: every doc
        r = runner("search", tmp_path / "dc", queries_file, "--heads", heads, "-o", tmp_path / "run.trec")
        assert r.exit_code == 0, r.stderr
    r = runner("index", corpus_file, "--model", m3_model, "--heads", "dense,lexical,colbert", "-o", tmp_path / "all")
    assert r.exit_code == 0, r.stderr
    assert open_index(tmp_path / "all").built == ["dense", "sparse", "colbert"]


def _one_error(r, *words):
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert r.exit_code == 2 and len(errors) == 1 and all(w in errors[0] for w in words), r.stderr


def test_heads_and_candidates_that_cannot_work_exit_2(m3_model, tiny_bert, corpus_file, queries_file, tmp_path, runner):
    _one_error(runner("index", corpus_file, "--model", tiny_bert, "--heads", "dense,colbert", "-o", tmp_path / "x"),
               "no colbert head", "--heads dense,lexical,colbert")
    _one_error(runner("index", corpus_file, "--model", m3_model, "--heads", "colbert", "-o", tmp_path / "x"), "dense")
    assert not (tmp_path / "x" / "index.json").exists()
    assert runner("index", corpus_file, "--model", m3_model, "--heads", "dense,colbert", "-o", tmp_path / "dc").exit_code == 0
    search = lambda *a: runner("search", tmp_path / "dc", queries_file, *a)  # noqa: E731
    _one_error(search("--candidates", "sparse"), "--candidates sparse", "holds dense,colbert")
    _one_error(search("--candidates", "colbert"), "--candidates colbert")
    _one_error(search("--candidates", "bm25"), "--candidates bm25")
    _one_error(search("--heads", "dense", "--candidates", "dense"), "--candidates", "colbert")
    _one_error(search("--fusion", "rrf"), "--fusion")
    _one_error(search("--weights", "1,0.3,1"), "--weights", "dense,colbert")
    assert runner("index", corpus_file, "--model", tiny_bert, "-o", tmp_path / "plain").exit_code == 0
    _one_error(runner("search", tmp_path / "plain", queries_file, "--candidates", "all"), "--candidates", "one head")


def test_token_lanes_are_finite_exactly_when_the_tokens_are(m3_model, monkeypatch):
    from retrctl.indexes.multivector import from_lanes, to_lanes

    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    finite = every[np.isfinite(every)].astype(np.float32)  # each finite fp16 value, in both halves of a lane
    docs = [np.stack([finite, finite[::-1]], axis=1), np.zeros((0, 2), np.float32)]
    rows = to_lanes(docs, 2)
    assert np.isfinite(rows).all()  # so _encode's NaN check never fires on real tokens
    tokens, counts = from_lanes(rows, 2)
    assert counts.tolist() == [len(finite), 0] and np.array_equal(tokens.astype(np.float32), docs[0])

    enc = Encoder.load(m3_model, device="cpu")
    real = enc.encode_heads

    def broken(texts, kind, batch_size, heads):
        out = real(texts, kind, batch_size, heads)
        out["colbert"][1] = np.full_like(out["colbert"][1], np.nan)
        return out

    monkeypatch.setattr(enc, "encode_heads", broken)
    with pytest.raises(ValueError, match="NaN/inf vectors for 1 docs, e.g. 'd2'"):
        DenseIndex.create(enc).build(DOCS)
