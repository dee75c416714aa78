"""records: every bad-input case names file, line and field; aliases; containers round-trip; BEIR folders;
qrels, runs and group formats; atomic writes leave nothing behind on failure."""

import gzip
import io
import json
import sys

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from retrctl import records
from retrctl.records import RecordError


def jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def docs(n):
    return [{"docid": f"d{i}", "title": f"t{i}", "text": f"text number {i}"} for i in range(n)]


def error(path, kind="doc", **kw) -> str:
    with pytest.raises(RecordError) as e:
        list(records.read(path, kind, **kw))
    return str(e.value)


# ---------------------------------------------------------------- bad input: file:line: field: message


def test_invalid_json_names_the_line(tmp_path):
    rows = [json.dumps(d) for d in docs(16)] + ['{"docid": "d16", "text": "oops"']
    path = jsonl(tmp_path / "corpus.jsonl", rows)
    assert error(path).startswith(f"{path}:17: invalid JSON")


def test_missing_text_field(tmp_path):
    path = jsonl(tmp_path / "corpus.jsonl", [*docs(2), {"docid": "d9", "title": "no text"}])
    assert error(path) == f"{path}:3: missing field \"text\" (or 'contents', 'body')"


def test_missing_id_field(tmp_path):
    path = jsonl(tmp_path / "corpus.jsonl", [{"text": "no id"}])
    assert error(path).startswith(f'{path}:1: missing field "docid"')


def test_duplicate_docid(tmp_path):
    path = jsonl(tmp_path / "corpus.jsonl", [*docs(2), {"_id": "d0", "text": "again"}])
    assert error(path) == f"{path}:3: field 'docid': duplicate docid 'd0'"


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_input(tmp_path, content):
    path = tmp_path / "corpus.jsonl"
    path.write_text(content)
    assert error(path) == f"{path}: empty input: no doc records"
    assert list(records.read(path, "doc", allow_empty=True)) == []


@pytest.mark.parametrize(
    "row, message",
    [
        ({"docid": "d1", "text": None}, "field 'text': expected a string, got null"),
        ({"docid": "d1", "text": 5}, "field 'text': expected a string, got int"),
        ({"docid": None, "text": "x"}, "field 'docid': expected a string id, got null"),
        ({"docid": ["d1"], "text": "x"}, "field 'docid': expected a string id, got list"),
        ({"docid": " ", "text": "x"}, "field 'docid': empty id"),
        ({"docid": "d1", "title": 3, "text": "x"}, "field 'title': expected a string, got int"),
        ([1, 2], "expected a JSON object, got list"),
    ],
)
def test_wrong_types(tmp_path, row, message):
    path = jsonl(tmp_path / "corpus.jsonl", [docs(1)[0], row])
    assert error(path, unique=False) == f"{path}:2: {message}"


def test_query_wrong_type(tmp_path):
    path = jsonl(tmp_path / "queries.jsonl", [{"query_id": "q1", "query_text": None}])
    assert error(path, "query") == f"{path}:1: field 'query_text': expected a string, got null"


def test_not_utf8_names_its_own_line(tmp_path):
    lines = [json.dumps({"docid": f"d{i}", "text": "x" * 900}).encode() for i in range(20)]
    lines[15] = lines[15].replace(b"xxx", b"x\xffx", 1)
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert error(path).startswith(f"{path}:16: not UTF-8")


def test_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(docs(1)[0]).encode() + b"\n")
    assert [d["docid"] for d in records.read(path, "doc")] == ["d0"]


def _big_corpus_bytes(n=3000):
    import random

    rng = random.Random(0)
    rows = [{"docid": f"d{i}", "text": "".join(rng.choice("abcdefgh ") for _ in range(80))} for i in range(n)]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.mark.parametrize("ext, compress", [(".gz", gzip.compress), (".zst", lambda b: zstandard.ZstdCompressor().compress(b))])
