"""The one resumable batch loop qgen and rerank run (retrctl.llm.resume.resumable): input order whatever
the checkpoint holds, only unfinished items reach the LLM, rows written twice collapse, an item with too few rows
is redone; and through the CLI, an interrupted run resumed (with another batch size, or its input reordered)
writes what an uninterrupted run writes."""

import json
from operator import itemgetter

import pytest
from conftest import DOCS, QUERIES

from retrctl.llm import Checkpoint, resumable

ITEMS = [{"id": c} for c in "abcdef"]
SETTINGS = {"model": "m", "seed": 1}


def work_log(calls: list, fail_on: int | None = None):
    def work(batch):
        calls.append([it["id"] for it in batch])
        if len(calls) == fail_on:
            raise KeyboardInterrupt
        return [{"id": it["id"], "out": it["id"].upper()} for it in batch]

    return work


def run(items, work, cp, batch_size=2, **kw):
    return [(it["id"], [r["out"] for r in rows], resumed)
            for it, rows, resumed in resumable(items, work, key=itemgetter("id"), batch_size=batch_size, checkpoint=cp,
                                               settings=SETTINGS, **kw)]


def test_resumed_items_keep_their_place_and_skip_the_llm(tmp_path):
    path = tmp_path / "c.jsonl"
    calls = []
    with pytest.raises(KeyboardInterrupt):
        run(ITEMS, work_log(calls, fail_on=2), Checkpoint(path))
    assert calls == [["a", "b"], ["c", "d"]]  # a, b checkpointed; c, d lost with the kill
    calls.clear()
    order = [ITEMS[i] for i in (2, 0, 3, 1, 4, 5)]  # c a d b e f: the finished ones in between
    got = run(order, work_log(calls), Checkpoint(path))
    assert [g[0] for g in got] == ["c", "a", "d", "b", "e", "f"]
    assert got == [(x, [x.upper()], x in "ab") for x in "cadbef"]
    assert calls == [["c", "d"], ["e", "f"]]  # the batches hold only unfinished items
    calls.clear()
    assert run(ITEMS, work_log(calls), Checkpoint(path)) == [(x, [x.upper()], True) for x in "abcdef"] and calls == []


def test_without_a_checkpoint_every_item_is_worked_in_batches(tmp_path):
    calls = []
    assert run(ITEMS, work_log(calls), None, batch_size=4) == [(x, [x.upper()], False) for x in "abcdef"]
    assert calls == [["a", "b", "c", "d"], ["e", "f"]]
    with pytest.raises(ValueError, match="batch_size"):
        run(ITEMS, work_log(calls), None, batch_size=0)


def test_several_rows_per_item_duplicates_collapse_and_incomplete_items_are_redone(tmp_path):
    path = tmp_path / "c.jsonl"
    cp = Checkpoint(path)
    cp.resume(SETTINGS)
    # a: complete (one row written twice: a batch redone); b: one of its two rows (the rest torn off)
    cp.append([{"src": "a", "qid": "a0", "out": "a0"}, {"src": "a", "qid": "a1", "out": "a1"},
               {"src": "a", "qid": "a1", "out": "a1"}, {"src": "b", "qid": "b0", "out": "b0"}])
    cp.close()
    calls = []

    def work(batch):
        calls.append([it["id"] for it in batch])
        return [{"src": it["id"], "qid": f"{it['id']}{i}", "out": f"{it['id']}{i}"} for it in batch for i in range(2)]

    got = run(ITEMS[:3], work, Checkpoint(path), batch_size=8, owner=itemgetter("src"), row_id=itemgetter("qid"),
              complete=lambda rows: len(rows) == 2)
    assert got == [("a", ["a0", "a1"], True), ("b", ["b0", "b1"], False), ("c", ["c0", "c1"], False)]
    assert calls == [["b", "c"]]


def test_the_checkpoint_is_closed_however_the_loop_ends(tmp_path):
    cp = Checkpoint(tmp_path / "c.jsonl")
    run(ITEMS, work_log([]), cp)
    assert cp._f is None
    cp = Checkpoint(tmp_path / "d.jsonl")
    with pytest.raises(KeyboardInterrupt):
        run(ITEMS, work_log([], fail_on=2), cp)
    assert cp._f is None
    assert len((tmp_path / "d.jsonl").read_text().splitlines()) == 1 + 2  # header + the first batch


# ---------------------------------------------------------------- through the CLI, with the tiny model


