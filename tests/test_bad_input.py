"""Bad input and unsafe outputs, for every stage: nothing lost, nothing half-written.

- An output that is, is inside, or contains one of the command's inputs is refused before anything is read
  (exit 2, one line naming both paths) and the input is byte-identical afterwards.
- The bad-input matrix, for every stage that reads records, through the Python API and the CLI: invalid JSON,
  missing field, wrong type, empty, binary, non-UTF-8, corrupt/truncated .gz and .zst, wrong Parquet schema,
  duplicate ids, whitespace ids -> RecordError / exit 2 with one line naming file:line (or the file), and no
  output file or temp file anywhere.
- Bad flag values exit 2 through click types, never a bare exception with exit 1.
- Run tags, checkpoints and Parquet on stdin/stdout: refused before anything is written or cut.
The readers' and writers' own properties (round trips, arbitrary bytes) are tests/test_records_properties.py's.
LLM stages use the OpenAI backend pointed at a closed port: the bad input is found before any request.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest
import zstandard
from conftest import DOCS, QRELS, QUERIES

from retrctl import records
from retrctl.records import RecordError

NO_SERVER = ("--llm-backend", "openai", "--llm", "fake-model", "--base-url", "http://127.0.0.1:9/v1", "--max-retries", "0")
GROUPS = [{"query_id": q["query_id"], "query_text": q["query_text"], "positive_document_ids": [next(iter(QRELS[q["query_id"]]))],
           "negative_document_ids": ["d2", "d5"]} for q in QUERIES]


def write_jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tree(path: Path) -> dict[str, str]:
    """Every file under path (or the file itself) -> its content hash: 'byte-identical afterwards'."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    corpus = write_jsonl(d / "corpus.jsonl", DOCS)
    queries = write_jsonl(d / "queries.jsonl", QUERIES)
    groups = write_jsonl(d / "groups.jsonl", GROUPS)
    qrels = d / "qrels.tsv"
    qrels.write_text("".join(f"{q} 0 {doc} {r}\n" for q, docs in QRELS.items() for doc, r in docs.items()))
    run = d / "run.trec"
    run.write_text("".join(f"{q['query_id']} Q0 d{j} {j} {10 - j} t\n" for q in QUERIES for j in range(1, 5)))
    return {"corpus": corpus, "queries": queries, "groups": groups, "qrels": qrels, "run": run, "dir": d}


@pytest.fixture(scope="module")
def bm25_index(tmp_path_factory):
    from retrctl.indexes import BM25Index

    out = tmp_path_factory.mktemp("idx") / "bm25"
    idx = BM25Index()
    idx.build(iter(DOCS))
    idx.save(out)
    return out


# ---------------------------------------------------------------- output onto its own input


def _clash_cases(data, idx):
    c, q, g, qr, run = (str(data[k]) for k in ("corpus", "queries", "groups", "qrels", "run"))
    crops = data["dir"] / "crops.jsonl"
    write_jsonl(crops, [{"query_id": "d1#crop0", "query_text": "Cats purr", "source_docid": "d1"}])
    crops = str(crops)
    return {
        "crop onto its input": (["crop", c, "-o", c], c),
        "crop through a symlink": (["crop", str(data["dir"] / "link.jsonl"), "-o", c], c),
        "mine onto its queries": (["mine", crops, "--corpus", c, "--retriever", "bm25", "-o", crops], crops),
        "mine onto its corpus": (["mine", crops, "--corpus", c, "--retriever", "bm25", "-o", c], c),
        "mine onto its qrels": (["mine", q, "--corpus", c, "--qrels", qr, "--retriever", "bm25", "-o", qr], qr),
        "mine onto its run retriever": (["mine", q, "--corpus", c, "--retriever", run, "-o", run], run),
        "mine into its index retriever": (["mine", q, "--corpus", c, "--retriever", idx, "-o", f"{idx}/g.jsonl"], idx),
        "search onto its queries": (["search", idx, q, "-o", q], q),
        "search into its index": (["search", idx, q, "-o", f"{idx}/index.json"], idx),
        "search onto its corpus": (["search", idx, q, "--with-text", "--corpus", c, "-o", c], c),
        "train onto its groups": (["train", g, "--corpus", c, "--model", "x", "-o", g], g),
        "train onto its corpus": (["train", g, "--corpus", c, "--model", "x", "-o", c], c),
        "train around its groups": (["train", g, "--corpus", c, "--model", "x", "-o", str(data["dir"])], str(data["dir"])),
        "index onto its corpus": (["index", c, "--method", "bm25", "-o", c], c),
        "index around its corpus": (["index", c, "--method", "bm25", "-o", str(data["dir"])], str(data["dir"])),
        "index merge onto a part": (["index", "--merge", idx, idx, "-o", idx], idx),
        "eval onto its run": (["eval", run, "--qrels", qr, "-o", run], run),
        "eval onto its qrels": (["eval", run, "--qrels", qr, "-o", qr], qr),
        "rerank onto its run": (["rerank", run, "--queries", q, "--corpus", c, *NO_SERVER, "-o", run], run),
        "rerank onto its queries": (["rerank", run, "--queries", q, "--corpus", c, *NO_SERVER, "-o", q], q),
        "rerank onto its groups": (["rerank", g, "--corpus", c, *NO_SERVER, "-o", g], g),
        "qgen onto its docs": (["qgen", c, *NO_SERVER, "-o", c], c),
        "qgen candidates onto its docs": (["qgen", c, *NO_SERVER, "-o", str(data["dir"] / "q.jsonl"), "--candidates-file", c], c),
    }


