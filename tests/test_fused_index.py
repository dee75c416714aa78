"""A fused index (`index --fuse`): indexes of one corpus searched as one, their lists fused.

Its search equals `fuse` of the members' own runs at the recorded weights (also with --remove-query, and with a
fused index among the members); it shares the members' files and encodes nothing; bad input exits 2 with one line
and writes nothing; it is not updated in place.
"""

import json

import numpy as np
import pytest
from test_hybrid_index import CORPUS, MORE_QUERIES, _tree, near, one_error_line, succeeding, trec, write_jsonl

from retrctl.indexes import FusedIndex, open_index


@pytest.fixture
def members(runner, tiny_bert, tmp_path):
    """Three indexes of one corpus: the tiny model's dense vectors, BM25, and BM25 at Lucene's classic k1, b."""
    run = succeeding(runner)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", CORPUS)
    run("index", corpus, "--model", tiny_bert, "-o", tmp_path / "dense")
    run("index", corpus, "--method", "bm25", "-o", tmp_path / "bm25")
    run("index", corpus, "--method", "bm25", "--k1", "1.2", "--b", "0.75", "-o", tmp_path / "classic")
    return corpus, [tmp_path / n for n in ("dense", "bm25", "classic")]


@pytest.mark.parametrize("remove_query", [False, True])
def test_fused_search_equals_fuse_of_the_members_runs(runner, members, tmp_path, remove_query):
    run = succeeding(runner)
    corpus, idxs = members
    if remove_query:  # ArguAna's convention: each query is a doc, dropped from each list before fusion
        queries = write_jsonl(tmp_path / "q.jsonl", [{"query_id": d["docid"], "query_text": d["text"]} for d in CORPUS[:6]])
    else:
        queries = write_jsonl(tmp_path / "q.jsonl", MORE_QUERIES)
    flag = ("--remove-query",) if remove_query else ()
    r = run("index", "--fuse", *idxs, "--weights", "0.5,0.3,0.2", "-o", tmp_path / "fused")
    assert "encod" not in r.stderr.lower()
    fused = open_index(tmp_path / "fused")
    assert isinstance(fused, FusedIndex) and fused.version.manifest["search_defaults"] == {"weights": [0.5, 0.3, 0.2]}
    for i, idx in enumerate(idxs):  # each member is the index's current version, its files hard-linked
        assert _tree(fused.version.path / "members" / str(i)) == _tree(open_index(idx).version.path)
    for i, idx in enumerate(idxs):
        run("search", idx, queries, "--hits", 100, *flag, "-o", tmp_path / f"m{i}.trec")
    run("fuse", *(tmp_path / f"m{i}.trec" for i in range(3)), "--weights", "0.5,0.3,0.2", "--hits", 10,
        "-o", tmp_path / "expected.trec")
    run("search", tmp_path / "fused", queries, "--hits", 10, *flag, "-o", tmp_path / "got.trec")
    got = trec(tmp_path / "got.trec")
    near(got, trec(tmp_path / "expected.trec"))
    if remove_query:
        assert all(q not in [d for d, _ in hits] for q, hits in got.items())
    # a search's own flags win over the recorded defaults
    run("search", tmp_path / "fused", queries, "--hits", 10, *flag, "--weights", "1,0,0", "-o", tmp_path / "w.trec")
    dense_only = trec(tmp_path / "w.trec")
    run("search", idxs[0], queries, "--hits", 10, *flag, "-o", tmp_path / "d.trec")
    assert {q: [d for d, _ in h] for q, h in dense_only.items()} == {q: [d for d, _ in h] for q, h in trec(tmp_path / "d.trec").items()}


