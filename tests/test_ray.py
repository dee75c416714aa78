"""The stages on a loopback Ray cluster (retrctl/distributed.py): the same output as one process, a worker killed
mid-job, the driver killed mid-job, bad input, a hung cluster, stdout kept clean, and the speed-up of two workers.

One cluster for the whole module (started here, shut down at teardown); the CLI runs in this process join it, a
killed driver joins it by address. Threads are pinned to one on both sides (torch.set_num_threads(1) here, one CPU
per worker), so a forward pass gives the same bits here and on a worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import raykit
from conftest import DOCS, QUERIES

ray = pytest.importorskip("ray")

from retrctl import distributed  # noqa: E402
from retrctl.indexes import open_index  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# the loopback cluster runs without token authentication, so a second driver joins it by address alone
ENV = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false", "RAY_AUTH_MODE": "disabled"}
TWO = ("--ray", "local", "--workers", 2, "--worker-cpus", 1)


@pytest.fixture(scope="module")
def cluster():
    """A one-node cluster with more logical CPUs than cores (actors holding every slot would starve Ray's own
    tasks); this module's helpers travel by value, since a worker cannot import a test module."""
    import torch

    threads, auth = torch.get_num_threads(), os.environ.get("RAY_AUTH_MODE")
    torch.set_num_threads(1)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    raykit.init_local()
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        torch.set_num_threads(threads)
        if auth is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = auth


@pytest.fixture
def big_corpus(tmp_path) -> Path:
    """60 docs of varied lengths (padding differs between batches)."""
    p = tmp_path / "corpus60.jsonl"
    with p.open("w") as f:
        for i in range(60):
            base = DOCS[i % len(DOCS)]
            f.write(json.dumps({"docid": f"d{i:03d}", "title": base["title"],
                                "text": " ".join([base["text"]] * (1 + i % 4))}) + "\n")
    return p


def vectors(path) -> tuple[list[str], np.ndarray]:
    idx = open_index(path)
    return idx.docids, idx.vectors()


# ---------------------------------------------------------------- the same output as one process


def test_index_search_mine_match_one_process(cluster, runner, no_dropout_bert, big_corpus, queries_file, tmp_path):
    common = (big_corpus, "--model", no_dropout_bert, "--checkpoint-every", 8, "--batch-size", 4)
    assert runner("index", *common, "-o", tmp_path / "one").exit_code == 0
    res = runner("index", *common, "-o", tmp_path / "two", *TWO)
    assert res.exit_code == 0, res.stderr
    assert "on 2 Ray workers" in res.stderr
    ids, one = vectors(tmp_path / "one")
    ids2, two = vectors(tmp_path / "two")
    assert ids == ids2 and np.array_equal(one, two)

    runs = {}
    for name, extra in (("one", ()), ("two", TWO)):
        res = runner("search", tmp_path / "one", queries_file, "--hits", 5, "-o", tmp_path / f"{name}.trec", *extra)
        assert res.exit_code == 0, res.stderr
        runs[name] = (tmp_path / f"{name}.trec").read_bytes()
    assert runs["one"] == runs["two"] and runs["one"].count(b"\n") == 5 * len(QUERIES)

    groups = {}
    for name, extra in (("one", ()), ("two", TWO)):
        res = runner("mine", queries_file, "--corpus", big_corpus, "--retriever", no_dropout_bert, "--no-cache",
                     "--negative-range", "2-10", "--num-negatives", 3, "--source-positives", "--allow-empty",
                     "--positive-ranks", 1, "-o", tmp_path / f"{name}.groups.jsonl", *extra)
        assert res.exit_code == 0, res.stderr
        groups[name] = (tmp_path / f"{name}.groups.jsonl").read_bytes()
    assert groups["one"] == groups["two"] and groups["one"]


def test_qgen_and_rerank_match_one_process(cluster, runner, tiny_llama, corpus_file, queries_file, tmp_path):
    out = {}
    for name, extra in (("one", ()), ("two", TWO)):
        q = tmp_path / f"{name}.q.jsonl"
        res = runner("qgen", corpus_file, "--llm", tiny_llama, "--max-new-tokens", 5, "--min-words", 1, "--per-doc", 2,
                     "--batch-size", 2, "--seed", 3, "-o", q, *extra)
        assert res.exit_code == 0, res.stderr
        assert res.stdout == ""
        out[name] = q.read_bytes(), (tmp_path / f"{name}.q.jsonl.candidates.jsonl").read_bytes()
    assert out["one"] == out["two"]
    assert out["one"][1].count(b"\n") == 1 + 2 * len(DOCS)

    run = tmp_path / "run.trec"
    run.write_text("".join(f"{q['query_id']} Q0 {d['docid']} {r} {10 - r} bm25\n" for q in QUERIES
                           for r, d in enumerate(DOCS, 1)))
    reranked = {}
    for name, extra in (("one", ()), ("two", TWO)):
        res = runner("rerank", run, "--queries", queries_file, "--corpus", corpus_file, "--llm", tiny_llama,
                     "--window", 3, "--stride", 2, "--passage-max-words", 4, "--template", "rank_llm", "--batch-size", 1,
                     "-o", tmp_path / f"{name}.rr.trec", *extra)
        assert res.exit_code == 0, res.stderr
        reranked[name] = (tmp_path / f"{name}.rr.trec").read_bytes()
    assert reranked["one"] == reranked["two"] and reranked["one"].count(b"\n") == len(QUERIES) * len(DOCS)