CASE_NAMES = [
    "crop onto its input", "crop through a symlink", "mine onto its queries", "mine onto its corpus", "mine onto its qrels",
    "mine onto its run retriever", "mine into its index retriever", "search onto its queries", "search into its index",
    "search onto its corpus", "train onto its groups", "train onto its corpus", "train around its groups",
    "index onto its corpus", "index around its corpus", "index merge onto a part", "eval onto its run",
    "eval onto its qrels", "rerank onto its run", "rerank onto its queries", "rerank onto its groups",
    "qgen onto its docs", "qgen candidates onto its docs",
]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_output_onto_an_input_is_refused_and_the_input_kept(runner, data, bm25_index, tmp_path, case):
    idx = tmp_path / "idx"
    import shutil

    shutil.copytree(bm25_index, idx)
    (data["dir"] / "link.jsonl").symlink_to(data["corpus"])
    args, victim = _clash_cases(data, str(idx))[case]
    before = tree(victim)
    everything = tree(tmp_path)
    res = runner(*args)
    assert res.exit_code == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "writing it would destroy the input" in lines[0], res.stderr
    out = args[args.index("--candidates-file") + 1] if "--candidates-file" in args else args[args.index("-o") + 1]
    assert f": {out}: the output" in lines[0] and "the input" in lines[0]
    assert tree(victim) == before
    assert tree(tmp_path) == everything  # nothing written anywhere
    assert not res.stdout


def test_clash_cases_are_all_run(data, tmp_path):
    assert sorted(_clash_cases(data, str(tmp_path / "idx"))) == sorted(CASE_NAMES)


def test_output_beside_the_input_is_fine(runner, data, tmp_path):
    out = data["dir"] / "crops.jsonl"
    res = runner("crop", data["corpus"], "-o", out)
    assert res.exit_code == 0, res.stderr
    assert len(list(records.read(out, "query"))) == len(DOCS)


@pytest.mark.parametrize("stage_args", [("crop",), ("eval", "--qrels", "QRELS", "RUN")])
def test_output_that_is_a_directory_is_refused_before_work(runner, data, tmp_path, stage_args):
    args = [str(data["qrels"]) if a == "QRELS" else str(data["run"]) if a == "RUN" else a for a in stage_args]
    if args == ["crop"]:
        args.append(str(data["corpus"]))
    res = runner(*args, "-o", tmp_path)
    assert res.exit_code == 2 and res.stderr.strip().endswith(f"{tmp_path}: is a directory: -o needs a file path here")


# ---------------------------------------------------------------- the bad-input matrix

