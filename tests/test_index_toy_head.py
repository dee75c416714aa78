"""A new index head is one module (tests/toy_head.py) plus one registry line: through the real CLI a dense index holds
it beside the model's vectors, with its own `index` flag, is updated in place with changed, added and removed docs,
merged from shards, and searched by that head alone or fused with the dense head, with no stage and no line of
indexes/dense.py naming it."""


import numpy as np
import pytest
from conftest import DOCS, QUERIES
from toy_backend import expected
from toy_head import FILE, OverlapHead
from trainkit import write_jsonl

from retrctl import fusion
from retrctl.indexes import HEADS, open_index, store


@pytest.fixture
def overlap(monkeypatch):
    monkeypatch.setitem(HEADS, OverlapHead.name, OverlapHead)  # the one registry line


def run_file(path) -> dict[str, list[tuple[str, float]]]:
    out: dict[str, list[tuple[str, float]]] = {}
    for line in path.read_text().splitlines():
        qid, _, docid, _, score, _ = line.split()
        out.setdefault(qid, []).append((docid, float(score)))
    return out


def searched(runner, idx, queries_file, out, *heads):
    r = runner("search", idx, queries_file, "--hits", 100, *(("--heads", ",".join(heads)) if heads else ()), "-o", out)
    assert r.exit_code == 0, r.stderr
    return run_file(out)


def near(a, b):
    assert a.keys() == b.keys()
    for q in a:
        assert [d for d, _ in a[q]] == [d for d, _ in b[q]], q
        assert np.allclose([s for _, s in a[q]], [s for _, s in b[q]], atol=1e-5), q


def test_its_flag_and_name_exist_only_while_it_is_registered(overlap, runner):
    assert "--overlap-min-len" in runner("index", "--help").stdout


def test_unregistered_it_is_refused(runner, tiny_bert, corpus_file, tmp_path):
    assert "--overlap-min-len" not in runner("index", "--help").stdout
    r = runner("index", corpus_file, "--model", tiny_bert, "--heads", "dense,overlap", "-o", tmp_path / "idx")
    assert r.exit_code == 2 and "choose from dense, sparse, colbert, bm25" in r.stderr, r.stderr


def test_an_index_holding_a_head_no_longer_registered_is_refused_naming_the_field(runner, tiny_bert, corpus_file,
                                                                                    queries_file, tmp_path, monkeypatch):
    idx = tmp_path / "idx"
    with monkeypatch.context() as m:
        m.setitem(HEADS, OverlapHead.name, OverlapHead)
        assert runner("index", corpus_file, "--model", tiny_bert, "--heads", "dense,overlap", "-o", idx).exit_code == 0
    r = runner("search", idx, queries_file, "-o", tmp_path / "run.trec")
    assert r.exit_code == 2 and "index.json: field 'settings.heads': overlap: not a head" in r.stderr, r.stderr
    assert not (tmp_path / "run.trec").exists()


def test_built_updated_merged_and_searched_through_the_cli(overlap, runner, tiny_bert, corpus_file, queries_file,
                                                           tmp_path):
    idx = tmp_path / "idx"
    built = runner("index", corpus_file, "--model", tiny_bert, "--heads", "dense,overlap", "--overlap-min-len", 5,
                   "-o", idx)
    assert built.exit_code == 0 and "6 added" in built.stderr, built.stderr
    manifest = open_index(idx).version.manifest
    assert manifest["settings"]["heads"] == ["dense", "overlap"] and manifest["settings"]["overlap"] == {"min_len": 5}
    assert manifest["overlap"]["files"] == {"words": FILE} and (idx / "versions" / "000001" / FILE).exists()

    alone = searched(runner, idx, queries_file, tmp_path / "o.trec", "overlap")
    assert {q: dict(hits) for q, hits in alone.items()} == expected(DOCS, QUERIES, 5)
    dense = searched(runner, idx, queries_file, tmp_path / "d.trec", "dense")
    both = searched(runner, idx, queries_file, tmp_path / "b.trec")  # default: every head held, fused
    near(both, fusion.fuse([dense, alone], hits=100))

    # an update in place: the heads come from the manifest; d4 is gone, d6 changed, d7 is new
    docs = [d for d in DOCS if d["docid"] != "d4"]
    docs = [{**d, "text": "Coffee and purring cats, no beans."} if d["docid"] == "d6" else d for d in docs]
    docs.append({"docid": "d7", "title": "Memory", "text": "A programming language with memory safety."})
    changed = write_jsonl(tmp_path / "c2.jsonl", docs)
    updated = runner("index", changed, "--overlap-min-len", 5, "-o", idx)
    assert updated.exit_code == 0, updated.stderr
    assert "1 added, 1 updated, 4 unchanged, 1 removed" in updated.stderr and store.resolve(idx).name == "000002"
    alone = searched(runner, idx, queries_file, tmp_path / "o2.trec", "overlap")
    assert {q: dict(hits) for q, hits in alone.items()} == expected(docs, QUERIES, 5)

    # shards merged equal the whole: the head's lists exactly, the fused ones to float tolerance
    for s in (0, 1):
        r = runner("index", changed, "--model", tiny_bert, "--heads", "dense,overlap", "--overlap-min-len", 5,
                   "--shard-id", s, "--shard-num", 2, "-o", tmp_path / f"s{s}")
        assert r.exit_code == 0, r.stderr
    merged = runner("index", "--merge", tmp_path / "s0", tmp_path / "s1", "-o", tmp_path / "merged")
    assert merged.exit_code == 0, merged.stderr
    assert open_index(tmp_path / "merged").version.manifest["settings"]["heads"] == ["dense", "overlap"]
    assert searched(runner, tmp_path / "merged", queries_file, tmp_path / "m.trec", "overlap") == alone
    near(searched(runner, tmp_path / "merged", queries_file, tmp_path / "mb.trec"),
         searched(runner, idx, queries_file, tmp_path / "b2.trec"))

    # another value of its flag is another index: rebuilt, with the change named
    other = runner("index", changed, "--overlap-min-len", 3, "-o", idx)
    assert other.exit_code == 0 and "overlap: {'min_len': 5} -> {'min_len': 3}" in other.stderr, other.stderr
    alone = searched(runner, idx, queries_file, tmp_path / "o3.trec", "overlap")
    assert {q: dict(hits) for q, hits in alone.items()} == expected(docs, QUERIES, 3)
