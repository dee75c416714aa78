"""stage(): what the wrapper does for every stage: writes="run" and "dir" write atomically (a failing
body leaves the previous output as it was), the body receives its shard as arguments, an Output's manifest and
checkpoints, None writes nothing, and a checkpoint made with other settings is a usage error."""

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from retrctl import records
from retrctl.hashing import in_shard
from retrctl.llm import CheckpointMismatch
from retrctl.stage import Output, stage

QIDS = [f"q{i}" for i in range(12)]


@pytest.fixture
def queries(tmp_path) -> Path:
    path = tmp_path / "queries.jsonl"
    path.write_text("".join(json.dumps({"query_id": q, "query_text": f"text {q}"}) + "\n" for q in QIDS))
    return path


def invoke(cmd, *args):
    return CliRunner().invoke(cmd, [str(a) for a in args])


def run_stage(seen: list):
    """A stage writing one run row per query of its shard; --fail-at N raises after N rows."""

    @stage(reads="query", writes="run")
    @click.option("--fail-at", type=int)
    @click.option("--checkpoint")
    def rank(queries, output, shard_id, shard_num, fail_at, checkpoint):
        seen.append({"output": output, "shard": (shard_id, shard_num)})

        def rows():
            for i, q in enumerate(queries):
                if i == fail_at:
                    raise RuntimeError("boom")
                yield {"query_id": q["query_id"], "doc_id": f"d-{q['query_id']}", "score": 1.0 / (i + 1), "rank": 1}

        return Output(rows(), tag="test-tag", finish=lambda n: {"rows": n}, remove=(checkpoint,) if checkpoint else ())

    return rank


def test_writes_run_writes_trec_its_manifest_and_the_shard_reaches_the_body(queries, tmp_path):
    seen = []
    out = tmp_path / "run.trec"
    res = invoke(run_stage(seen), queries, "-o", out, "--shard-id", 1, "--shard-num", 3)
    assert res.exit_code == 0, res.output
    mine = [q for q in QIDS if in_shard(q, 1, 3)]
    assert 0 < len(mine) < len(QIDS)
    assert seen == [{"output": str(out), "shard": (1, 3)}]
    lines = out.read_text().splitlines()
    assert [line.split()[0] for line in lines] == mine
    assert all(line.split()[1] == "Q0" and line.split()[-1] == "test-tag" for line in lines)
    assert json.loads(Path(f"{out}.manifest.json").read_text())["rows"] == len(mine)
    # the same rows as JSONL, by extension
    jsonl = tmp_path / "run.jsonl"
    assert invoke(run_stage([]), queries, "-o", jsonl).exit_code == 0
    assert [r["query_id"] for _, r in records.read_objects(jsonl)] == QIDS