def _interrupt_after(monkeypatch, n_calls: int):
    """Make HFLLM.generate raise KeyboardInterrupt on call n_calls + 1 (a kill mid-run)."""
    from retrctl.llm import HFLLM

    real, calls = HFLLM.generate, []

    def flaky(self, prompts, **kw):
        calls.append(len(prompts))
        if len(calls) == n_calls + 1:
            raise KeyboardInterrupt
        return real(self, prompts, **kw)

    monkeypatch.setattr(HFLLM, "generate", flaky)
    return lambda: monkeypatch.setattr(HFLLM, "generate", real)


def _groups(path, queries):
    """One group per query, each over the docs in another order (so a group given another's result shows)."""
    ids = [d["docid"] for d in DOCS]
    rows = []
    for q in queries:
        k = int(q["query_id"][1:])
        mine = ids[k:] + ids[:k]
        rows.append({"query_id": q["query_id"], "query_text": q["query_text"], "positive_document_ids": mine[:1],
                     "negative_document_ids": mine[1:]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rerank_groups_resumed_with_their_input_reordered_match_an_uninterrupted_run(runner, tiny_llama, corpus_file,
                                                                                   tmp_path, monkeypatch):
    """The old loop yielded a resumed query ahead of the batch still filling, and the command zipped the results
    with the groups in input order: a group got another query's ranking."""
    first = _groups(tmp_path / "groups.jsonl", QUERIES)
    reordered = _groups(tmp_path / "reordered.jsonl", [QUERIES[2], QUERIES[0], QUERIES[1]])
    args = ("--corpus", corpus_file, "--llm", tiny_llama, "--window", 3, "--stride", 2, "--passage-max-words", 4,
            "--template", "rank_llm", "--negative-ranks", "2-4", "--batch-size", 2)
    full = tmp_path / "full.jsonl"
    assert runner("rerank", reordered, *args, "-o", full).exit_code == 0
    out = tmp_path / "out.jsonl"
    restore = _interrupt_after(monkeypatch, 3)  # 6 docs, window 3, stride 2: 3 calls for a batch of 2 queries
    res = runner("rerank", first, *args, "-o", out)
    assert res.exit_code == 130 and not out.exists()
    assert len((tmp_path / "out.jsonl.partial.jsonl").read_text().splitlines()) == 1 + 2
    restore()
    res = runner("rerank", reordered, *args, "-o", out)
    assert res.exit_code == 0, res.stderr
    assert "resumed: 2 of 3 queries" in res.stderr
    assert out.read_text() == full.read_text()
    assert [g["query_id"] for g in map(json.loads, out.read_text().splitlines())] == ["q3", "q1", "q2"]


def test_rerank_run_resumed_in_batches_matches_an_uninterrupted_run(runner, tiny_llama, queries_file, corpus_file,
                                                                     tmp_path, monkeypatch):
    run_file = tmp_path / "run.trec"
    run_file.write_text("".join(f"{q['query_id']} Q0 {d['docid']} {r} {10 - r} bm25\n"
                                for q in QUERIES for r, d in enumerate(DOCS, 1)))
    args = ("rerank", run_file, "--queries", queries_file, "--corpus", corpus_file, "--llm", tiny_llama, "--window", 3,
            "--stride", 2, "--passage-max-words", 4, "--template", "rank_llm", "--batch-size", 2)
    full = tmp_path / "full.trec"
    assert runner(*args, "-o", full).exit_code == 0
    out = tmp_path / "out.trec"
    restore = _interrupt_after(monkeypatch, 3)
    assert runner(*args, "-o", out).exit_code == 130 and not out.exists()
    restore()
    res = runner(*args, "-o", out)
    assert res.exit_code == 0, res.stderr
    assert "resumed: 2 of 3 queries" in res.stderr and out.read_text() == full.read_text()
    assert not (tmp_path / "out.trec.partial.jsonl").exists()


def test_qgen_resumed_with_another_batch_size_matches_an_uninterrupted_run(runner, tiny_llama, corpus_file, tmp_path,
                                                                          monkeypatch):
    args = ("qgen", corpus_file, "--llm", tiny_llama, "--max-new-tokens", 5, "--min-words", 1, "--per-doc", 2, "--seed", 4)
    full = tmp_path / "full.jsonl"
    assert runner(*args, "--batch-size", 4, "-o", full).exit_code == 0
    out = tmp_path / "q.jsonl"
    restore = _interrupt_after(monkeypatch, 1)  # the first batch of 3 docs done, then killed
    assert runner(*args, "--batch-size", 3, "-o", out).exit_code == 130 and not out.exists()
    assert len((tmp_path / "q.jsonl.candidates.jsonl").read_text().splitlines()) == 1 + 3 * 2
    restore()
    res = runner(*args, "--batch-size", 2, "-o", out)
    assert res.exit_code == 0, res.stderr
    assert "resumed: 3 of 6 docs" in res.stderr and out.read_text() == full.read_text()
