"""Records round-trip: every reader reads back what the writers write, in every container; arbitrary bytes make a
reader raise RecordError or nothing; a failed write leaves no temp file; the Parquet writer never changes a value."""

from __future__ import annotations

import gzip
import os

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retrctl import records
from retrctl.records import RecordError

# ---------------------------------------------------------------- property tests for every reader

ids = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12).filter(
    lambda s: not any(c.isspace() for c in s))
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
CONTAINERS = ["x.jsonl", "x.jsonl.gz", "x.jsonl.zst", "x.parquet"]
PROPS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _unique(rows, key):
    seen = {}
    for r in rows:
        seen.setdefault(r[key], r)
    return list(seen.values())


@PROPS
@given(rows=st.lists(st.fixed_dictionaries({"docid": ids, "title": texts, "text": texts}), min_size=1, max_size=6),
       container=st.sampled_from(CONTAINERS))
def test_docs_round_trip(tmp_path_factory, rows, container):
    rows = _unique(rows, "docid")
    path = tmp_path_factory.mktemp("p") / container
    records.write(rows, path)
    assert list(records.read(path, "doc")) == rows


@PROPS
@given(rows=st.lists(st.fixed_dictionaries({"query_id": ids, "query_text": texts}), min_size=1, max_size=6),
       container=st.sampled_from(CONTAINERS))
def test_queries_round_trip(tmp_path_factory, rows, container):
    rows = _unique(rows, "query_id")
    path = tmp_path_factory.mktemp("p") / container
    records.write(rows, path)
    assert list(records.read(path, "query")) == rows


@PROPS
@given(rows=st.lists(st.fixed_dictionaries({"query_id": ids, "query_text": texts, "positive_document_ids": st.lists(ids, min_size=1, max_size=3),
                                            "negative_document_ids": st.lists(ids, min_size=1, max_size=3)}), min_size=1, max_size=5),
       container=st.sampled_from(CONTAINERS))
def test_groups_round_trip(tmp_path_factory, rows, container):
    path = tmp_path_factory.mktemp("p") / container
    records.write(rows, path)
    assert list(records.read(path, "group")) == rows


finite = st.floats(allow_nan=False, allow_infinity=False, width=32, min_value=-1e6, max_value=1e6)


@PROPS
@given(run=st.dictionaries(ids, st.dictionaries(ids, finite, min_size=1, max_size=4), min_size=1, max_size=4),
       name=st.sampled_from(["run.trec", "run.jsonl", "run.jsonl.gz", "run.jsonl.zst", "run.parquet"]))
def test_runs_round_trip(tmp_path_factory, run, name):
    path = tmp_path_factory.mktemp("p") / name
    ranked = {q: records.trec_order(d) for q, d in run.items()}
    records.write_run(records.run_rows(ranked), path)
    back = records.read_run(path)
    if name.endswith(".trec"):  # TREC keeps 6 decimals, so scores that round alike become ties (doc id descending)
        ranked = {q: records.trec_order({d: float(f"{s:.6f}") for d, s in r}) for q, r in ranked.items()}
    assert back == ranked


@PROPS
@given(qrels=st.dictionaries(ids, st.dictionaries(ids, st.integers(-1, 3), min_size=1, max_size=4), min_size=1, max_size=4),
       layout=st.sampled_from(["trec", "tsv", "jsonl", "jsonl.gz", "parquet"]))
def test_qrels_round_trip(tmp_path_factory, qrels, layout):
    folder = tmp_path_factory.mktemp("p")
    rows = [(q, d, r) for q, docs in qrels.items() for d, r in docs.items()]
    if layout == "trec":
        path = folder / "qrels.trec"
        path.write_text("".join(f"{q} 0 {d} {r}\n" for q, d, r in rows))
    elif layout == "tsv":
        path = folder / "qrels.tsv"
        path.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{r}\n" for q, d, r in rows))
    else:
        path = folder / f"qrels.{layout}"
        records.write([{"query_id": q, "doc_id": d, "relevance": r} for q, d, r in rows], path)
    assert records.read_qrels(path) == qrels