def test_a_fused_index_may_be_a_member_and_weights_come_from_a_sweep(runner, members, tmp_path):
    run = succeeding(runner)
    _, (dense, bm25, classic) = members
    queries = write_jsonl(tmp_path / "q.jsonl", MORE_QUERIES)
    run("index", "--fuse", bm25, classic, "--weights", "0.5,0.5", "-o", tmp_path / "lexical")
    sweep = write_jsonl(tmp_path / "sweep.jsonl", [{"weights": [w, round(1 - w, 10)], "nDCG@10": v,
                                                    "settings": {"fusion": "linear", "norm": "minmax", "depth": None}}
                                                   for w, v in ((0.2, 0.4), (0.7, 0.6))])
    run("index", "--fuse", dense, tmp_path / "lexical", "--weights-from", sweep, "-o", tmp_path / "nested")
    assert open_index(tmp_path / "nested").search_defaults["weights"] == [0.7, pytest.approx(0.3)]
    for name, idx in (("dense", dense), ("lexical", tmp_path / "lexical")):
        run("search", idx, queries, "--hits", 100, "-o", tmp_path / f"{name}.trec")
    run("fuse", tmp_path / "dense.trec", tmp_path / "lexical.trec", "--weights", "0.7,0.3", "--hits", 10,
        "-o", tmp_path / "expected.trec")
    run("search", tmp_path / "nested", queries, "--hits", 10, "-o", tmp_path / "got.trec")
    near(trec(tmp_path / "got.trec"), trec(tmp_path / "expected.trec"))


def test_fuse_and_copy_from_load_no_encoder(runner, members, tiny_bert, monkeypatch, tmp_path):
    """`index --fuse` and `--copy-from` publish stored files with search defaults: no member's model is loaded
    (the weights are still checked against the heads), and what they publish searches as the indexes given."""
    from retrctl.models import runtime

    run = succeeding(runner)
    corpus, (dense, bm25, _) = members
    run("index", corpus, "--model", tiny_bert, "--heads", "dense,bm25", "-o", tmp_path / "hybrid")
    queries = write_jsonl(tmp_path / "q.jsonl", MORE_QUERIES)
    with monkeypatch.context() as m:
        m.setattr(runtime, "load_encoder", lambda *a, **kw: pytest.fail("an encoder was loaded"))
        run("index", "--fuse", dense, bm25, "--weights", "0.7,0.3", "-o", tmp_path / "fused")
        run("index", "--copy-from", tmp_path / "hybrid", "--weights", "0.7,0.3", "-o", tmp_path / "copy")
        bad = runner("index", "--copy-from", tmp_path / "hybrid", "--weights", "0.5,0.2,0.3", "-o", tmp_path / "bad")
        assert bad.exit_code == 2 and "give one weight per head indexed" in bad.stderr, bad.stderr
    run("search", tmp_path / "fused", queries, "--hits", 10, "-o", tmp_path / "fused.trec")
    run("search", dense, queries, "--hits", 100, "-o", tmp_path / "dense.trec")
    run("search", bm25, queries, "--hits", 100, "-o", tmp_path / "bm25.trec")
    run("fuse", tmp_path / "dense.trec", tmp_path / "bm25.trec", "--weights", "0.7,0.3", "--hits", 10,
        "-o", tmp_path / "expected.trec")
    near(trec(tmp_path / "fused.trec"), trec(tmp_path / "expected.trec"))
    run("search", tmp_path / "copy", queries, "--hits", 10, "-o", tmp_path / "copy.trec")
    run("search", tmp_path / "hybrid", queries, "--weights", "0.7,0.3", "--hits", 10, "-o", tmp_path / "flags.trec")
    assert (tmp_path / "copy.trec").read_text() == (tmp_path / "flags.trec").read_text()