def test_truncated_compressed_file(tmp_path, ext, compress):
    blob = compress(_big_corpus_bytes())
    path = tmp_path / f"corpus.jsonl{ext}"
    path.write_bytes(blob[: len(blob) // 2])
    assert "unreadable compressed stream" in error(path)


def test_not_gzip_and_missing_file(tmp_path):
    path = tmp_path / "corpus.jsonl.gz"
    path.write_bytes(b"plain text, not gzip")
    assert error(path).startswith(f"{path}:1: unreadable compressed stream")
    assert error(tmp_path / "nope.jsonl") == f"{tmp_path / 'nope.jsonl'}: no such file"


def test_parquet_errors_name_the_row(tmp_path):
    path = tmp_path / "corpus.parquet"
    records.write([*docs(2), {"docid": "d2", "title": "", "text": None}], path)
    assert error(path) == f"{path}:3: field 'text': expected a string, got null"
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    assert "not a Parquet file" in error(bad)


# ---------------------------------------------------------------- aliases


def test_doc_aliases(tmp_path):
    rows = [{"_id": "a", "text": "x"}, {"id": "b", "contents": "y"}, {"doc_id": 7, "body": "z", "title": "T", "lang": "en"}]
    got = list(records.read(jsonl(tmp_path / "c.jsonl", rows), "doc"))
    assert got == [
        {"docid": "a", "title": "", "text": "x"},
        {"docid": "b", "title": "", "text": "y"},
        {"docid": "7", "title": "T", "text": "z", "lang": "en"},
    ]


def test_query_aliases(tmp_path):
    rows = [{"_id": "1", "text": "a"}, {"qid": "2", "query": "b"}, {"id": "3", "text": "c", "source_docid": 9}]
    got = list(records.read(jsonl(tmp_path / "q.jsonl", rows), "query"))
    assert [(q["query_id"], q["query_text"]) for q in got] == [("1", "a"), ("2", "b"), ("3", "c")]
    assert got[2]["source_docid"] == "9"


# ---------------------------------------------------------------- containers


@pytest.mark.parametrize("name", ["c.jsonl", "c.jsonl.gz", "c.jsonl.zst", "c.parquet"])
def test_round_trip(tmp_path, name):
    rows = [*docs(3), {"docid": "é", "title": "", "text": "日本語 ✓\ttab"}]
    assert records.write(rows, tmp_path / name) == 4
    assert list(records.read(tmp_path / name, "doc")) == rows
    if name.endswith(".gz"):
        assert gzip.decompress((tmp_path / name).read_bytes()).count(b"\n") == 4


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(), min_size=1, max_size=5))
def test_round_trip_any_text(tmp_path_factory, texts):
    path = tmp_path_factory.mktemp("rt") / "c.jsonl.zst"
    rows = [{"docid": f"d{i}", "title": "", "text": t} for i, t in enumerate(texts)]
    records.write(rows, path)
    assert list(records.read(path, "doc")) == rows


def test_stdin_is_read_and_left_open(monkeypatch):
    data = "".join(json.dumps(d) + "\n" for d in docs(2)).encode()
    stdin = io.TextIOWrapper(io.BytesIO(data))
    monkeypatch.setattr(sys, "stdin", stdin)
    assert [d["docid"] for d in records.read("-", "doc")] == ["d0", "d1"]
    assert not stdin.buffer.closed


def test_read_corpus_and_hashes(tmp_path):
    path = records.write(docs(2), tmp_path / "c.jsonl") and tmp_path / "c.jsonl"
    assert records.read_corpus(path) == {"d0": {"title": "t0", "text": "text number 0"}, "d1": {"title": "t1", "text": "text number 1"}}
    assert records.content_hash("a", "b") == records.content_hash("a", "b") != records.content_hash("a b", "")
    assert records.text_id("x") == records.text_id("x") != records.text_id("y")


# ---------------------------------------------------------------- BEIR folders