def test_writes_run_a_failing_body_leaves_the_previous_run_and_its_checkpoint(queries, tmp_path):
    out = tmp_path / "run.trec"
    out.write_text("q0 Q0 old 1 1.000000 before\n")
    manifest = Path(f"{out}.manifest.json")
    manifest.write_text('{"old": true}')
    checkpoint = tmp_path / "run.trec.partial.jsonl"
    checkpoint.write_text("work done so far\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    res = invoke(run_stage([]), queries, "-o", out, "--fail-at", 5, "--checkpoint", checkpoint)
    assert res.exit_code != 0 and isinstance(res.exception, RuntimeError)
    assert out.read_text() == "q0 Q0 old 1 1.000000 before\n" and manifest.read_text() == '{"old": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temp file left, the checkpoint kept
    res = invoke(run_stage([]), queries, "-o", out, "--checkpoint", checkpoint)
    assert res.exit_code == 0, res.output
    assert len(out.read_text().splitlines()) == len(QIDS) and not checkpoint.exists()  # removed once the run is in place


@pytest.mark.parametrize("shard", [("2", "2"), ("5", "3"), ("1-3", "3"), ("2-1", "3"), ("1-", "3"), ("a", "3"), ("-1", "3")])
def test_a_shard_id_out_of_range_exits_2_before_the_body_runs(queries, tmp_path, shard):
    seen = []
    res = invoke(run_stage(seen), queries, "-o", tmp_path / "run.trec", "--shard-id", shard[0], "--shard-num", shard[1])
    assert res.exit_code == 2 and "--shard-id" in res.output and seen == []


def test_a_range_of_shards_reaches_the_body_and_holds_their_records(queries, tmp_path):
    seen = []
    out = tmp_path / "run.trec"
    assert invoke(run_stage(seen), queries, "-o", out, "--shard-id", "1-2", "--shard-num", 4).exit_code == 0
    ranked = {line.split()[0] for line in out.read_text().splitlines()}
    assert ranked == {q for q in QIDS if in_shard(q, 1, 4) or in_shard(q, 2, 4)} and ranked
    assert seen == [{"output": str(out), "shard": (range(1, 3), 4)}]


def test_a_body_that_shards_its_own_input_gets_the_shard_too(tmp_path):
    seen = []

    @stage(writes="query")
    @click.option("--shard-id", type=int, default=0)
    @click.option("--shard-num", type=int, default=1)
    def own(shard_id, shard_num):
        seen.append((shard_id, shard_num))
        return [{"query_id": q, "query_text": q} for q in QIDS if in_shard(q, shard_id, shard_num)]

    out = tmp_path / "q.jsonl"
    assert invoke(own, "--shard-id", 0, "--shard-num", 2, "-o", out).exit_code == 0
    assert seen == [(0, 2)] and [q["query_id"] for q in records.read(out, "query")] == [q for q in QIDS if in_shard(q, 0, 2)]
    assert invoke(own, "--shard-id", 2, "--shard-num", 2, "-o", out).exit_code == 2 and len(seen) == 1


def test_a_body_returning_none_writes_nothing(queries, tmp_path):
    @stage(reads="query", writes="run")
    def dry(queries):
        return None

    out = tmp_path / "run.trec"
    out.write_text("kept\n")
    assert invoke(dry, queries, "-o", out).exit_code == 0
    assert out.read_text() == "kept\n" and not Path(f"{out}.manifest.json").exists()


def test_output_kind_overrides_writes(queries, tmp_path):
    @stage(reads="query", writes="run")
    def groups(queries):
        return Output(({"query_id": q["query_id"], "query_text": q["query_text"], "positive_document_ids": ["d1"],
                        "negative_document_ids": []} for q in queries), kind="group")

    out = tmp_path / "groups.jsonl"
    assert invoke(groups, queries, "-o", out).exit_code == 0
    assert [g["query_id"] for g in records.read(out, "group")] == QIDS


def test_a_checkpoint_made_with_other_settings_is_a_usage_error(tmp_path):
    @stage(writes="query")
    def resumed():
        raise CheckpointMismatch("c.jsonl was made with other settings (differ in: seed)")

    res = invoke(resumed, "-o", tmp_path / "q.jsonl")
    assert res.exit_code == 2 and "differ in: seed" in res.output and not (tmp_path / "q.jsonl").exists()


def dir_stage(seen: list, atomic: bool = True):
    @stage(writes="dir", atomic=atomic)
    @click.option("--fail", is_flag=True)
    def build(output, fail):
        seen.append(output)
        Path(output, "model.txt").write_text("new")
        if fail:
            raise RuntimeError("boom")
        return 1

    return build


def test_writes_dir_builds_beside_and_swaps_in_on_success(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "model.txt").write_text("old")
    (out / "stale.txt").write_text("from the old build")
    seen = []
    res = invoke(dir_stage(seen), "-o", out, "--fail")
    assert res.exit_code != 0 and isinstance(res.exception, RuntimeError)
    assert seen == [str(tmp_path / "model.partial")]
    assert (out / "model.txt").read_text() == "old" and (out / "stale.txt").exists()  # the old directory untouched
    res = invoke(dir_stage(seen), "-o", out)
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["model.txt"] and (out / "model.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no partial or old copy left


def test_writes_dir_not_atomic_hands_the_body_the_directory_as_given(tmp_path):
    out = tmp_path / "index"
    out.mkdir()
    seen = []
    assert invoke(dir_stage(seen, atomic=False), "-o", out).exit_code == 0
    assert seen == [str(out)] and (out / "model.txt").read_text() == "new"
    (tmp_path / "afile").write_text("x")
    with pytest.raises(records.RecordError, match="is a file"):  # refused before the body runs (cli.py exits 2)
        CliRunner().invoke(dir_stage(seen, atomic=False), ["-o", str(tmp_path / "afile")], catch_exceptions=False)


def test_writes_must_name_a_kind():
    with pytest.raises(ValueError, match="writes must be"):
        stage(writes="runs")(lambda: None)


def test_progress_where_stderr_is_a_log_file_is_a_timed_line_and_quiet_is_silent(monkeypatch, caplog):
    """No terminal: the items pass through unchanged, an info line with count, total, rate and time left each time
    PROGRESS_LOG_SECONDS have passed (a fake clock: 25 s an item, a line every 60 s), none with --quiet."""
    from retrctl import stage as stage_mod

    clock = iter(range(0, 10_000, 25))
    monkeypatch.setattr(stage_mod.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(stage_mod.sys.stderr, "isatty", lambda: False, raising=False)
    monkeypatch.setitem(stage_mod.STATE, "quiet", False)
    with caplog.at_level("INFO", logger="retrctl"):
        assert list(stage_mod.progress(range(10), desc="qgen", total=10, unit="doc")) == list(range(10))
    lines = [r.getMessage() for r in caplog.records]
    # items at t = 25, 50, ...: lines at items 3 (75 s) and 6 (150 s) and 9 (225 s); 3 docs in 75 s, 7 left
    assert lines[0] == "qgen: 3 of 10 doc done, 0.04 doc/s, ~3 min left"
    assert len(lines) == 3
    caplog.clear()
    monkeypatch.setitem(stage_mod.STATE, "quiet", True)
    with caplog.at_level("INFO", logger="retrctl"):
        assert list(stage_mod.progress(range(10), desc="qgen", total=10, unit="doc")) == list(range(10))
    assert not caplog.records