GOOD = {
    "doc": {"docid": "d1", "text": "Cats purr."},
    "query": {"query_id": "q1", "query_text": "which animals purr"},
    "group": {"query_id": "q1", "query_text": "x", "positive_document_ids": ["d1"], "negative_document_ids": ["d2"]},
    "run": {"query_id": "q1", "doc_id": "d1", "score": 1.0},
    "qrels": {"query_id": "q1", "doc_id": "d1", "relevance": 1},
}
WRONG_TYPE = {
    "doc": {"docid": ["d1"], "text": "t"},
    "query": {"query_id": "q1", "query_text": 5},
    "group": {"query_id": "q1", "query_text": "x", "positive_document_ids": "d1"},
    "run": {"query_id": "q1", "doc_id": "d1", "score": "high"},
    "qrels": {"query_id": "q1", "doc_id": "d1", "relevance": "x"},
}
ID_FIELD = {"doc": "docid", "query": "query_id", "group": "query_id", "run": "doc_id", "qrels": "doc_id"}


def _big(kind: str) -> bytes:
    """Enough rows that a compressed stream spans several blocks, so damage lands mid-stream."""
    rows = []
    for i in range(3000):
        r = dict(GOOD[kind])
        r[ID_FIELD[kind]] = f"x{i}" if kind != "group" else f"q{i}"
        if kind in ("run", "qrels"):
            r["query_id"] = f"q{i}"
        r["pad"] = hashlib.sha256(str(i).encode()).hexdigest()  # incompressible enough
        rows.append(r)
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _damage(blob: bytes) -> bytes:
    mid = len(blob) // 2
    return blob[:mid] + bytes(b ^ 0x5A for b in blob[mid : mid + 64]) + blob[mid + 64 :]


BAD = ["invalid_json", "missing_field", "wrong_type", "empty", "binary", "non_utf8", "gz_corrupt", "gz_truncated",
       "zst_corrupt", "zst_truncated", "parquet_schema", "parquet_garbage", "duplicate_id", "whitespace_id", "deep_json"]


