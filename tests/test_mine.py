"""mine: positives, rank-range sampling, false-negative guards, exact counters, backends agree, cache, formats, CLI."""

import json
import logging
import random

import numpy as np
import pytest
from conftest import DOCS, QRELS, QUERIES, shared_data

from retrctl import records
from retrctl.indexes.bm25 import BM25Index
from retrctl.retrievers import HybridRetriever, IndexRetriever, RunRetriever, dense_index
from stages.mine import mine

WORDS = ("cats purr mammals domesticated memory safe programming language caffeine drink beans tea leaves "
         "water systems python rust dogs wolves loyal code readability aromatic brewed roasted").split()


def _corpus() -> dict:
    """DOCS plus 40 filler docs sharing the query vocabulary, and a copy of d1's text under another id."""
    rng = random.Random(0)
    docs = {d["docid"]: {"title": d["title"], "text": d["text"]} for d in DOCS}
    for i in range(40):
        docs[f"f{i:02d}"] = {"title": "", "text": " ".join(rng.choice(WORDS) for _ in range(12))}
    docs["d1copy"] = {"title": "Felines", "text": "  cats are small DOMESTICATED carnivorous mammals.  They purr when content."}
    return docs


def _bm25(corpus):
    idx = BM25Index()
    idx.build({"docid": d, **doc} for d, doc in corpus.items())
    return IndexRetriever(idx)


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def mcorpus(tmp_path):
    corpus = _corpus()
    return corpus, _write(tmp_path / "mcorpus.jsonl", [{"docid": d, **doc} for d, doc in corpus.items()])


# ---------------------------------------------------------------- Python API


def test_bm25_groups_exclude_positives_and_sample_in_rank_order():
    corpus = _corpus()
    stats = {}
    groups = list(mine(QUERIES, corpus=corpus, retriever=_bm25(corpus), qrels=QRELS, negative_range="1-30",
                       num_negatives=4, seed=1, stats=stats))
    assert [g["query_id"] for g in groups] == ["q1", "q2", "q3"]
    ranked = _bm25(corpus).search(QUERIES, 30)
    for g in groups:
        judged = set(QRELS[g["query_id"]])
        assert g["positive_document_ids"] == sorted(judged, key=lambda d: (-QRELS[g["query_id"]][d], d))
        assert not judged & set(g["negative_document_ids"])
        assert len(g["negative_document_ids"]) == 4 == len(set(g["negative_document_ids"]))
        order = [d for d, _ in ranked[g["query_id"]]]
        assert [order.index(d) for d in g["negative_document_ids"]] == sorted(order.index(d) for d in g["negative_document_ids"])
        assert g["negative_scores"] == sorted(g["negative_scores"], reverse=True)
    again = list(mine(QUERIES, corpus=corpus, retriever=_bm25(corpus), qrels=QRELS, negative_range="1-30", num_negatives=4, seed=1))
    assert again == groups
    other = [list(mine(QUERIES, corpus=corpus, retriever=_bm25(corpus), qrels=QRELS, negative_range="1-30", num_negatives=4, seed=s))
             for s in (2, 3)]
    assert any(o != groups for o in other)
    assert stats["groups"] == 3 and stats["kept"] == 12


def test_positive_text_under_another_id_is_never_a_negative():
    corpus = _corpus()  # d1copy has d1's text (other case, spacing and title)
    stats = {}
    groups = list(mine([QUERIES[0]], corpus=corpus, retriever=_bm25(corpus), qrels={"q1": {"d1": 1}},
                       negative_range="1-45", num_negatives=45, stats=stats))
    assert "d1copy" not in groups[0]["negative_document_ids"] and "d1" not in groups[0]["negative_document_ids"]
    assert stats["skip_positive_text"] == 1 and stats["skip_positive"] == 1