@pytest.fixture
def beir(tmp_path):
    root = tmp_path / "beir"
    (root / "qrels").mkdir(parents=True)
    jsonl(root / "corpus.jsonl", [{"_id": "d1", "title": "", "text": "one"}, {"_id": "d2", "title": "", "text": "two"}])
    jsonl(root / "queries.jsonl", [{"_id": "q1", "text": "first"}, {"_id": "q2", "text": "second"}])
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    (root / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nq2\td2\t2\n")
    return root


def test_beir_folder_resolution(beir):
    assert [d["docid"] for d in records.read(beir, "doc")] == ["d1", "d2"]
    assert [q["query_id"] for q in records.read(beir, "query")] == ["q1", "q2"]
    assert records.read_qrels(beir) == {"q1": {"d1": 1}}
    assert records.read_qrels(beir, "dev") == {"q2": {"d2": 2}}
    with pytest.raises(RecordError, match="BEIR folder has no qrels/train.tsv"):
        records.read_qrels(beir, "train")
    (beir / "queries.jsonl").unlink()
    with pytest.raises(RecordError, match="BEIR folder has no queries.jsonl"):
        list(records.read(beir, "query"))


def test_beir_folder_with_only_dev_qrels(beir):
    (beir / "qrels" / "test.tsv").unlink()
    assert records.read_qrels(beir) == {"q2": {"d2": 2}}


# ---------------------------------------------------------------- qrels


@pytest.mark.parametrize(
    "name, text",
    [
        ("qrels.trec", "q1 0 d1 1\nq1 0 d2 0\nq2 0 d3 2\n"),
        ("qrels.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\nq2\td3\t2\n"),
        ("qrels.txt", "q1\td1\t1\nq1\td2\t0\nq2\td3\t2\n"),
        ("qrels.jsonl", '{"query_id": "q1", "doc_id": "d1", "relevance": 1}\n{"qid": "q1", "docid": "d2", "rel": 0}\n'
                        '{"query-id": "q2", "corpus-id": "d3", "score": 2.0}\n'),
    ],
)
def test_qrels_formats(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    assert records.read_qrels(tmp_path / name) == {"q1": {"d1": 1, "d2": 0}, "q2": {"d3": 2}}


@pytest.mark.parametrize(
    "text, message",
    [
        ("q1 0 d1\tx\n", ":1: field 'relevance': not an integer: 'x'"),
        ("q1 0 d1 1 extra\n", ":1: expected 'qid 0 docid rel'"),
        ('{"query_id": "q1", "doc_id": "d1", "relevance": 0.5}\n', ":1: field 'relevance': expected an integer grade"),
        ('{"query_id": "q1", "doc_id": "d1"}\n', ':1: missing field "relevance"'),
        ("", ": empty input: no qrels rows"),
    ],
)
def test_bad_qrels(tmp_path, text, message):
    path = tmp_path / ("qrels.jsonl" if text.startswith("{") else "qrels.trec")
    path.write_text(text)
    with pytest.raises(RecordError) as e:
        records.read_qrels(path)
    assert str(e.value).startswith(f"{path}{message}")


def test_pseudo_queries_are_qrels_of_their_source_documents(tmp_path):
    path = tmp_path / "crops.jsonl"
    path.write_text('{"query_id": "d1#crop0", "query_text": "a b", "source_docid": "d1"}\n'
                    '{"query_id": "d2#qgen0", "query_text": "c", "source_docid": "d2", "relevance": 2}\n')
    assert records.read_qrels(path) == {"d1#crop0": {"d1": 1}, "d2#qgen0": {"d2": 2}}


# ---------------------------------------------------------------- runs


RUN_ROWS = [
    {"query_id": "q1", "doc_id": "a", "score": 1.0},
    {"query_id": "q1", "doc_id": "c", "score": 2.0},
    {"query_id": "q1", "doc_id": "b", "score": 1.0},
    {"query_id": "q2", "doc_id": "x", "score": -0.5},
]
RANKED = {"q1": [("c", 2.0), ("b", 1.0), ("a", 1.0)], "q2": [("x", -0.5)]}  # ties: doc id descending


@pytest.mark.parametrize("name", ["run.trec", "run.jsonl", "run.parquet", "run.jsonl.gz"])
def test_run_round_trip_in_trec_order(tmp_path, name):
    rows = [{**r, "rank": i} for i, r in enumerate(RUN_ROWS, 1)]
    records.write_run(rows, tmp_path / name)
    assert records.read_run(tmp_path / name) == RANKED
    assert list(records.read(tmp_path / name, "run"))[:2] == [
        {"query_id": "q1", "doc_id": "c", "score": 2.0, "rank": 1},
        {"query_id": "q1", "doc_id": "b", "score": 1.0, "rank": 2},
    ]


def test_trec_run_file_format(tmp_path):
    records.write_run(records.run_rows(RANKED), tmp_path / "run.trec", tag="bm25")
    assert (tmp_path / "run.trec").read_text().splitlines()[0] == "q1 Q0 c 1 2.000000 bm25"


def test_jsonl_run_aliases_and_rank_optional(tmp_path):
    path = jsonl(tmp_path / "run.jsonl", [{"qid": "q", "docid": "a", "score": 1}, {"query_id": "q", "doc_id": "b", "score": 2}])
    assert records.read_run(path) == {"q": [("b", 2.0), ("a", 1.0)]}


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("run.trec", "q1 Q0 a 1 1.0 t\nq1 Q0 a 2 0.5 t\n", ":2: field 'doc_id': doc 'a' appears twice for query 'q1'"),
        ("run.trec", "q1 Q0 a 1 NaN t\n", ":1: field 'score': NaN score"),
        ("run.jsonl", '{"query_id": "q", "doc_id": "a", "score": NaN}\n', ":1: field 'score': NaN score"),
        ("run.jsonl", '{"query_id": "q", "doc_id": "a", "score": "1"}\n', ":1: field 'score': expected a number, got str"),
        ("run.trec", "q1 a 1.0\n", ":1: expected 6 columns"),
        ("run.trec", "", ": empty input: no run rows"),
    ],
)
def test_bad_runs(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(RecordError) as e:
        records.read_run(tmp_path / name)
    assert str(e.value).startswith(f"{tmp_path / name}{message}")


# ---------------------------------------------------------------- groups


def test_group_canonical(tmp_path):
    row = {"query_id": "q1", "query_text": "cats", "positive_document_ids": ["d1"], "negative_document_ids": ["d2", "d3"],
           "negative_scores": [0.5, 0.25]}
    (g,) = records.read(jsonl(tmp_path / "g.jsonl", [row]), "group")
    assert g == row


def test_group_tevatron_legacy_carries_passages(tmp_path):
    row = {"query_id": "q1", "query": "cats", "positive_passages": [{"docid": "d1", "title": "T", "text": "purr"}],
           "negative_passages": [{"docid": "d2", "text": "bark"}]}
    (g,) = records.read(jsonl(tmp_path / "g.jsonl", [row]), "group")
    assert (g["positive_document_ids"], g["negative_document_ids"]) == (["d1"], ["d2"])
    assert g["passages"] == {"d1": {"title": "T", "text": "purr"}, "d2": {"title": "", "text": "bark"}}


def test_group_flagembedding_gets_text_ids(tmp_path):
    row = {"query": "cats", "pos": ["purr"], "neg": ["bark", "moo"]}
    (g,) = records.read(jsonl(tmp_path / "g.jsonl", [row]), "group")
    assert g["query_id"] == records.text_id("cats") and g["query_text"] == "cats"
    assert g["positive_document_ids"] == [records.text_id("purr")]
    assert g["passages"][records.text_id("moo")] == {"title": "", "text": "moo"}


@pytest.mark.parametrize(
    "row, message",
    [
        ({"query_id": "q", "query_text": "x", "positive_document_ids": []}, "a group needs at least one positive"),
        ({"query_id": "q", "query_text": "x"}, 'missing field "positive_document_ids"'),
        ({"query_id": "q", "query_text": "x", "positive_document_ids": "d1"}, "field 'positive_document_ids': expected a list"),
        ({"query_id": "q", "query_text": "x", "positive_document_ids": ["d1"], "positive_scores": [1, 2]},
         "field 'positive_scores': expected a list of 1 numbers"),
        ({"query": "x", "pos": "purr"}, "field 'pos': expected a list of strings"),
    ],
)
def test_bad_groups(tmp_path, row, message):
    path = jsonl(tmp_path / "g.jsonl", [row])
    assert message in error(path, "group") and error(path, "group").startswith(f"{path}:1:")


# ---------------------------------------------------------------- atomic writes


def _failing(n):
    yield from docs(n)
    raise RuntimeError("stage died")


@pytest.mark.parametrize("name", ["out.jsonl", "out.jsonl.gz", "out.jsonl.zst", "out.parquet"])
def test_failed_write_leaves_nothing(tmp_path, name):
    with pytest.raises(RuntimeError):
        records.write(_failing(3), tmp_path / name, batch_size=2)
    assert list(tmp_path.iterdir()) == []


def test_failed_write_keeps_the_previous_file(tmp_path):
    target = tmp_path / "out.jsonl"
    records.write(docs(1), target)
    before = target.read_bytes()
    with pytest.raises(RuntimeError):
        records.write(_failing(5), target)
    assert target.read_bytes() == before and list(tmp_path.iterdir()) == [target]


def test_failed_run_write_leaves_nothing(tmp_path):
    def rows():
        yield {"query_id": "q", "doc_id": "a", "score": 1.0, "rank": 1}
        raise RuntimeError("died")

    with pytest.raises(RuntimeError):
        records.write_run(rows(), tmp_path / "run.trec")
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_swaps_only_on_success(tmp_path):
    target = tmp_path / "idx"
    with records.atomic_dir(target) as d:
        (d / "a").write_text("1")
    assert (target / "a").read_text() == "1"
    with pytest.raises(RuntimeError), records.atomic_dir(target) as d:
        (d / "a").write_text("2")
        raise RuntimeError("died")
    assert (target / "a").read_text() == "1"  # the old directory is untouched; the partial one stays for resume
    with records.atomic_dir(target) as d:
        (d / "a").write_text("3")
    assert (target / "a").read_text() == "3" and sorted(p.name for p in tmp_path.iterdir()) == ["idx"]


# ---------------------------------------------------------------- corrupt streams, whitespace ids, TSV qrels


def test_gzip_corrupt_mid_stream_names_file_and_line(tmp_path):
    """A damaged deflate block raises zlib.error (not OSError): it must still be a RecordError."""
    import zlib

    good = gzip.compress(_big_corpus_bytes(), mtime=0)
    for pos in range(len(good) // 2, len(good), 97):  # the first damage past the middle that zlib itself detects
        blob = good[:pos] + b"\xff" * 8 + good[pos + 8 :]
        with pytest.raises((zlib.error, gzip.BadGzipFile, EOFError)) as raised:
            gzip.decompress(blob)
        if raised.type is zlib.error:
            break
    assert raised.type is zlib.error
    path = tmp_path / "corpus.jsonl.gz"
    path.write_bytes(blob)
    msg = error(path)
    assert msg.startswith(f"{path}:") and "unreadable compressed stream" in msg and "Error -3" in msg
    assert int(msg[len(str(path)) + 1 :].split(":")[0]) > 1  # the line reached, not line 1


def test_zstd_corrupt_mid_stream(tmp_path):
    blob = bytearray(zstandard.ZstdCompressor().compress(_big_corpus_bytes()))
    blob[len(blob) // 2 : len(blob) // 2 + 20] = b"\x5a" * 20
    path = tmp_path / "corpus.jsonl.zst"
    path.write_bytes(bytes(blob))
    assert "unreadable compressed stream" in error(path)


def test_parquet_corrupt_page_and_truncated_file(tmp_path):
    path = tmp_path / "corpus.parquet"
    records.write(docs(3000), path, batch_size=500)
    data = bytearray(path.read_bytes())
    data[len(data) // 4 : len(data) // 4 + 200] = bytes(b ^ 0x5A for b in data[len(data) // 4 : len(data) // 4 + 200])
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(data))
    assert error(bad).startswith(f"{bad}:") and "unreadable Parquet data" in error(bad)
    bad.write_bytes(path.read_bytes()[: len(data) // 2])
    assert error(bad).startswith(f"{bad}: not a Parquet file")


def test_parquet_wrong_schema(tmp_path):
    path = tmp_path / "corpus.parquet"
    records.write([{"name": "x", "size": 3}], path)
    assert error(path).startswith(f'{path}:1: missing field "docid"')
    records.write([{"docid": "d1", "text": 5}], path)
    assert error(path) == f"{path}:1: field 'text': expected a string, got int"


SPACEY = ["a b", "a\tb", "a\nb", "trail ", " lead", "nb\u00a0sp", "ideo\u3000sp"]


@pytest.mark.parametrize("bad", SPACEY)
@pytest.mark.parametrize(
    "kind, row, field",
    [
        ("doc", lambda i: {"docid": i, "text": "x"}, "docid"),
        ("query", lambda i: {"query_id": i, "query_text": "x"}, "query_id"),
        ("query", lambda i: {"query_id": "q", "query_text": "x", "source_docid": i}, "source_docid"),
        ("group", lambda i: {"query_id": i, "query_text": "x", "positive_document_ids": ["d"]}, "query_id"),
        ("group", lambda i: {"query_id": "q", "query_text": "x", "positive_document_ids": ["d", i]}, "positive_document_ids"),
        ("group", lambda i: {"query_id": "q", "query_text": "x", "positive_document_ids": ["d"], "negative_document_ids": [i]},
         "negative_document_ids"),
        ("qrels", lambda i: {"query_id": "q", "doc_id": i, "relevance": 1}, "doc_id"),
    ],
)
def test_ids_with_whitespace_are_rejected_at_read_time(tmp_path, kind, row, field, bad):
    """TREC runs/qrels (and trec_eval, Pyserini) split on whitespace: such an id cannot survive a run."""
    path = jsonl(tmp_path / "in.jsonl", [row("ok1"), row(bad)])
    with pytest.raises(RecordError) as e:
        if kind == "qrels":
            records.read_qrels(path)
        else:
            list(records.read(path, kind))
    assert str(e.value) == (f"{path}:2: field '{field}': id {bad!r} contains whitespace, which TREC runs and qrels "
                            "cannot carry: rename it")


def test_run_jsonl_with_whitespace_id_is_rejected(tmp_path):
    path = jsonl(tmp_path / "run.jsonl", [{"query_id": "q", "doc_id": "a b", "score": 1}])
    with pytest.raises(RecordError) as e:
        records.read_run(path)
    assert str(e.value).startswith(f"{path}:1: field 'doc_id': id 'a b' contains whitespace")


def test_trec_writer_refuses_whitespace_ids_and_tags(tmp_path):
    """Ids from an index built before the read-time check must not become 7-column lines."""
    out = tmp_path / "run.trec"
    rows = [{"query_id": "q", "doc_id": "d1", "score": 2.0, "rank": 1}, {"query_id": "q", "doc_id": "a b", "score": 1.0, "rank": 2}]
    with pytest.raises(RecordError) as e:
        records.write_run(rows, out)
    assert str(e.value) == f"{out}:2: id 'a b' contains whitespace, which a TREC run cannot carry: write --output-format jsonl"
    assert list(tmp_path.iterdir()) == []
    records.write_run(rows, tmp_path / "run.jsonl")  # JSONL carries any id
    assert (tmp_path / "run.jsonl").read_text().count('"a b"') == 1
    with pytest.raises(RecordError, match="run tag 'my run'"):
        records.write_run(rows[:1], out, tag="my run")
    assert not out.exists()


@pytest.mark.parametrize(
    "text, message",
    [
        ("query-id\tcorpus-id\tscore\nq 1\td1\t1\n", ":2: field 'query_id': id 'q 1' contains whitespace"),
        ("q 1\td1\t1\n", ":1: field 'query_id': id 'q 1' contains whitespace"),
        ("q1\td 1\t1\n", ":1: field 'doc_id': id 'd 1' contains whitespace"),
        ("q1\t0\td1 \t1\n", ":1: field 'doc_id': id 'd1 ' contains whitespace"),
        ("query-id\tcorpus-id\tscore\nq1 d1 1\n", ":2: expected 'qid 0 docid rel' or 'query-id corpus-id score', got 1 columns"),
        ("q1\t\t1\n", ":1: field 'doc_id': empty id"),
    ],
)
def test_tab_separated_qrels_split_on_tabs_only(tmp_path, text, message):
    """BEIR TSV with a space in an id is BEIR TSV, not 4-column TREC (query 'q')."""
    path = tmp_path / "qrels.tsv"
    path.write_text(text)
    with pytest.raises(RecordError) as e:
        records.read_qrels(path)
    assert str(e.value).startswith(f"{path}{message}")


@pytest.mark.parametrize(
    "text",
    ["query-id\tcorpus-id\tscore\r\nq1\td1\t1\r\nq1\td2\t0\r\nq2\td3\t2\r\n",  # Windows line ends
     "q1\t0\td1\t1\nq1\t0\td2\t0\nq2\t0\td3\t2\n",  # MS MARCO: TREC columns, tab-separated
     "query-id corpus-id score\nq1 d1 1\nq1 d2 0\nq2 d3 2\n"],  # a space-separated header keeps whitespace splitting
)
def test_tab_separated_qrels_variants(tmp_path, text):
    path = tmp_path / "qrels.tsv"
    path.write_bytes(text.encode())
    assert records.read_qrels(path) == {"q1": {"d1": 1, "d2": 0}, "q2": {"d3": 2}}


# ---------------------------------------------------------------- an output never overwrites an input


def _clash(outputs, inputs, **kw) -> str:
    with pytest.raises(RecordError) as e:
        records.check_outputs(outputs, inputs, **kw)
    return str(e.value)


def test_check_outputs_relations(tmp_path):
    f, d = tmp_path / "c.jsonl", tmp_path / "idx"
    f.write_text("{}\n")
    d.mkdir()
    (d / "index.json").write_text("{}")
    assert _clash([str(f)], [str(f)]) == (f"{f}: the output is the input {f}: writing it would destroy the input; "
                                         "nothing written (choose another -o)")
    assert "the output is inside the input" in _clash([str(d / "index.json")], ["-", str(d)])
    assert "the output is inside the input" in _clash([str(d / "new" / "run.trec")], [str(d)])
    assert "the output contains the input" in _clash([str(tmp_path)], [str(f)], dir_output=True)
    assert "the output contains the input" in _clash(["/"], [str(f)], dir_output=True)
    assert "the input " + str(f) in _clash([None, str(f)], [[str(d / "x"), str(f)]])  # lists flattened, None skipped
    records.check_outputs(["-"], [str(f), "-"])
    records.check_outputs([str(tmp_path / "other.jsonl")], [str(f), str(d), "-", None, "bm25"])
    records.check_outputs([str(tmp_path / "gone")], [str(tmp_path / "gone")])  # a missing input cannot be lost


def test_check_outputs_resolves_symlinks_and_checks_the_kind(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text("{}\n")
    (tmp_path / "link.jsonl").symlink_to(f)
    (tmp_path / "dirlink").symlink_to(tmp_path)
    assert "the output is the input" in _clash([str(tmp_path / "link.jsonl")], [str(f)])
    assert "the output is the input" in _clash([str(f)], [str(tmp_path / "link.jsonl")])
    assert "the output is the input" in _clash([str(tmp_path / "dirlink" / "c.jsonl")], [str(f)])
    assert _clash([str(tmp_path)], []) == f"{tmp_path}: is a directory: -o needs a file path here"
    assert _clash([str(f)], [], dir_output=True) == f"{f}: is a file: -o needs a directory here"
    assert _clash([str(f / "sub" / "out.jsonl")], []) == f"{f / 'sub' / 'out.jsonl'}: cannot be created: {f} is a file, not a directory"