READERS = {
    "doc": lambda p: list(records.read(p, "doc")),
    "query": lambda p: list(records.read(p, "query")),
    "group": lambda p: list(records.read(p, "group")),
    "run": records.read_run,
    "qrels": records.read_qrels,
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.one_of(st.binary(max_size=300),
                      st.lists(st.sampled_from([b"{", b"}", b'"docid"', b'"a b"', b":", b",", b"\n", b"\t", b" ", b"\xff",
                                                b"1", b"null", b"[", b"]", b'"text"', b'"q"', b"0", b"Q0"]), max_size=40).map(b"".join)),
       name=st.sampled_from(["x.jsonl", "x.jsonl.gz", "x.jsonl.zst", "x.parquet", "x.trec", "x.tsv"]),
       kind=st.sampled_from(sorted(READERS)),
       wrap=st.booleans())
def test_arbitrary_bytes_never_crash_a_reader(tmp_path_factory, blob, name, kind, wrap):
    """Any file content: the reader returns records or raises RecordError, nothing else (no zlib.error, no
    UnicodeDecodeError, no pyarrow error, no IndexError)."""
    if wrap and name.endswith(".gz"):
        blob = gzip.compress(blob, mtime=0)[: max(1, len(blob))]
    elif wrap and name.endswith(".zst"):
        blob = zstandard.ZstdCompressor().compress(blob)[:-1]
    path = tmp_path_factory.mktemp("p") / name
    path.write_bytes(blob)
    try:
        READERS[kind](path)
    except RecordError as e:
        assert str(e).startswith(str(path))


def test_no_temp_files_after_failed_writes_in_any_container(tmp_path):
    def rows():
        yield {"docid": "d1", "text": "x"}
        raise RecordError("in.jsonl", 2, None, "bad")

    for name in CONTAINERS:
        with pytest.raises(RecordError):
            records.write(rows(), tmp_path / name)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- the Parquet writer never changes a value

values = st.one_of(st.none(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False, allow_infinity=False),
                   st.text(max_size=5), st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), max_size=3))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.dictionaries(st.sampled_from(["a", "b", "c"]), values, max_size=3), min_size=1, max_size=12),
       batch_size=st.integers(1, 5))
def test_parquet_writer_keeps_every_key_and_value_or_refuses(tmp_path_factory, rows, batch_size):
    """pyarrow's from_pylist kept only the first record's keys and cut 1.5 to 1 in an int column; a later batch
    with another type failed with a bare ArrowInvalid (exit 1) after all the work."""
    folder = tmp_path_factory.mktemp("pq")
    path = folder / "out.parquet"
    try:
        records.write(rows, path, batch_size=batch_size)
    except RecordError as e:
        assert str(e).startswith(f"{path}: record") and "write JSONL instead" in str(e)
        assert os.listdir(folder) == []
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    back = [obj for _, obj in records.read_parquet(path)]
    assert back == [{k: r.get(k) for k in keys} for r in rows]  # 1 == 1.0: an int column widened to float is equal
    assert os.listdir(folder) == ["out.parquet"]


def test_parquet_writer_widens_across_batches(tmp_path):
    path = tmp_path / "g.parquet"
    rows = [{"q": "a", "positive_scores": None}, {"q": "b", "positive_scores": [0.5], "extra": 1}, {"q": "c", "extra": 2.5}]
    assert records.write(rows, path, batch_size=1) == 3
    assert [o for _, o in records.read_parquet(path)] == [
        {"q": "a", "positive_scores": None, "extra": None}, {"q": "b", "positive_scores": [0.5], "extra": 1.0},
        {"q": "c", "positive_scores": None, "extra": 2.5}]
    with pytest.raises(RecordError, match=r"g.parquet: record 2 cannot be written as Parquet"):
        records.write([{"q": "a"}, {"q": 5}], path, batch_size=1)
    assert [o["q"] for _, o in records.read_parquet(path)] == ["a", "b", "c"]  # the previous file is kept
    assert sorted(os.listdir(tmp_path)) == ["g.parquet"]