def test_judged_positive_missing_from_corpus_is_still_excluded_by_id():
    run = RunRetriever({"q": [("a", 3.0), ("ghost", 2.0), ("b", 1.0)]})
    corpus = {d: {"title": "", "text": f"text {d}"} for d in "ab"}
    st = {}
    g = list(mine([{"query_id": "q", "query_text": "x"}], corpus=corpus, retriever=run, qrels={"q": {"a": 1, "ghost": 1}},
                  negative_range="1-3", stats=st))[0]
    assert g["positive_document_ids"] == ["a"] and g["negative_document_ids"] == ["b"]
    assert st["positive_not_in_corpus"] == 1 and st["skip_positive"] == 2


def _scored_run():
    corpus = {d: {"title": "", "text": f"doc {d}"} for d in ("p", "a", "b", "c", "d", "e")}
    run = RunRetriever({"q": [("p", 10.0), ("a", 9.6), ("b", 9.5), ("c", 9.0), ("d", 5.0), ("e", -1.0)]})
    return corpus, run


@pytest.mark.parametrize(
    "kw, kept, skipped",
    [
        ({}, ["a", "b", "c", "d", "e"], 0),
        ({"margin": 0.5}, ["b", "c", "d", "e"], 1),  # 9.6 > 10 - 0.5 dropped; 9.5 is not > 9.5
        ({"margin": 6.0}, ["e"], 4),
        ({"relative_margin": 0.1}, ["c", "d", "e"], 2),  # > 10 * 0.9 dropped; 9.0 kept
        ({"margin": 0.45, "relative_margin": 0.5}, ["d", "e"], 3),  # a by margin; b, c by relative; 5.0 == bound stays
    ],
)
def test_margins_follow_sentence_transformers_semantics(kw, kept, skipped):
    corpus, run = _scored_run()
    st = {}
    g = list(mine([{"query_id": "q", "query_text": "x", "source_docid": "p"}], corpus=corpus, retriever=run,
                  negative_range="1-6", num_negatives=10, stats=st, **kw))[0]
    assert g["negative_document_ids"] == kept and g["positive_scores"] == [10.0]
    assert st["skip_margin"] + st["skip_relative_margin"] == skipped


def test_unscored_positive_uses_upper_bound_and_null_scores():
    corpus, run = _scored_run()
    corpus["z"] = {"title": "", "text": "not retrieved"}
    g = list(mine([{"query_id": "q", "query_text": "x", "source_docid": "z"}], corpus=corpus, retriever=run,
                  negative_range="1-6", margin=0.0, num_negatives=10))[0]
    # z scores at most -1.0 (rank 6): everything scoring above it is dropped; e ties the bound and stays
    assert g["positive_scores"] is None and g["negative_document_ids"] == ["e"]
    records.normalize_group(g)


def test_shortfall_counter_is_per_group_and_exact(caplog):
    caplog.set_level(logging.INFO, logger="retrctl.mine")
    corpus = {f"x{i}": {"title": "", "text": f"doc {i}"} for i in range(20)}
    run = RunRetriever({
        "full": [(f"x{i}", 20.0 - i) for i in range(20)],  # 19 eligible: not short
        "two": [("x0", 5.0), ("x1", 4.0), ("x2", 3.0)],  # 2 eligible: short by 3
        "none": [("x0", 1.0)],  # only the positive: short by 5
    })
    qs = [{"query_id": q, "query_text": q, "source_docid": "x0"} for q in ("full", "two", "none")]
    st = {}
    groups = list(mine(qs, corpus=corpus, retriever=run, negative_range="1-20", num_negatives=5, stats=st))
    assert [len(g["negative_document_ids"]) for g in groups] == [5, 2, 0]
    assert st["short_groups"] == 2 and st["missing_negatives"] == 8
    assert "2 of 3 groups have fewer than 5 negatives (8 negatives short in total)" in caplog.text


def test_positive_ranks_and_range_bounds():
    corpus = {f"x{i:02d}": {"title": "", "text": f"doc {i}"} for i in range(30)}
    run = RunRetriever({"q": [(f"x{i:02d}", 30.0 - i) for i in range(30)]})
    g = list(mine([{"query_id": "q", "query_text": "x"}], corpus=corpus, retriever=run, positive_ranks=3,
                  negative_range="10-20", num_negatives=20))[0]
    assert g["positive_document_ids"] == ["x00", "x01", "x02"]
    assert g["negative_document_ids"] == [f"x{i:02d}" for i in range(9, 20)]  # ranks 10..20 inclusive
    none = list(mine([{"query_id": "q", "query_text": "x"}], corpus=corpus, retriever=run))
    assert none == []  # no known positive and no rank positives: no group