# ---------------------------------------------------------------- workers and drivers killed


def _die_at_second_call(calls: int, marker: str) -> int:
    """The count after one more call; the process SIGKILLs itself at the second if ``marker`` does not exist yet
    (it writes its pid there first, so only one worker dies, once)."""
    calls += 1
    if calls == 2 and not os.path.exists(marker):
        Path(marker).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return calls


class KillSecondCall:
    """Wraps an encoder; a worker process dies (SIGKILL) at its second encode if ``marker`` does not exist yet,
    creating it, so exactly one worker is killed once, mid-job."""

    def __init__(self, encoder, marker: str):
        self.encoder, self.marker, self.calls = encoder, marker, 0

    def __getattr__(self, name):
        if name.startswith("__") or name == "encoder":  # unpickling looks these up before ``encoder`` is set
            raise AttributeError(name)
        return getattr(self.encoder, name)

    def encode(self, *args, **kwargs):
        self.calls = _die_at_second_call(self.calls, self.marker)
        return self.encoder.encode(*args, **kwargs)


def test_a_killed_worker_is_restarted_and_nothing_is_lost_or_duplicated(cluster, no_dropout_bert, big_corpus, tmp_path):
    from retrctl import records
    from retrctl.indexes.dense import DenseIndex
    from retrctl.models.runtime import load_encoder

    docs = list(records.read(big_corpus, "doc"))
    plain = DenseIndex(load_encoder(no_dropout_bert), chunk_size=4, batch_size=4)
    plain.build(docs)
    marker = tmp_path / "killed"
    killing = KillSecondCall(load_encoder(no_dropout_bert), str(marker))
    idx = DenseIndex(killing, chunk_size=4, batch_size=4)
    with distributed.workers(distributed.RaySettings("local", workers=2, timeout=300), killing) as pool, idx.on_workers(pool):
        pids = set(ray.get([a.pid.remote() for a in pool.actors]))
        stats = idx.build(docs)
        after = set(ray.get([a.pid.remote() for a in pool.actors]))
    assert marker.exists() and int(marker.read_text()) in pids - after  # one worker died and was replaced
    assert stats["added"] == len(docs) == len(idx) and idx.docids == plain.docids
    assert np.array_equal(idx.vectors(), plain.vectors())