def test_a_member_or_head_weighted_0_is_not_searched(runner, members, tiny_bert, monkeypatch, tmp_path):
    """At (1, 0) the fused index and the two-headed index rank as the dense list alone, without searching BM25."""
    from retrctl.indexes import bm25 as bm25_index
    from retrctl.indexes.heads import bm25 as bm25_head

    run = succeeding(runner)
    corpus, (dense, bm25, _) = members
    run("index", corpus, "--model", tiny_bert, "--heads", "dense,bm25", "-o", tmp_path / "hybrid")
    run("index", "--fuse", dense, bm25, "--weights", "1,0", "-o", tmp_path / "fused")
    queries = write_jsonl(tmp_path / "q.jsonl", MORE_QUERIES)
    run("search", dense, queries, "--hits", 3, "-o", tmp_path / "dense.trec")
    monkeypatch.setattr(bm25_index.BM25Index, "search", lambda *a, **kw: pytest.fail("BM25 was searched"))
    monkeypatch.setattr(bm25_head.BM25Head, "run", lambda *a, **kw: pytest.fail("the BM25 head was searched"))
    ranked = {q: [d for d, _ in hits] for q, hits in trec(tmp_path / "dense.trec").items()}
    run("search", tmp_path / "fused", queries, "--hits", 3, "-o", tmp_path / "fused.trec")
    run("search", tmp_path / "hybrid", queries, "--weights", "1,0", "--hits", 3, "-o", tmp_path / "heads.trec")
    for name in ("fused", "heads"):
        assert {q: [d for d, _ in hits] for q, hits in trec(tmp_path / f"{name}.trec").items()} == ranked, name


@pytest.mark.parametrize("args, words", [
    (("{dense}",), "--fuse needs two or more index directories"),
    (("{dense}", "{bm25}", "--weights", "0.5,0.2,0.3"), "one weight per member index"),
    (("{dense}", "{bm25}", "--model", "x"), "--model cannot apply"),
    (("{dense}", "{other}"), "fuse indexes of one corpus"),
    (("{dense}", "{tmp}/nowhere"), "not an index directory"),
    (("{dense}", "{bm25}", "--merge"), "--merge cannot apply"),
])
def test_fuse_bad_input_exits_2_and_writes_nothing(runner, members, tiny_bert, tmp_path, args, words):
    corpus, (dense, bm25, _) = members
    other = write_jsonl(tmp_path / "other.jsonl", CORPUS[:-1])
    assert runner("index", other, "--method", "bm25", "-o", tmp_path / "other").exit_code == 0
    out = tmp_path / "out"
    r = runner("index", "--fuse", *(str(a).format(dense=dense, bm25=bm25, other=tmp_path / "other", tmp=tmp_path)
                                   for a in args), "-o", out)
    assert r.exit_code == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len([line for line in r.stderr.splitlines() if words in line]) == 1
    assert not out.exists()


def test_a_search_flag_a_fused_index_does_not_take_names_the_way_out(runner, members, queries_file, tmp_path):
    _, (dense, bm25, _) = members
    assert runner("index", "--fuse", dense, bm25, "-o", tmp_path / "fused").exit_code == 0
    r = runner("search", tmp_path / "fused", queries_file, "--heads", "dense")
    assert r.exit_code == 2 and "a fused index searches each member with the settings recorded" in one_error_line(r.stderr)


def test_a_fused_index_is_not_updated_in_place(runner, members, tmp_path):
    corpus, (dense, bm25, _) = members
    assert runner("index", "--fuse", dense, bm25, "-o", tmp_path / "fused").exit_code == 0
    before = json.loads((tmp_path / "fused" / "index.json").read_text())
    r = runner("index", corpus, "-o", tmp_path / "fused")
    assert r.exit_code == 2 and "update each member" in one_error_line(r.stderr), r.stderr
    assert json.loads((tmp_path / "fused" / "index.json").read_text()) == before
    # fusing again publishes the next version (the members' current ones)
    assert runner("index", "--fuse", dense, bm25, "--weights", "0.6,0.4", "-o", tmp_path / "fused").exit_code == 0
    again = open_index(tmp_path / "fused")
    assert again.version.name == "000002" and np.allclose(again.weights, [0.6, 0.4])