def test_ties_broken_by_docid_whatever_the_backend_order():
    corpus = {d: {"title": "", "text": f"doc {d}"} for d in ("p", "b", "a", "c")}
    trec_order = RunRetriever({"q": [("p", 2.0), ("c", 1.0), ("b", 1.0), ("a", 1.0)]})  # docid descending
    g = list(mine([{"query_id": "q", "query_text": "x", "source_docid": "p"}], corpus=corpus, retriever=trec_order,
                  negative_range="2-3", num_negatives=5))[0]
    assert g["negative_document_ids"] == ["a", "b"]


def test_queries_are_searched_in_bounded_chunks():
    corpus = _corpus()
    inner = _bm25(corpus)
    sizes = []

    class Spy:
        def search(self, queries, k):
            sizes.append(len(queries))
            return inner.search(queries, k)

    qs = [{**q, "query_id": f"{q['query_id']}-{i}"} for i in range(5) for q in QUERIES]
    qrels = {q["query_id"]: QRELS[q["query_id"].split("-")[0]] for q in qs}
    chunked = list(mine(qs, corpus=corpus, retriever=Spy(), qrels=qrels, negative_range="1-20", batch_size=4))
    assert max(sizes) == 4 and sum(sizes) == 15
    whole = list(mine(qs, corpus=corpus, retriever=inner, qrels=qrels, negative_range="1-20", batch_size=100))
    assert chunked == whole


def test_output_formats_parse_back(mcorpus):
    corpus = mcorpus[0]
    base = list(mine(QUERIES, corpus=corpus, retriever=_bm25(corpus), qrels=QRELS, negative_range="1-20", num_negatives=3))
    for fmt in ("tevatron", "tevatron-legacy", "flagembedding"):
        out = list(mine(QUERIES, corpus=corpus, retriever=_bm25(corpus), qrels=QRELS, negative_range="1-20",
                        num_negatives=3, group_format=fmt))
        for g, row in zip(base, out, strict=True):
            back = records.normalize_group(json.loads(json.dumps(row)))
            if fmt == "flagembedding":
                assert [back["passages"][p]["text"] for p in back["positive_document_ids"]] == \
                    [f"{corpus[d]['title']} {corpus[d]['text']}".strip() for d in g["positive_document_ids"]]
                assert len(back["negative_document_ids"]) == len(g["negative_document_ids"])
            else:
                assert back["query_id"] == g["query_id"] and back["query_text"] == g["query_text"]
                assert back["positive_document_ids"] == g["positive_document_ids"]
                assert back["negative_document_ids"] == g["negative_document_ids"]
            if fmt == "tevatron-legacy":
                assert all(back["passages"][d]["text"] == corpus[d]["text"] for d in g["negative_document_ids"])
    trip = list(mine(QUERIES, corpus=corpus, retriever=_bm25(corpus), qrels=QRELS, negative_range="1-20",
                     num_negatives=3, group_format="triplets"))
    assert len(trip) == sum(len(g["positive_document_ids"]) * len(g["negative_document_ids"]) for g in base)
    assert set(trip[0]) == {"anchor", "positive", "negative"} and trip[0]["anchor"] == QUERIES[0]["query_text"]


# ---------------------------------------------------------------- dense: exact vs faiss, cache, hybrid


def _exact_run(tiny_bert, corpus, queries, k):
    """Brute-force numpy scores (no faiss), ties by docid: the reference backend."""
    from retrctl.indexes.base import top_k
    from retrctl.models import Encoder

    enc = Encoder.load(tiny_bert, device="cpu")
    ids = list(corpus)
    dv = enc.encode([f"{corpus[d]['title']} {corpus[d]['text']}".strip() for d in ids])
    qv = enc.encode([q["query_text"] for q in queries], kind="query")
    key = np.argsort(np.argsort(np.asarray(ids, dtype=object)))
    run = {}
    for q, v in zip(queries, qv, strict=True):
        s = dv @ v
        run[q["query_id"]] = [(ids[r], float(s[r])) for r in top_k(s, key, k)]
    return run