def test_a_killed_driver_resumes_from_its_checkpoints(cluster, runner, no_dropout_bert, big_corpus, tmp_path):
    common = (big_corpus, "--model", no_dropout_bert, "--checkpoint-every", 8, "--batch-size", 4)
    assert runner("index", *common, "-o", tmp_path / "one").exit_code == 0
    idx, count = tmp_path / "idx", tmp_path / "steps"
    # the driver dies at its third np.save: two chunks checkpointed, nothing published
    killed = subprocess.run([sys.executable, str(REPO / "tests" / "killpoint.py"), "np.save:3", str(count), "--",
                             "index", *map(str, common), "-o", str(idx), "--ray", cluster, "--workers", "2"],
                            env=ENV, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(list((tmp_path / "idx.partial").glob("*.json"))) == 2 and not (idx / "index.json").exists()
    res = runner("index", *common, "-o", idx, *TWO)
    assert res.exit_code == 0, res.stderr
    assert "16 came from the checkpoints" in res.stderr
    ids, one = vectors(tmp_path / "one")
    ids2, two = vectors(idx)
    assert ids == ids2 and np.array_equal(one, two)
    assert not (tmp_path / "idx.partial").exists()


class KillSecondGeneration:
    """The LLM a worker holds (llm/remote.py's LoadOnWorker) dying at its second batch, once (``marker``)."""

    def __init__(self, inner, marker: str):
        self.inner, self.marker, self.calls = inner, marker, 0

    def generate(self, *args, **kwargs):
        self.calls = _die_at_second_call(self.calls, self.marker)
        return self.inner.generate(*args, **kwargs)


def test_qgen_survives_a_killed_worker(cluster, tiny_llama, tmp_path):
    from retrctl.llm import Checkpoint, load_llm
    from retrctl.llm.remote import LoadOnWorker, RemoteLLM
    from stages.qgen import qgen

    kw = {"per_doc": 2, "batch_size": 1, "max_new_tokens": 5, "min_words": 1, "seed": 3, "dedupe": False}
    plain = list(qgen(iter(DOCS), load_llm(tiny_llama), checkpoint=Checkpoint(tmp_path / "one.jsonl"), **kw))
    marker = tmp_path / "killed"
    target = KillSecondGeneration(LoadOnWorker(str(tiny_llama), {}), str(marker))
    llm = RemoteLLM(distributed.WorkerPool(distributed.RaySettings("local", workers=2, timeout=300), target),
                    load_llm(tiny_llama, tokenizer_only=True))
    try:
        got = list(qgen(iter(DOCS), llm, checkpoint=Checkpoint(tmp_path / "two.jsonl"), **kw))
    finally:
        llm.close()
    assert marker.exists()
    assert got == plain
    assert (tmp_path / "one.jsonl").read_bytes() == (tmp_path / "two.jsonl").read_bytes()


# ---------------------------------------------------------------- errors


def test_a_bad_record_still_exits_2_naming_file_line_field(cluster, runner, no_dropout_bert, big_corpus, tmp_path):
    lines = big_corpus.read_text().splitlines()
    lines.insert(30, json.dumps({"docid": "broken", "title": 5}))
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    res = runner("index", bad, "--model", no_dropout_bert, "--checkpoint-every", 8, "-o", tmp_path / "idx", *TWO)
    assert res.exit_code == 2, res.stderr
    assert "on 2 Ray workers" in res.stderr and f"{bad}:31" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "idx" / "index.json").exists()


def test_a_hung_cluster_fails_within_the_timeout(cluster, runner, no_dropout_bert, corpus_file, tmp_path):
    t0 = time.monotonic()
    # no node has 64 CPUs: the workers are never placed, no unit ever finishes
    res = runner("index", corpus_file, "--model", no_dropout_bert, "-o", tmp_path / "idx", "--ray", "local",
                 "--worker-cpus", 64, "--ray-timeout", 3)
    assert res.exit_code == 1
    assert "no encode unit finished in" in res.stderr and "--ray-timeout" in res.stderr
    assert time.monotonic() - t0 < 60


# ---------------------------------------------------------------- stdout, throughput


class Sleeper:
    """A slow unit of work: it prints (which must not reach the driver's stdout) and sleeps."""

    def unit(self, i: int, seconds: float) -> int:
        print(f"worker noise {i}")
        time.sleep(seconds)
        return i * i


def _timed(workers: int, units: int, seconds: float) -> tuple[float, list[int]]:
    settings = distributed.RaySettings("local", workers=workers, timeout=300)
    with distributed.WorkerPool(settings, Sleeper()) as pool:
        ray.get([a.pid.remote() for a in pool.actors])  # started: time the units only
        t0 = time.perf_counter()
        got = list(pool.ordered(lambda i: pool.call("unit", i, seconds), range(units)))
        return time.perf_counter() - t0, got


def test_two_workers_are_faster_and_workers_never_write_to_stdout(cluster, capfd):
    one, got1 = _timed(1, 16, 0.25)
    two, got2 = _timed(2, 16, 0.25)
    assert got1 == got2 == [i * i for i in range(16)]
    assert one / two >= 1.6, (one, two)
    time.sleep(2)  # the log monitor forwards workers' lines a moment later
    out, err = capfd.readouterr()
    assert "worker noise" not in out
    assert "worker noise" in err


def test_the_cluster_log_lines_passed_on_leave_out_ray_trains_cleaner_and_the_state_api_noise():
    """What reaches stderr of a batch of a cluster process's lines (as Ray's log monitor hands them over): a worker's
    lines, but not the placement-group cleaner's (its monitor thread's exit traceback) nor the state API's noise."""
    worker = {"pid": 7, "actor_name": "_Worker", "lines": ["worker noise", distributed.LOG_NOISE[0] + " (x)"]}
    assert distributed.shown(worker) == ["worker noise"]
    cleaner = {"pid": 8, "actor_name": "PlacementGroupCleaner",
               "lines": ["Traceback (most recent call last):", '  File "threading.py", line 1045, in _bootstrap_inner']}
    assert distributed.shown(cleaner) == []
    assert distributed.shown({"pid": "raylet", "lines": ["a raylet line"]}) == ["a raylet line"]
