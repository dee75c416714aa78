"""`retrctl search`: runs from dense and BM25 indexes, formats, --remove-query, --with-text, bad input."""

import json

import numpy as np
import pytest
from conftest import DOCS, QUERIES, shared_data

from retrctl import records
from retrctl.indexes import BM25Index, DenseIndex
from retrctl.models import Encoder
from stages.index import index
from stages.search import search


@pytest.fixture
def bm25_dir(tmp_path):
    index(DOCS, tmp_path / "bm", method="bm25")
    return tmp_path / "bm"


@pytest.fixture
def dense_dir(tiny_bert, tmp_path):
    index(DOCS, tmp_path / "dn", model=str(tiny_bert), encoder_settings={"query_prompt": "zzz qq "})
    return tmp_path / "dn"


def trec_rows(text):
    rows = [line.split() for line in text.splitlines()]
    assert rows and all(len(r) == 6 and r[1] == "Q0" for r in rows), text[:300]
    return rows


# ---------------------------------------------------------------- Python API


def test_search_function_ranks_and_removes_the_query_itself():
    idx = BM25Index()
    idx.build([*DOCS, {"docid": "q1", "title": "", "text": "which animals purr"}])
    rows = list(search(QUERIES, idx, hits=2))
    assert [r["doc_id"] for r in rows if r["query_id"] == "q1"] == ["q1", "d1"]
    rows = list(search(QUERIES, idx, hits=2, remove_query=True))
    q1 = [r for r in rows if r["query_id"] == "q1"]
    assert [r["doc_id"] for r in q1] == ["d1"]  # only d1 matches a term besides the query itself
    assert [r["rank"] for r in rows if r["query_id"] == "q2"] == [1, 2]


def test_search_function_carries_text_when_asked():
    idx = BM25Index()
    idx.build(DOCS)
    texts = {d["docid"]: d for d in DOCS}
    rows = list(search(QUERIES[:1], idx, hits=1, texts=lambda ids: {i: texts[i] for i in ids}))
    assert rows[0]["text"] == texts[rows[0]["doc_id"]]["text"] and rows[0]["query_text"] == QUERIES[0]["query_text"]


# ---------------------------------------------------------------- CLI


def test_cli_bm25_trec_on_stdout_logs_on_stderr(runner, bm25_dir, queries_file):
    r = runner("search", bm25_dir, queries_file, "--hits", 2)
    assert r.exit_code == 0, r.stderr
    rows = trec_rows(r.stdout)
    assert [x[2] for x in rows if x[0] == "q3"][0] == "d6"
    assert all(x[5].startswith("bm25s-lucene") for x in rows)
    assert "retrctl.search:" in r.stderr and "retrctl.search" not in r.stdout
    assert "wrote" in r.stderr and "wrote" not in r.stdout
    assert "k1=0.9, b=0.4" in r.stderr  # the BM25 variant is logged with the run


def test_cli_dense_uses_the_manifest_query_prompt(runner, dense_dir, queries_file, tiny_bert):
    r = runner("search", dense_dir, queries_file, "--hits", 3, "--run-tag", "mine")
    assert r.exit_code == 0, r.stderr
    rows = trec_rows(r.stdout)
    assert {x[5] for x in rows} == {"mine"}
    got = [float(x[4]) for x in rows if x[0] == "q1"]
    idx = DenseIndex.load(dense_dir)
    with_prompt = Encoder.load(tiny_bert, device="cpu", query_prompt="zzz qq ").encode([QUERIES[0]["query_text"]], kind="query")
    without = Encoder.load(tiny_bert, device="cpu").encode([QUERIES[0]["query_text"]], kind="query")
    assert np.allclose(got, idx.search_vectors(with_prompt, 3)[0][0], atol=1e-5)
    assert not np.allclose(got, idx.search_vectors(without, 3)[0][0], atol=1e-5)
    # a flag overrides the manifest
    r2 = runner("search", dense_dir, queries_file, "--hits", 3, "--query-prompt", "")
    assert np.allclose([float(x[4]) for x in trec_rows(r2.stdout) if x[0] == "q1"], idx.search_vectors(without, 3)[0][0], atol=1e-5)


@pytest.mark.parametrize("name, fmt", [("run.jsonl", None), ("run.parquet", None), ("run.trec", None), ("run.out", "jsonl")])
def test_cli_output_formats(runner, bm25_dir, queries_file, tmp_path, name, fmt):
    out = tmp_path / name
    args = ["--output-format", fmt] if fmt else []
    r = runner("search", bm25_dir, queries_file, "--hits", 2, "-o", out, *args)
    assert r.exit_code == 0, r.stderr
    run = records.read_run(out, fmt)
    assert run["q3"][0][0] == "d6" and all(len(v) <= 2 for v in run.values())
    if name.endswith(".trec"):
        trec_rows(out.read_text())


