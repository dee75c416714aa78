"""A new index backend is one module (tests/toy_backend.py) plus one registry line: through the real CLI it is built
with its own `index` flag, updated in place with changed, added and removed docs, and searched with its own `search`
flag, with no stage naming it or its flags."""

import json

import pytest
from conftest import DOCS, QUERIES
from toy_backend import OverlapIndex, expected

from retrctl.indexes import BACKENDS, open_index, store


@pytest.fixture
def overlap(monkeypatch):
    monkeypatch.setitem(BACKENDS, OverlapIndex.name, OverlapIndex)  # the one registry line


def write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def run_scores(path) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        qid, _, docid, _, score, _ = line.split()
        out.setdefault(qid, {})[docid] = float(score)
    return out


def test_its_flags_exist_only_while_it_is_registered(overlap, runner):
    assert "--min-len" in runner("index", "--help").stdout and "--boost" in runner("search", "--help").stdout
    assert "[dense|sparse|bm25|overlap]" in runner("index", "--help").stdout


def test_its_flags_are_gone_when_it_is_not_registered(runner):
    assert "--min-len" not in runner("index", "--help").stdout and "--boost" not in runner("search", "--help").stdout


def test_built_updated_and_searched_through_the_cli(overlap, runner, corpus_file, queries_file, tmp_path):
    out = tmp_path / "idx"
    built = runner("index", corpus_file, "--method", "overlap", "--min-len", 5, "-o", out)
    assert built.exit_code == 0 and "overlap index" in built.stderr and "6 added" in built.stderr, built.stderr
    assert open_index(out).version.manifest["settings"] == {"min_len": 5}

    r = runner("search", out, queries_file, "--boost", 2.5, "-o", tmp_path / "run.trec")
    assert r.exit_code == 0, r.stderr
    assert run_scores(tmp_path / "run.trec") == expected(DOCS, QUERIES, 5, 2.5)
    assert json.loads((tmp_path / "run.trec.manifest.json").read_text())["settings"]["boost"] == 2.5

    # an update in place: the backend and its flag come from the manifest; d4 is gone, d6 changed, d7 is new
    docs = [d for d in DOCS if d["docid"] != "d4"]
    docs = [{**d, "text": "Coffee and purring cats, no beans."} if d["docid"] == "d6" else d for d in docs]
    docs.append({"docid": "d7", "title": "Memory", "text": "A programming language with memory safety."})
    updated = runner("index", write_jsonl(tmp_path / "c2.jsonl", docs), "--min-len", 5, "-o", out)
    assert updated.exit_code == 0, updated.stderr
    assert "1 added, 1 updated, 4 unchanged, 1 removed" in updated.stderr and store.resolve(out).name == "000002"
    r = runner("search", out, queries_file, "-o", tmp_path / "run2.trec")
    assert r.exit_code == 0, r.stderr
    assert run_scores(tmp_path / "run2.trec") == expected(docs, QUERIES, 5)
    assert "d4" not in (tmp_path / "run2.trec").read_text()

    # another value of its own index flag is another index: rebuilt, with the change named
    other = runner("index", tmp_path / "c2.jsonl", "--min-len", 3, "-o", out)
    assert other.exit_code == 0 and "min_len: 5 -> 3" in other.stderr, other.stderr
    found = {q: dict(hits) for q, hits in open_index(out).search(QUERIES, 10).items() if hits}
    assert found == expected(docs, QUERIES, 3) and len(found) == 3


def test_its_search_flag_is_checked_and_refused_by_other_backends(overlap, runner, corpus_file, queries_file, tmp_path):
    assert runner("index", corpus_file, "--method", "overlap", "-o", tmp_path / "o").exit_code == 0
    bad = runner("search", tmp_path / "o", queries_file, "--boost", 0)
    assert bad.exit_code == 2 and "--boost" in bad.stderr
    assert runner("index", corpus_file, "--method", "bm25", "-o", tmp_path / "b").exit_code == 0
    refused = runner("search", tmp_path / "b", queries_file, "--boost", 2)
    assert refused.exit_code == 2 and "--boost: a bm25 index has no boost" in refused.stderr


def test_its_index_flag_is_checked_from_python_too(overlap, tmp_path):
    from stages.index import SettingsError, index

    with pytest.raises(SettingsError, match="--min-len must be at least 1"):
        index(DOCS, tmp_path / "o", method="overlap", min_len=0)
    with pytest.raises(TypeError, match="no_such_flag"):
        index(DOCS, tmp_path / "o", method="overlap", no_such_flag=1)
