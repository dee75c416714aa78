"""Indexes written by an earlier retrctl (tests/fixtures/compat, written at f32c50e: the versioned layout) open,
search to the run that retrctl wrote from them, and update in place. The flat layout before versions is covered
by test_index_store.py."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from retrctl.indexes import open_index, resolve

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "compat"
KINDS = ["index-bm25", "index-dense"]


def copy(name: str, tmp_path: Path) -> Path:
    """The fixture copied under tmp_path, its manifests naming the copy's model and corpus (the one thing in an
    index that names a machine's paths); nothing else in it is changed."""
    dst = shutil.copytree(FIXTURES / name, tmp_path / name)
    for manifest in [dst / "idx" / "index.json", *(dst / "idx" / "versions").glob("*/index.json")]:
        data = json.loads(manifest.read_text())
        data["source"] = str(dst / "corpus.jsonl")
        if "encoder" in data:
            data["encoder"]["model"] = str(dst / "model")
        manifest.write_text(json.dumps(data, indent=2))
    return dst


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def same_run(got: list[dict], want: list[dict]) -> None:
    assert [(r["query_id"], r["doc_id"], r["rank"]) for r in got] == [(r["query_id"], r["doc_id"], r["rank"]) for r in want]
    assert np.allclose([r["score"] for r in got], [r["score"] for r in want], rtol=0, atol=1e-6)


def queries(where: Path) -> list[dict]:
    return rows(where / "queries.jsonl")


@pytest.mark.parametrize("name", KINDS)
def test_an_index_of_the_previous_commit_searches_to_the_same_run(name, runner, tmp_path):
    where = copy(name, tmp_path)
    r = runner("search", where / "idx", where / "queries.jsonl", "--hits", 5, "-o", tmp_path / "run.jsonl", "--device", "cpu")
    assert r.exit_code == 0, r.stderr
    same_run(rows(tmp_path / "run.jsonl"), rows(where / "expected.jsonl"))


@pytest.mark.parametrize("name", KINDS)
def test_open_index_reads_it_from_its_manifest(name, tmp_path):
    where = copy(name, tmp_path)
    idx = open_index(where / "idx", device="cpu")
    assert idx.name == name.removeprefix("index-") and len(idx) == 6 and idx.version.name == "000001"
    found = idx.search(queries(where), 5)
    got = [{"query_id": q, "doc_id": d, "score": s, "rank": i} for q, ranked in found.items() for i, (d, s) in enumerate(ranked, 1)]
    same_run(got, rows(where / "expected.jsonl"))


@pytest.mark.parametrize("name", KINDS)
def test_an_index_of_the_previous_commit_updates_in_place(name, runner, tmp_path):
    """No flags: the backend and (dense) the encoder come from the old manifest; nothing changed, nothing written."""
    where = copy(name, tmp_path)
    r = runner("index", where / "corpus.jsonl", "-o", where / "idx", "--device", "cpu")
    assert r.exit_code == 0 and "(0 added, 0 updated, 6 unchanged, 0 removed)" in r.stderr, r.stderr
    assert resolve(where / "idx").name == "000001"
    docs = rows(where / "corpus.jsonl")
    (where / "edited.jsonl").write_text("".join(json.dumps(d) + "\n" for d in [{**docs[0], "text": "Cats nap."}, *docs[1:]]))
    r = runner("index", where / "edited.jsonl", "-o", where / "idx", "--device", "cpu")
    assert r.exit_code == 0 and "(0 added, 1 updated, 5 unchanged, 0 removed)" in r.stderr, r.stderr
    assert resolve(where / "idx").name == "000002"
    assert len(open_index(where / "idx", device="cpu").search(queries(where), 5)) == 3