def test_cli_run_file_gets_a_provenance_manifest(runner, bm25_dir, dense_dir, queries_file, tmp_path, monkeypatch):
    """TREC runs have no header: the BM25 variant or encoder recipe, settings and versions go beside the run."""
    out = tmp_path / "bm25.trec"
    assert runner("search", bm25_dir, queries_file, "--hits", 2, "--remove-query", "-o", out).exit_code == 0
    m = json.loads((tmp_path / "bm25.trec.manifest.json").read_text())
    assert m["index_manifest"]["backend"] == "bm25" and m["index_manifest"]["settings"]["k1"] == 0.9
    assert m["settings"]["hits"] == 2 and m["settings"]["remove_query"] is True
    assert m["run_tag"] == trec_rows(out.read_text())[0][5] and m["rows"] == len(out.read_text().splitlines())
    assert m["versions"]["bm25s"] and m["versions"]["retrctl"]
    out = tmp_path / "dense.jsonl"
    assert runner("search", dense_dir, queries_file, "--hits", 2, "--query-max-len", 16, "-o", out).exit_code == 0
    m = json.loads((tmp_path / "dense.jsonl.manifest.json").read_text())
    assert m["index_manifest"]["encoder"]["query_prompt"] == "zzz qq " and m["encoder_overrides"] == {"query_max_len": 16}
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert runner("search", bm25_dir, queries_file, "--hits", 2).exit_code == 0  # stdout: no file beside anything
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_cli_queries_from_stdin_and_beir_folder(runner, bm25_dir, tmp_path):
    lines = "".join(json.dumps({"_id": q["query_id"], "text": q["query_text"]}) + "\n" for q in QUERIES)
    r = runner("search", bm25_dir, "-", "--hits", 1, input=lines)
    assert r.exit_code == 0 and len(trec_rows(r.stdout)) == 3
    beir = tmp_path / "beir"
    beir.mkdir()
    (beir / "queries.jsonl").write_text(lines)
    r = runner("search", bm25_dir, beir, "--hits", 1)
    assert r.exit_code == 0 and r.stdout == runner("search", bm25_dir, "-", "--hits", 1, input=lines).stdout


def test_cli_remove_query(runner, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    docs = [*DOCS, {"docid": "q2", "title": "", "text": "memory safe programming language"}]
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    assert runner("index", corpus, "--method", "bm25", "-o", tmp_path / "bm").exit_code == 0
    q = json.dumps({"query_id": "q2", "query_text": "memory safe programming language"}) + "\n"
    kept = trec_rows(runner("search", tmp_path / "bm", "-", "--hits", 2, input=q).stdout)
    assert kept[0][2] == "q2"
    dropped = trec_rows(runner("search", tmp_path / "bm", "-", "--hits", 2, "--remove-query", input=q).stdout)
    assert [x[2] for x in dropped] == ["d4", "d3"] and [x[3] for x in dropped] == ["1", "2"]


def test_cli_with_text_reads_the_recorded_corpus(runner, tiny_bert, corpus_file, queries_file, tmp_path):
    assert runner("index", corpus_file, "--model", tiny_bert, "-o", tmp_path / "dn").exit_code == 0
    r = runner("search", tmp_path / "dn", queries_file, "--hits", 2, "--with-text")
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    by_id = {d["docid"]: d for d in DOCS}
    assert len(rows) == 6 and all(row["text"] == by_id[row["doc_id"]]["text"] for row in rows)
    assert all(row["title"] == by_id[row["doc_id"]]["title"] for row in rows)
    r = runner("search", tmp_path / "dn", queries_file, "--with-text", "--output-format", "trec")
    assert r.exit_code == 2 and "--with-text" in r.stderr


def test_cli_bad_queries_exit_2_and_leave_no_file(runner, bm25_dir, tmp_path):
    bad = tmp_path / "queries.jsonl"
    bad.write_text('{"query_id": "a", "query_text": "cats"}\n{"query_id": "b"}\n')
    out = tmp_path / "run.trec"
    r = runner("search", bm25_dir, bad, "-o", out)
    assert r.exit_code == 2
    assert "queries.jsonl:2: missing field \"query_text\"" in r.stderr
    assert not out.exists() and list(tmp_path.glob(".run.trec*")) == []


def test_cli_not_an_index_exits_2(runner, queries_file, tmp_path):
    r = runner("search", tmp_path, queries_file)
    assert r.exit_code == 2 and "not an index directory" in r.stderr


# ---------------------------------------------------------------- real model, real data


@pytest.mark.real
def test_scifact_slice_minilm_and_bm25(runner, tmp_path):
    """200 judged SciFact docs: both retrievers find the cited abstract for most claims."""
    import ir_measures

    data = shared_data("scifact")
    qrels = records.read_qrels(data, "test")
    judged = {d for docs in qrels.values() for d in docs}
    docs = [d for d in records.read(data, "doc") if d["docid"] in judged][:200]
    keep = {d["docid"] for d in docs}
    queries = [q for q in records.read(data, "query") if q["query_id"] in qrels and set(qrels[q["query_id"]]) <= keep]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    sub = {q["query_id"]: qrels[q["query_id"]] for q in queries}
    scores = {}
    for name, args in (("bm25", ["--method", "bm25"]), ("minilm", ["--model", "minilm", "--passage-max-len", "128"])):
        assert runner("index", tmp_path / "c.jsonl", *args, "-o", tmp_path / name).exit_code == 0
        r = runner("search", tmp_path / name, tmp_path / "q.jsonl", "--hits", 10, "-o", tmp_path / f"{name}.trec")
        assert r.exit_code == 0, r.stderr
        run = records.read_run(tmp_path / f"{name}.trec")
        scores[name] = ir_measures.calc_aggregate([ir_measures.nDCG @ 10], sub, {q: dict(v) for q, v in run.items()})[ir_measures.nDCG @ 10]
    assert len(queries) > 100
    assert scores["bm25"] > 0.7 and scores["minilm"] > 0.7, scores