def test_dense_exact_and_faiss_flat_give_the_same_groups(tiny_bert):
    corpus = _corpus()
    corpus["f00dup"] = dict(corpus["f00"])  # identical vectors: exact score ties
    corpus["f01dup"] = dict(corpus["f01"])
    idx = dense_index(str(tiny_bert), corpus, None, batch_size=8, cache=False, device="cpu")
    kw = {"qrels": QRELS, "negative_range": "2-40", "num_negatives": 6, "positive_ranks": 1, "seed": 3}
    faiss_groups = list(mine(QUERIES, corpus=corpus, retriever=IndexRetriever(idx), **kw))
    exact_groups = list(mine(QUERIES, corpus=corpus, retriever=RunRetriever(_exact_run(tiny_bert, corpus, QUERIES, 40)), **kw))
    strip = [{k: v for k, v in g.items() if not k.endswith("scores")} for g in faiss_groups]
    assert strip == [{k: v for k, v in g.items() if not k.endswith("scores")} for g in exact_groups]
    for a, b in zip(faiss_groups, exact_groups, strict=True):
        assert np.allclose(a["negative_scores"], b["negative_scores"], atol=1e-5)
        assert a["positive_scores"] is not None  # dense scores positives outside the top-k exactly


def test_dense_cache_second_run_encodes_nothing(tiny_bert, mcorpus, monkeypatch, tmp_path):
    from retrctl.models import Encoder

    monkeypatch.setenv("RETRCTL_CACHE", str(tmp_path / "cache"))
    encoded = []
    real = Encoder.encode

    def spy(self, texts, kind="passage", **kw):
        if kind == "passage":
            encoded.append(len(texts))
        return real(self, texts, kind=kind, **kw)

    monkeypatch.setattr(Encoder, "encode", spy)
    corpus, path = mcorpus
    first = dense_index(str(tiny_bert), corpus, str(path), batch_size=16, device="cpu")
    assert sum(encoded) == len(corpus) == first.encoded
    encoded.clear()
    second = dense_index(str(tiny_bert), corpus, str(path), batch_size=16, device="cpu")
    assert sum(encoded) == 0 and second.encoded == 0 and len(second) == len(corpus)
    corpus = dict(corpus)
    corpus["f05"] = {"title": "", "text": "an edited document"}
    del corpus["f06"]
    third = dense_index(str(tiny_bert), corpus, str(path), batch_size=16, device="cpu")
    assert sum(encoded) == 1 and len(third) == len(corpus) and "f06" not in third.docids
    assert not list((tmp_path / "cache" / "mine").glob("*.work"))  # checkpoints are cleaned up after a save
    # a different encoder setting is a different cache entry (vectors differ)
    encoded.clear()
    dense_index(str(tiny_bert), corpus, str(path), batch_size=16, device="cpu", pooling="cls")
    assert sum(encoded) == len(corpus)