def make_bad(folder: Path, kind: str, case: str) -> tuple[Path, str]:
    """A bad file of ``kind`` and the start its error message must have ('<path>:<line>:' or '<path>:')."""
    folder.mkdir(parents=True, exist_ok=True)
    good = json.dumps(GOOD[kind]) + "\n"
    name = {"run": "run", "qrels": "qrels"}.get(kind, "in") + ".jsonl"
    path = folder / name
    line = None
    if case == "invalid_json":
        path.write_text(good + '{"oops": \n')
        line = 2
    elif case == "missing_field":
        path.write_text(good + json.dumps({"foo": 1}) + "\n")
        line = 2
    elif case == "wrong_type":
        path.write_text(good + json.dumps(WRONG_TYPE[kind]) + "\n")
        line = 2
    elif case == "empty":
        path.write_text("")
    elif case == "binary":
        path.write_bytes(bytes(range(256)) * 4)
        line = 1
    elif case == "non_utf8":
        path.write_bytes(good.encode() + good.encode().replace(b'"1', b'"\xff1', 1).replace(b"q1", b"q\xfe", 1))
        line = 2
    elif case.startswith(("gz", "zst")):
        ext, how = case.split("_")
        path = folder / (name + "." + ext)
        blob = gzip.compress(_big(kind), mtime=0) if ext == "gz" else zstandard.ZstdCompressor(write_checksum=True).compress(_big(kind))  # as the zstd CLI and records.write
        path.write_bytes(_damage(blob) if how == "corrupt" else blob[: len(blob) // 2])
    elif case == "parquet_schema":
        path = folder / name.replace(".jsonl", ".parquet")
        records.write([{"name": "x", "size": 1}], path)
        line = 1
    elif case == "parquet_garbage":
        path = folder / name.replace(".jsonl", ".parquet")
        path.write_bytes(b"PAR1" + bytes(range(256)) * 8)
    elif case == "duplicate_id":
        if kind == "run":
            path.write_text(good + good)
        elif kind in ("doc", "query"):
            path.write_text(good + good)
        else:
            return None, None  # groups and qrels may repeat a query id
        line = 2
    elif case == "deep_json":  # json.loads raises RecursionError, not JSONDecodeError
        path.write_text(good + '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
        line = 2
    elif case == "whitespace_id":
        row = dict(GOOD[kind])
        row[ID_FIELD[kind]] = "a b"
        path.write_text(good + json.dumps(row) + "\n")
        line = 2
    return path, f"{path}:{line}:" if line else f"{path}:"


def _api(stage: str, path: Path, tmp_path: Path, tiny_bert):
    """Run the stage's Python function on the bad file (the reading it does itself, or records.read as a caller would)."""
    if stage == "crop":
        from stages.crop import crop

        return list(crop(records.read(path, "doc")))
    if stage == "index":
        from stages.index import index

        return index(records.read(path, "doc"), tmp_path / "out" / "idx", method="bm25")
    if stage == "search":
        from retrctl.indexes.bm25 import BM25Index
        from stages.search import search

        idx = BM25Index()
        idx.build(iter(DOCS))
        return list(search(records.read(path, "query"), idx, hits=3))
    if stage == "mine":
        from retrctl.retrievers import RunRetriever
        from stages.mine import mine

        corpus = {d["docid"]: d for d in DOCS}
        return list(mine(records.read(path, "query"), corpus=corpus, retriever=RunRetriever({})))
    if stage == "qgen":
        from retrctl.llm import load_llm
        from stages.qgen import qgen

        return list(qgen(records.read(path, "doc"), load_llm("fake-model", "openai", "http://127.0.0.1:9/v1", max_retries=0),
                         batch_size=5000))
    if stage == "rerank":
        from retrctl.llm import load_llm
        from stages.rerank import rerank

        # the command reads all groups before the first LLM call (to look their passages up); so does this caller
        items = [{"query_id": g["query_id"], "query_text": g["query_text"], "docs": DOCS[:2]} for g in records.read(path, "group")]
        return list(rerank(items, load_llm("fake-model", "openai", "http://127.0.0.1:9/v1", max_retries=0)))
    if stage == "train":
        from stages.train import train

        return train(str(path), output=tmp_path / "out" / "model", corpus={d["docid"]: d for d in DOCS}, model=str(tiny_bert),
                     device="cpu", batch_size=2, max_steps=1)
    if stage == "eval":
        from stages.eval import eval

        return eval([(str(path), records.read_run(path))], QRELS)
    if stage == "eval-qrels":
        return records.read_qrels(path)
    raise AssertionError(stage)


def _cli(stage: str, path: Path, data: dict, out: Path, idx: Path, tiny_bert) -> list[str]:
    c, q, g, run, qr = (str(data[k]) for k in ("corpus", "queries", "groups", "run", "qrels"))
    return {
        "crop": ["crop", path, "-o", out / "q.jsonl"],
        # one batch holds every doc, so damage deep in a file is found before the (absent) server is called; with a
        # server, the docs before the damage are generated and checkpointed for the rerun (qgen resumes)
        "qgen": ["qgen", path, *NO_SERVER, "--batch-size", "5000", "-o", out / "q.jsonl"],
        "mine": ["mine", path, "--corpus", c, "--retriever", "bm25", "-o", out / "g.jsonl"],
        "mine-corpus": ["mine", q, "--corpus", path, "--retriever", "bm25", "-o", out / "g.jsonl"],
        "rerank": ["rerank", path, "--corpus", c, *NO_SERVER, "-o", out / "g.jsonl"],
        "train": ["train", path, "--corpus", c, "--model", tiny_bert, "--device", "cpu", "--train-batch-size", "2",
                  "--max-steps", "1", "-o", out / "model"],
        "index": ["index", path, "--method", "bm25", "-o", out / "idx"],
        "search": ["search", idx, path, "-o", out / "run.trec"],
        "eval": ["eval", path, "--qrels", qr, "-o", out / "eval.txt"],
        "eval-qrels": ["eval", run, "--qrels", path, "-o", out / "eval.txt"],
    }[stage]


# stage -> the record kind its bad file holds
STAGES = {"crop": "doc", "qgen": "doc", "mine": "query", "mine-corpus": "doc", "rerank": "group", "train": "group",
          "index": "doc", "search": "query", "eval": "run", "eval-qrels": "qrels"}
API_STAGES = [s for s in STAGES if s != "mine-corpus"]


def _matrix(stages):
    return [(s, case) for s in stages for case in BAD if not (case == "duplicate_id" and STAGES[s] in ("group", "qrels"))]


@pytest.mark.parametrize("stage, case", _matrix(STAGES))
def test_bad_input_cli_exit_2_one_line_no_output(runner, data, bm25_index, tmp_path, tiny_bert, stage, case):
    path, where = make_bad(tmp_path / "bad", STAGES[stage], case)
    out = tmp_path / "out"
    out.mkdir()
    res = runner(*_cli(stage, path, data, out, bm25_index, tiny_bert), "-q")
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2, res.stderr
    assert lines and lines[-1].startswith(f"retrctl {stage.split('-')[0]}: {where}"), res.stderr
    assert len([ln for ln in lines if not ln.startswith("retrctl.")]) == 1, res.stderr  # warnings aside: one line
    assert list(out.iterdir()) == [], "partial output left behind"
    assert not res.stdout


@pytest.mark.parametrize("stage, case", _matrix(API_STAGES))
def test_bad_input_api_raises_record_error(tmp_path, tiny_bert, stage, case):
    path, where = make_bad(tmp_path / "bad", STAGES[stage], case)
    with pytest.raises(RecordError) as e:
        _api(stage, path, tmp_path, tiny_bert)
    assert str(e.value).startswith(where), str(e.value)
    assert "\n" not in str(e.value).replace(repr("\n")[1:-1], "")
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


# ---------------------------------------------------------------- flags


BAD_FLAGS = [
    ("crop", "--per-doc", "0"), ("crop", "--per-doc", "-1"), ("crop", "--min-words", "0"), ("crop", "--max-words", "0"),
    ("crop", "--shard-num", "0"), ("crop", "--shard-id", "-1"), ("crop", "--max-words", "2"),
    ("mine", "--top-k", "0"), ("mine", "--top-k", "-5"), ("mine", "--num-negatives", "-1"), ("mine", "--batch-size", "0"),
    ("mine", "--negative-range", "9-3"), ("mine", "--negative-range", "abc"), ("mine", "--positive-ranks", "-1"),
    ("mine", "--relative-margin", "-0.1"), ("mine", "--passage-max-len", "0"),
    ("qgen", "--per-doc", "0"), ("qgen", "--top-p", "0"), ("qgen", "--top-p", "1.5"), ("qgen", "--sampling-temperature", "-1"), ("qgen", "--temperature", "-1"),
    ("qgen", "--max-new-tokens", "0"), ("qgen", "--keep-top", "0"), ("qgen", "--concurrency", "0"), ("qgen", "--timeout", "0"),
    ("qgen", "--max-retries", "-1"), ("qgen", "--min-words", "5", "--max-words", "3"), ("qgen", "--batch-size", "0"),
    ("rerank", "--window", "1"), ("rerank", "--stride", "0"), ("rerank", "--window", "5", "--stride", "6"),
    ("rerank", "--top-k", "0"), ("rerank", "--passage-max-words", "0"), ("rerank", "--negative-ranks", "5-2"),
    ("search", "--hits", "0"), ("search", "--hits", "-5"), ("search", "--ef-search", "0"), ("search", "--nprobe", "0"),
    ("search", "--batch-size", "0"),
    ("eval", "--alpha", "0"), ("eval", "--alpha", "1"),
    ("index", "--batch-size", "0"), ("index", "--shard-num", "0"),
    ("train", "--train-batch-size", "0"), ("train", "--batch-size", "0"),
]


@pytest.mark.parametrize("flag", BAD_FLAGS, ids=lambda f: " ".join(f))
def test_bad_flag_values_exit_2(runner, data, bm25_index, tmp_path, flag):
    stage, *rest = flag
    c, q, g, run, qr = (str(data[k]) for k in ("corpus", "queries", "groups", "run", "qrels"))
    base = {"crop": [c], "mine": [q, "--corpus", c, "--retriever", "bm25"], "qgen": [c, *NO_SERVER],
            "rerank": [run, "--queries", q, "--corpus", c, *NO_SERVER], "search": [bm25_index, q], "eval": [run, "--qrels", qr],
            "index": [c, "--method", "bm25"], "train": [g, "--corpus", c, "--model", "x"]}[stage]
    out = tmp_path / ("outdir" if stage in ("index", "train") else "out.txt")
    res = runner(stage, *base, *rest, "-o", out)
    assert res.exit_code == 2, (res.exit_code, res.stderr)
    assert "Traceback" not in res.stderr and ("Invalid value" in res.stderr or "Error:" in res.stderr), res.stderr
    assert not out.exists()


# ---------------------------------------------------------------- mine: judgments that match no query


def test_mine_qrels_matching_no_query_is_an_error_unless_allow_empty(runner, data, tmp_path):
    qrels = tmp_path / "other.tsv"
    qrels.write_text("x1 0 d1 1\nx2 0 d2 1\n")
    out = tmp_path / "g.jsonl"
    args = ["mine", data["queries"], "--corpus", data["corpus"], "--qrels", qrels, "--retriever", "bm25", "-o", out]
    res = runner(*args)
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines()[-1] == (
        f"retrctl mine: {qrels}: none of its 2 query ids is among the 3 queries (e.g. 'x1'): wrong judgments for these "
        "queries? (--allow-empty writes the groups anyway)")
    assert not out.exists() and list(tmp_path.glob(".g.jsonl*")) == []
    res = runner(*args, "--allow-empty")
    assert res.exit_code == 0, res.stderr
    assert out.exists() and out.read_text() == ""


# ---------------------------------------------------------------- outputs, run tags, checkpoints and stdin


def test_train_api_refuses_an_output_onto_its_groups(data):
    from stages.train import train

    before = tree(data["groups"])
    with pytest.raises(RecordError, match="the output is the input"):
        train(str(data["groups"]), output=str(data["groups"]), corpus=str(data["corpus"]), model="x")
    assert tree(data["groups"]) == before
    records.check_outputs([str(data["dir"] / "m")], [GROUPS, {"d1": {}}], dir_output=True)  # in-memory inputs: no paths


def test_search_run_tag_with_a_space_exits_2_before_writing(runner, data, bm25_index, tmp_path):
    out = tmp_path / "run.trec"
    res = runner("search", bm25_index, data["queries"], "--run-tag", "my run", "-o", out)
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines()[-1] == (f"retrctl search: {out}: field 'tag': run tag 'my run' is empty or contains "
                                                   "whitespace (TREC's sixth column)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    res = runner("search", bm25_index, data["queries"], "--run-tag", "my run", "--output-format", "jsonl", "-o", out)
    assert res.exit_code == 0, res.stderr  # JSONL runs carry no tag


@pytest.mark.parametrize("content", [b"my notes\nsecond line\n", b"my notes, no newline", b"\xff\xfe\x00binary\n",
                                     b'{"not": "a checkpoint"}\n'])
def test_a_file_given_as_qgen_checkpoint_is_refused_not_truncated(runner, data, tmp_path, content):
    """Checkpoint.resume never cuts a file that is not a checkpoint to nothing as a 'torn last line'."""
    notes = tmp_path / "notes.txt"
    notes.write_bytes(content)
    out = tmp_path / "q.jsonl"
    res = runner("qgen", data["corpus"], *NO_SERVER, "-o", out, "--candidates-file", notes)
    assert res.exit_code == 2 and "is not a retrctl checkpoint" in res.stderr, res.stderr
    assert notes.read_bytes() == content and not out.exists()


def test_parquet_to_stdout_is_a_usage_error(runner, data, bm25_index):
    res = runner("search", bm25_index, data["queries"], "--output-format", "parquet")
    assert res.exit_code == 2 and not res.stdout
    assert res.stderr.strip().splitlines()[-1] == ("retrctl search: -: Parquet output needs a file, not stdout: use -o "
                                                   "FILE.parquet")


def test_parquet_on_stdin_is_refused_with_a_reason(runner, tmp_path):
    path = tmp_path / "docs.parquet"
    records.write(DOCS, path)
    res = runner("crop", "-", "--input-format", "parquet", input=path.read_bytes())
    assert res.exit_code == 2 and not res.stdout
    assert res.stderr.strip() == "retrctl crop: -: Parquet cannot be read from stdin (stdin is JSONL): give the file's path"


def test_bad_input_on_stdin_names_the_line(runner):
    res = runner("crop", "-", input=json.dumps(DOCS[0]) + "\n{oops\n")
    assert res.exit_code == 2
    # stdout streams (a pipe cannot be taken back): only whole records of the lines before the error, and the
    # exit status says the stage failed; -o FILE is all or nothing
    assert [json.loads(x)["source_docid"] for x in res.stdout.splitlines()] == ["d1"]
    assert res.stderr.strip().startswith("retrctl crop: -:2: invalid JSON")