def test_dense_cache_resumes_a_killed_first_run(tiny_bert, mcorpus, monkeypatch, tmp_path):
    from retrctl.indexes.dense import DenseIndex

    monkeypatch.setenv("RETRCTL_CACHE", str(tmp_path / "cache"))
    corpus, path = mcorpus
    real_save = DenseIndex.save

    def killed(self, directory):
        raise KeyboardInterrupt

    monkeypatch.setattr(DenseIndex, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        dense_index(str(tiny_bert), corpus, str(path), device="cpu")
    monkeypatch.setattr(DenseIndex, "save", real_save)
    again = dense_index(str(tiny_bert), corpus, str(path), device="cpu")
    assert again.encoded == 0 and len(again) == len(corpus)


def test_hybrid_is_reciprocal_rank_fusion(tiny_bert):
    corpus = _corpus()
    dense = IndexRetriever(dense_index(str(tiny_bert), corpus, None, cache=False, device="cpu"))
    bm25 = _bm25(corpus)
    fused = HybridRetriever(dense, bm25).search(QUERIES, 10)
    parts = [dense.search(QUERIES, 10), bm25.search(QUERIES, 10)]
    for q in QUERIES:
        want = {}
        for p in parts:
            for r, (d, _) in enumerate(p[q["query_id"]], 1):
                want[d] = want.get(d, 0.0) + 1 / (60 + r)
        assert fused[q["query_id"]] == sorted(want.items(), key=lambda x: (-x[1], x[0]))[:10]


# ---------------------------------------------------------------- CLI


def _groups(stdout):
    return [records.normalize_group(json.loads(line)) for line in stdout.splitlines()]


def test_cli_bm25_stdout_groups_stderr_stats(runner, mcorpus, queries_file, qrels_file):
    res = runner("mine", queries_file, "--corpus", mcorpus[1], "--qrels", qrels_file, "--retriever", "bm25",
                 "--negative-range", "1-20", "--num-negatives", "3", "--margin", "0.1")
    assert res.exit_code == 0, res.stderr
    groups = _groups(res.stdout)
    assert [g["query_id"] for g in groups] == ["q1", "q2", "q3"]
    assert "scores of kept negatives: n=" in res.stderr and "skipped: positive" in res.stderr
    assert "groups have fewer than 3 negatives" in res.stderr and '"query_id"' not in res.stderr


def test_cli_dense_model_dir_twice_uses_cache(runner, tiny_bert, mcorpus, queries_file, qrels_file, monkeypatch, tmp_path):
    monkeypatch.setenv("RETRCTL_CACHE", str(tmp_path / "cache"))
    args = ("mine", queries_file, "--corpus", mcorpus[1], "--qrels", qrels_file, "--retriever", tiny_bert,
            "--negative-range", "2-20", "--device", "cpu")
    a = runner(*args)
    assert a.exit_code == 0, a.stderr
    assert f"{len(mcorpus[0])} encoded, 0 reused" in a.stderr
    b = runner(*args, "--margin", "0.01")
    assert b.exit_code == 0 and f"0 encoded, {len(mcorpus[0])} reused" in b.stderr
    assert len(_groups(b.stdout)) == 3


def test_cli_run_file_retriever_and_shards(runner, mcorpus, queries_file, qrels_file, tmp_path):
    corpus = mcorpus[0]
    ranked = _bm25(corpus).search(QUERIES, 40)
    run = tmp_path / "run.trec"
    records.write_run(records.run_rows(ranked), run)
    args = ("mine", queries_file, "--corpus", mcorpus[1], "--qrels", qrels_file, "--retriever", run,
            "--negative-range", "1-30", "--num-negatives", "4", "-q")
    one = runner(*args)
    assert one.exit_code == 0, one.stderr
    direct = list(mine(QUERIES, corpus=corpus, retriever=_bm25(corpus), qrels=QRELS, negative_range="1-30", num_negatives=4))
    assert [g["negative_document_ids"] for g in _groups(one.stdout)] == [g["negative_document_ids"] for g in direct]
    parts = [runner(*args, "--shard-id", i, "--shard-num", 2) for i in range(2)]
    assert all(p.exit_code == 0 for p in parts)
    assert sorted("".join(p.stdout for p in parts).splitlines()) == sorted(one.stdout.splitlines())


def test_cli_index_dir_and_hybrid_retrievers(runner, tiny_bert, mcorpus, queries_file, qrels_file, tmp_path):
    corpus, path = mcorpus
    bm25 = BM25Index()
    bm25.build({"docid": d, **doc} for d, doc in corpus.items())
    bm25.save(tmp_path / "bm25idx")
    args = ("mine", queries_file, "--corpus", path, "--qrels", qrels_file, "--negative-range", "1-20", "-q")
    saved = runner(*args, "--retriever", tmp_path / "bm25idx")
    fresh = runner(*args, "--retriever", "bm25")
    assert saved.exit_code == 0 and saved.stdout == fresh.stdout and saved.stdout
    hybrid = runner(*args[:-1], "--retriever", "hybrid", "--model", tiny_bert, "--device", "cpu", "--no-cache")
    assert hybrid.exit_code == 0, hybrid.stderr
    assert "reciprocal rank fusion" in hybrid.stderr
    for g in _groups(hybrid.stdout):  # RRF scores: each doc at most 2/(60+1)
        assert all(0 < s <= 2 / 61 for s in g["negative_scores"])
    res = runner(*args, "--retriever", "hybrid")
    assert res.exit_code == 2 and "--model" in res.stderr


def test_cli_qrels_naming_unknown_queries_is_a_counted_warning(runner, mcorpus, queries_file, tmp_path):
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("q1 0 d1 1\nq9 0 d2 1\nq8 0 d3 1\n")
    res = runner("mine", queries_file, "--corpus", mcorpus[1], "--qrels", qrels, "--retriever", "bm25")
    assert res.exit_code == 0, res.stderr
    assert "2 query ids in the judgments are not among the queries" in res.stderr
    assert [g["query_id"] for g in _groups(res.stdout)] == ["q1"]


def test_cli_missing_corpus_and_bad_range_exit_2(runner, queries_file):
    res = runner("mine", queries_file, "--retriever", "bm25")
    assert res.exit_code == 2 and "--corpus" in res.stderr and not res.stdout
    res = runner("mine", queries_file, "--corpus", queries_file, "--retriever", "bm25", "--negative-range", "9-3")
    assert res.exit_code == 2 and "negative range" in res.stderr


def test_cli_bad_json_exit_2_no_output_file(runner, mcorpus, tmp_path):
    bad = tmp_path / "q.jsonl"
    bad.write_text(json.dumps(QUERIES[0]) + "\n{not json\n")
    out = tmp_path / "groups.jsonl"
    res = runner("mine", bad, "--corpus", mcorpus[1], "--retriever", "bm25", "-o", out)
    assert res.exit_code == 2 and "q.jsonl:2" in res.stderr and "invalid JSON" in res.stderr
    assert not out.exists() and not list(tmp_path.glob(".groups.jsonl*"))


# ---------------------------------------------------------------- real data


@pytest.mark.real
def test_scifact_train_bm25_never_mines_a_judged_positive():
    data = shared_data("scifact")
    qrels = records.read_qrels(data / "qrels" / "train.tsv")
    wanted = sorted(qrels)[:20]
    queries = [q for q in records.read(data, "query") if q["query_id"] in set(wanted)]
    corpus = records.read_corpus(data)
    st = {}
    groups = list(mine(queries, corpus=corpus, retriever=_bm25(corpus), qrels={q: qrels[q] for q in wanted},
                       negative_range="10-50", positive_ranks=0, stats=st))
    assert len(groups) == 20
    for g in groups:
        assert not set(g["negative_document_ids"]) & set(qrels[g["query_id"]])
        assert len(g["negative_document_ids"]) == 7
    assert st["short_groups"] == 0


def test_qrels_matching_no_query_raise_after_the_last_query_unless_allow_empty():
    """Judgments for other queries are an error, not an empty groups file and exit 0."""
    corpus = {f"x{i}": {"title": "", "text": f"doc {i}"} for i in range(5)}
    run = RunRetriever({"q": [(f"x{i}", 5.0 - i) for i in range(5)]})
    queries = [{"query_id": "q", "query_text": "x"}]
    with pytest.raises(records.RecordError) as e:
        list(mine(queries, corpus=corpus, retriever=run, qrels={"other": {"x1": 1}}, qrels_path="judged.tsv"))
    assert str(e.value) == ("judged.tsv: none of its 1 query ids is among the 1 queries (e.g. 'other'): wrong judgments "
                            "for these queries? (--allow-empty writes the groups anyway)")
    assert list(mine(queries, corpus=corpus, retriever=run, qrels={"other": {"x1": 1}}, allow_empty=True)) == []
    # one matching query is enough: the others are the counted warning, not an error
    groups = list(mine(queries, corpus=corpus, retriever=run, qrels={"other": {"x1": 1}, "q": {"x0": 1}}, negative_range="2-5"))
    assert [g["query_id"] for g in groups] == ["q"]
