"""The index store (retrctl/indexes/store.py) keeps an index safe: -o recognised positively, versions + one atomic
pointer (readers never see a mix), the writer lock (exit 75), kill -9 at every step of an update, damaged files
named, the flat layout of earlier retrctl still opens and updates."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import DOCS, QUERIES

from retrctl.indexes import BM25Index, DenseIndex, open_index, resolve, store
from retrctl.records import BusyError, RecordError
from stages.index import index

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false"}


def write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def tree(root):
    """{relative path: bytes} of every file under root (the lock file's record left out)."""
    root = Path(root)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != store.LOCK}


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "retrctl", *map(str, args)], env=ENV, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def same(a, b):
    """Same docids in the same order, scores equal up to float noise (re-encoding in other batches)."""
    assert {q: [d for d, _ in r] for q, r in a.items()} == {q: [d for d, _ in r] for q, r in b.items()}
    for q in a:
        assert [s for _, s in a[q]] == pytest.approx([s for _, s in b[q]], abs=1e-5)


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def version_docs(i, n=None):
    """Version i's corpus: its own docids (v<i>-<j>), every doc containing 'marker'."""
    n = n or 3 + i % 4
    return [{"docid": f"v{i}-{j}", "title": "", "text": f"marker word{j} version{i}"} for j in range(n)]


# ---------------------------------------------------------------- -o is recognised positively (12.1, 12.12)


def test_a_project_dir_holding_an_index_json_is_refused_untouched(runner, corpus_file, tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "index.json").write_text('{"name": "my web site"}')
    (proj / "notes.txt").write_text("mine")
    before = tree(proj)
    r = runner("index", corpus_file, "--method", "bm25", "-o", proj)
    assert r.exit_code == 2 and "not an index" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert tree(proj) == before and sorted(p.name for p in proj.iterdir()) == ["index.json", "notes.txt"]


def test_an_index_with_a_foreign_file_in_it_is_refused(runner, corpus_file, tmp_path):
    out = tmp_path / "idx"
    assert runner("index", corpus_file, "--method", "bm25", "-o", out).exit_code == 0
    (out / "report.pdf").write_text("not ours")
    before = tree(out)
    r = runner("index", corpus_file, "--method", "bm25", "--rebuild", "-o", out)
    assert r.exit_code == 2 and "report.pdf" in r.stderr
    assert tree(out) == before


def test_a_flat_manifest_with_foreign_files_is_refused(tmp_path):
    idx = BM25Index()
    idx.build(DOCS)
    old = tmp_path / "old"
    old.mkdir()
    idx.write_files(old)
    (old / "other-tool.db").write_text("x")
    with pytest.raises(RecordError, match="other-tool.db"):
        index(DOCS, old, method="bm25", rebuild=True)
    assert (old / "other-tool.db").exists() and not (old / "versions").exists()


@pytest.mark.parametrize("target", ["file", "root", "dangling"])
def test_obviously_wrong_targets_exit_2(runner, corpus_file, tmp_path, target):
    if target == "file":
        out = tmp_path / "notes.txt"
        out.write_text("keep me")
    elif target == "root":
        out = Path("/")
    else:
        out = tmp_path / "link"
        out.symlink_to(tmp_path / "nowhere")
    r = runner("index", corpus_file, "--method", "bm25", "-o", out)
    assert r.exit_code == 2 and "not" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    if target == "file":
        assert out.read_text() == "keep me"


def test_an_empty_existing_dir_is_fine(runner, corpus_file, tmp_path):
    (tmp_path / "empty").mkdir()
    assert runner("index", corpus_file, "--method", "bm25", "-o", tmp_path / "empty").exit_code == 0
    assert len(open_index(tmp_path / "empty")) == len(DOCS)


# ---------------------------------------------------------------- versions, pointer, --keep (12.4)


def test_versions_are_immutable_and_old_ones_go_after_keep_newer(tmp_path):
    out = tmp_path / "idx"
    index(version_docs(1), out, method="bm25")
    v1 = tree(out / "versions" / "000001")
    index(version_docs(2), out)
    assert tree(out / "versions" / "000001") == v1  # an update never touches a published version
    assert resolve(out).name == "000002" and sorted(p.name for p in (out / "versions").iterdir()) == ["000001", "000002"]
    index(version_docs(3), out)  # 000001 now has 2 newer versions: deleted
    assert sorted(p.name for p in (out / "versions").iterdir()) == ["000002", "000003"]
    index(version_docs(4), out, keep=3)
    assert sorted(p.name for p in (out / "versions").iterdir()) == ["000002", "000003", "000004"]
    index(version_docs(5), out, keep=1)
    assert sorted(p.name for p in (out / "versions").iterdir()) == ["000005"]
    # a version dir is itself a complete index, and the pointer carries a copy of its manifest
    assert set(open_index(out / "versions" / "000005").docids) == {d["docid"] for d in version_docs(5)}
    pointer = json.loads((out / "index.json").read_text())
    assert pointer["format"] == "retrctl-index" and pointer["current"] == "000005" and pointer["doc_count"] == len(version_docs(5))


def test_cli_keep_flag(runner, tmp_path):
    out = tmp_path / "idx"
    for i in range(1, 5):
        c = write_jsonl(tmp_path / "c.jsonl", version_docs(i))
        assert runner("index", c, "--method", "bm25", "--keep", 3, "-o", out).exit_code == 0
    assert sorted(p.name for p in (out / "versions").iterdir()) == ["000002", "000003", "000004"]
    assert runner("index", c, "--keep", 0, "-o", out).exit_code == 2


READER = r"""
import json, sys, time
from pathlib import Path
from retrctl.indexes import open_index
from retrctl.indexes.dense import DenseIndex
root, stop, log, model = Path(sys.argv[1]), Path(sys.argv[2]), open(sys.argv[3], "w"), sys.argv[4]
enc = None
if model != "-":
    from retrctl.models import Encoder
    enc = Encoder.load(model, device="cpu")
q = [{"query_id": "q", "query_text": "marker"}]
while not stop.exists():
    try:
        idx = open_index(root, encoder=enc) if enc is not None else open_index(root)
        ids = sorted(d for d, _ in idx.search(q, 1000)["q"])
        log.write(json.dumps({"ok": ids, "version": idx.version.name}) + "\n")
    except Exception as e:
        log.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
    log.flush()
"""


@pytest.mark.parametrize("method", ["bm25", "dense"])
def test_readers_during_many_updates_see_exactly_one_version(method, tiny_bert, tmp_path):
    """A search loop in another process while 15 updates publish: no error, every result is one version's corpus."""
    out, stop, log = tmp_path / "idx", tmp_path / "stop", tmp_path / "reads.jsonl"
    kw = {"method": "bm25"} if method == "bm25" else {"model": str(tiny_bert)}
    index(version_docs(0), out, **kw)
    reader = subprocess.Popen([sys.executable, "-c", READER, out, stop, log, tiny_bert if method == "dense" else "-"],
                              env=ENV, cwd=REPO)
    try:
        deadline = time.time() + 120
        while (not log.exists() or not log.read_text()) and time.time() < deadline:  # the reader is reading
            time.sleep(0.05)
        for i in range(1, 16):
            index(version_docs(i), out, keep=1 if i % 2 else 2)  # keep=1 too: the previous version goes at once
    finally:
        stop.touch()
        reader.wait(60)
    reads = [json.loads(line) for line in log.read_text().splitlines()]
    errors = [r["error"] for r in reads if "error" in r]
    assert not errors, errors[:3]
    corpora = {tuple(sorted(d["docid"] for d in version_docs(i))) for i in range(16)}
    seen = {tuple(r["ok"]) for r in reads}
    assert seen <= corpora  # every result set is exactly one version's docs, never a mix
    assert len(reads) >= 10 and len(seen) >= 2, (len(reads), len(seen))


def test_cli_searches_during_updates_all_succeed(tmp_path):
    """The issue's probe: `retrctl search` processes while updates publish (1 in 40 exited 1 before versions)."""
    import threading

    out = tmp_path / "idx"
    index(version_docs(0), out, method="bm25")
    q = write_jsonl(tmp_path / "q.jsonl", [{"query_id": "q", "query_text": "marker"}])
    stop = threading.Event()

    published = [0]

    def updates():
        while not stop.is_set():
            index(version_docs(published[0] + 1), out, keep=1)
            published[0] += 1

    t = threading.Thread(target=updates)
    t.start()
    try:
        runs = [cli("search", out, q, "--output-format", "jsonl") for _ in range(8)]
    finally:
        stop.set()
        t.join()
    corpora = [{d["docid"] for d in version_docs(i)} for i in range(published[0] + 1)]  # every version published
    for r in runs:
        assert r.returncode == 0, r.stderr
        assert {json.loads(line)["doc_id"] for line in r.stdout.splitlines()} in corpora


# ---------------------------------------------------------------- the lock (12.9)


HOLDER = r"""
import sys, time
from retrctl.indexes import store
with store.writer(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_second_writer_exits_75_naming_the_holder_then_takes_over_a_stale_lock(runner, corpus_file, tmp_path):
    out = tmp_path / "idx"
    assert runner("index", corpus_file, "--method", "bm25", "-o", out).exit_code == 0
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, out], env=ENV, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = tree(out)
        r = runner("index", corpus_file, "--method", "bm25", "--rebuild", "-o", out)
        assert r.exit_code == 75, r.stderr
        assert f"pid {holder.pid}" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert tree(out) == before
        with pytest.raises(BusyError, match=str(holder.pid)):
            index(DOCS, out, rebuild=True)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    r = runner("index", corpus_file, "--method", "bm25", "--rebuild", "-o", out)
    assert r.exit_code == 0 and f"stale lock of pid {holder.pid}" in r.stderr, r.stderr
    assert resolve(out).name == "000002"
    # released cleanly: the next run takes it without a warning
    r = runner("index", corpus_file, "--method", "bm25", "--rebuild", "-o", out)
    assert r.exit_code == 0 and "stale" not in r.stderr


def test_a_second_writer_thread_in_the_same_process_is_refused(tmp_path):
    import threading

    out, inside, release = tmp_path / "idx", threading.Event(), threading.Event()

    def slow_docs():
        yield DOCS[0]
        inside.set()
        release.wait(30)
        yield from DOCS[1:]

    t = threading.Thread(target=index, args=(slow_docs(), out), kwargs={"method": "bm25"})
    t.start()
    try:
        assert inside.wait(30)
        with pytest.raises(BusyError, match=f"pid {os.getpid()}"):
            index(DOCS, out, method="bm25")
    finally:
        release.set()
        t.join()
    assert len(open_index(out)) == len(DOCS)


def test_two_concurrent_cli_writers_one_waits_out_with_75(tmp_path):
    docs = version_docs(1, n=3000)
    c = write_jsonl(tmp_path / "c.jsonl", docs)
    out = tmp_path / "idx"
    procs = [subprocess.Popen([sys.executable, "-m", "retrctl", "index", str(c), "--method", "bm25", "-o", str(out)],
                              env=ENV, cwd=REPO, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [(p.wait(120), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes[0] == 0 and set(codes) <= {0, 75}, results
    for rc, err in results:
        if rc == 75:
            assert "being written by another" in err and "pid " in err
    assert len(open_index(out)) == len(docs)


def test_cron_example_skips_quietly_when_busy(tmp_path):
    out = tmp_path / "idx"
    c = write_jsonl(tmp_path / "c.jsonl", DOCS)
    script = REPO / "examples" / "cron" / "reindex.sh"
    env = {**ENV, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # bin/retrctl runs python3
    r = subprocess.run(["bash", script, c, out, "bm25"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and len(open_index(out)) == len(DOCS), r.stderr
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, out], env=ENV, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = subprocess.run(["bash", script, c, out, "bm25"], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "skipping" in r.stderr, r.stderr
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------- kill -9 at every step of an update (12.5)


def killed_run(n, countfile, *args):
    return subprocess.run([sys.executable, str(REPO / "tests" / "killpoint.py"), str(n), str(countfile), "--", *map(str, args)],
                          env=ENV, cwd=REPO, capture_output=True, text=True, timeout=300)


def search_all(path):
    idx = open_index(path)
    return {q: [d for d, _ in r] for q, r in idx.search(QUERIES + [{"query_id": "m", "query_text": "marker cats"}], 100).items()}


def kill_matrix(method, tiny_bert, tmp_path, sample):
    """Build v1; then update to v2 with a SIGKILL at step n: the index still answers as v1 or v2, a plain rerun
    finishes, and the final files equal a clean update's byte for byte."""
    flags = ["--method", "bm25"] if method == "bm25" else ["--model", tiny_bert, "--checkpoint-every", 2]
    c1 = write_jsonl(tmp_path / "c1.jsonl", DOCS)
    c2 = tmp_path / "c2.jsonl"
    new_docs = [{**DOCS[0], "text": "Cats changed their minds."}, *DOCS[2:], *version_docs(7, n=5)]
    base = tmp_path / "base"
    assert cli("index", c1, *flags, "-o", base).returncode == 0
    ref = tmp_path / "ref"
    shutil.copytree(base, ref)
    write_jsonl(c2, new_docs)
    count = tmp_path / "count"
    r = killed_run(0, count, "index", c2, *flags, "-o", ref)
    assert r.returncode == 0, r.stderr
    steps = int(count.read_text())
    want_old, want_new = search_all(base), search_all(ref)
    final = tree(resolve(ref).path)
    points = sample(range(1, steps + 1))
    for n in points:
        work = tmp_path / f"k{n}"
        shutil.copytree(base, work)
        r = killed_run(n, count, "index", c2, *flags, "-o", work)
        assert r.returncode == -signal.SIGKILL, (n, r.returncode, r.stderr)
        got = search_all(work)  # the killed update left a searchable index: the old one or the new one
        assert got in (want_old, want_new), n
        r = cli("index", c2, *flags, "-o", work)
        assert r.returncode == 0, (n, r.stderr)
        assert search_all(work) == want_new, n
        assert tree(resolve(work).path) == final, n
        assert not [p for p in (work / "versions").iterdir() if p.name.startswith(".")], n
        assert not (tmp_path / f"k{n}.partial").exists()
        shutil.rmtree(work)
    return steps, points


@pytest.mark.parametrize("method", ["bm25", "dense"])
def test_kill_9_at_random_steps_of_an_update_then_rerun(method, tiny_bert, tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    n = 4 if method == "bm25" else 3
    steps, points = kill_matrix(method, tiny_bert, tmp_path, lambda r: sorted(rng.sample(list(r), min(n, len(r)))))
    assert steps > 8 and points, (seed, steps)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["bm25", "dense"])
def test_kill_9_at_every_step_of_an_update_then_rerun(method, tiny_bert, tmp_path):
    kill_matrix(method, tiny_bert, tmp_path, list)


def test_kill_9_during_a_dense_build_resumes_from_checkpoints(tiny_bert, tmp_path):
    """--checkpoint-every 3 on 30 docs; SIGKILL while the 4th chunk is saved: nothing at -o; the rerun encodes only
    the rest."""
    docs = version_docs(3, n=30)
    c = write_jsonl(tmp_path / "c.jsonl", docs)
    out, count = tmp_path / "idx", tmp_path / "count"
    flags = ["--model", tiny_bert, "--checkpoint-every", 3, "-o"]
    r = killed_run("np.save:4", count, "index", c, *flags, out)  # saving chunk 3: chunks 0-2 are complete on disk
    assert r.returncode == -signal.SIGKILL
    assert len(list((tmp_path / "idx.partial").glob("*.json"))) == 3
    assert not out.exists()  # a killed first build leaves nothing at -o: make does not take it for a finished target
    assert [p.name for p in tmp_path.glob(".idx.tmp-*")]  # its work dir, beside
    r = cli("index", c, *flags, out)
    assert r.returncode == 0, r.stderr
    assert "encoded 21 docs; 9 came from the checkpoints" in r.stderr
    assert not (tmp_path / "idx.partial").exists() and not list(tmp_path.glob(".idx.*"))  # the leftover swept
    assert cli("index", c, *flags, tmp_path / "clean").returncode == 0
    assert tree(resolve(out).path) == tree(resolve(tmp_path / "clean").path)


# ---------------------------------------------------------------- the flat layout of earlier retrctl


def old_layout(idx, path):
    """An index as retrctl before versions wrote it: the backend's files straight in the directory."""
    path.mkdir()
    idx.write_files(path)
    return path


@pytest.mark.parametrize("kind", ["bm25", "Flat"])
def test_a_flat_index_of_earlier_retrctl_opens_searches_and_updates(kind, tiny_bert, runner, tmp_path):
    from retrctl.models import Encoder

    if kind == "bm25":
        idx, flags = BM25Index(), []
    else:
        idx, flags = DenseIndex(Encoder.load(tiny_bert, device="cpu")), []
    idx.build(DOCS)
    old = old_layout(idx, tmp_path / "old")
    files = {p.name for p in old.iterdir()}
    assert "index.json" in files and not (old / "versions").exists()
    assert json.loads((old / "index.json").read_text())["format_version"] == 1
    before = idx.search(QUERIES, 4)
    assert open_index(old).search(QUERIES, 4) == before
    q = write_jsonl(tmp_path / "q.jsonl", QUERIES)
    r = runner("search", old, q, "--hits", 3)
    assert r.exit_code == 0 and len(r.stdout.splitlines()) >= 3, r.stderr
    # update: converted to versions, the flat files stay until `keep` newer versions exist
    edited = [{**DOCS[0], "text": "Cats changed."}, *DOCS[2:]]
    c = write_jsonl(tmp_path / "c.jsonl", edited)
    r = runner("index", c, *flags, "-o", old)
    assert r.exit_code == 0 and "(0 added, 1 updated, 4 unchanged, 1 removed)" in r.stderr, r.stderr
    assert resolve(old).name == "000001" and files <= {p.name for p in old.iterdir()}
    fresh = tmp_path / "fresh"
    r = runner("index", c, *(["--method", "bm25"] if kind == "bm25" else ["--model", tiny_bert]), "-o", fresh)
    assert r.exit_code == 0
    same(open_index(old).search(QUERIES, 4), open_index(fresh).search(QUERIES, 4))
    assert runner("index", write_jsonl(c, DOCS), "-o", old).exit_code == 0
    assert {p.name for p in old.iterdir()} == {"index.json", "index.lock", "versions"}  # flat files gone now
    same(open_index(old).search(QUERIES, 4), before)


def test_leftovers_of_the_old_swap_are_swept_and_a_missing_index_restored(tmp_path):
    idx = BM25Index()
    idx.build(DOCS)
    pid = dead_pid()
    # a kill between the old swap's two renames: IDX gone, the index at .IDX.old-<pid>, the new one at .IDX.tmp-<pid>
    old_layout(idx, tmp_path / f".idx.old-{pid}")
    old_layout(idx, tmp_path / f".idx.tmp-{pid}")
    live = tmp_path / f".idx.tmp-{os.getpid()}"  # a live process's: not ours to take
    live.mkdir()
    stats = index(DOCS[:4], tmp_path / "idx", method="bm25")
    assert stats["removed"] == 2 and not stats["rebuilt"]  # the restored index was updated, not rebuilt
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["idx", live.name])


def test_leftovers_of_a_killed_writer_inside_the_index_are_swept(tmp_path):
    out = tmp_path / "idx"
    index(DOCS, out, method="bm25")
    pid = dead_pid()
    (out / "versions" / f".000002.tmp-{pid}").mkdir()
    (out / "versions" / "000005").mkdir()  # written but never published
    (out / f".index.json.tmp-{pid}").write_text("{")  # an earlier retrctl's name for the pointer's temporary file
    (out / ".index.json.k3x_9a2b.tmp").write_text("{")  # records.atomic_path's
    assert open_index(out).search(QUERIES, 2)  # readers do not care
    index(DOCS[:3], out)
    assert sorted(p.name for p in out.iterdir()) == ["index.json", "index.lock", "versions"]
    assert sorted(p.name for p in (out / "versions").iterdir()) == ["000001", "000002"]


# ---------------------------------------------------------------- damaged files (12.12)


def damage(path, how):
    if how == "missing":
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    else:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("kind, file, how", [
    ("Flat", "docids.parquet", "missing"),
    ("Flat", "docids.parquet", "truncated"),
    ("Flat", "index.faiss", "truncated"),
    ("Flat", "index.faiss", "missing"),
    ("IVF2,PQ4x4", "vectors.npy", "truncated"),
    ("bm25", "bm25s/data.csc.index.npy", "truncated"),
    ("bm25", "bm25s/vocab.index.json", "missing"),
    ("bm25", "bm25s/params.index.json", "missing"),
    ("bm25", "tokens.npy", "missing"),
    ("bm25", "bm25s", "missing"),
])
def test_damaged_index_files_exit_2_naming_the_file(kind, file, how, tiny_bert, runner, queries_file, tmp_path):
    from conftest import DOCS as D

    out = tmp_path / "idx"
    if kind == "bm25":
        index(D, out, method="bm25")
    else:
        docs = D + [{"docid": f"s{i}", "title": "", "text": f"word{i} filler text {i % 5}"} for i in range(40)]
        index(docs, out, model=str(tiny_bert), index_type=kind)
    damage(resolve(out).path / file, how)
    r = runner("search", out, queries_file)
    assert r.exit_code == 2, r.stderr
    line = r.stderr.strip().splitlines()
    assert len(line) == 1 and Path(file).name in line[0] and "--rebuild" in line[0], r.stderr
    assert r.stdout == ""
    # the update refuses the same way; --rebuild repairs it
    same_settings = [] if kind == "bm25" else ["--index-type", kind]
    r = runner("index", "-", *same_settings, "-o", out, input="".join(json.dumps(d) + "\n" for d in D))
    assert r.exit_code == 2 and Path(file).name in r.stderr, r.stderr
    flags = ["--method", "bm25"] if kind == "bm25" else ["--model", tiny_bert]
    r = runner("index", "-", *flags, "--rebuild", "-o", out, input="".join(json.dumps(d) + "\n" for d in D))
    assert r.exit_code == 0, r.stderr
    assert runner("search", out, queries_file).exit_code == 0


def test_a_pointer_to_a_missing_version_exits_2(runner, corpus_file, queries_file, tmp_path):
    out = tmp_path / "idx"
    index(DOCS, out, method="bm25")
    shutil.rmtree(out / "versions" / "000001")
    r = runner("search", out, queries_file)
    assert r.exit_code == 2 and "000001" in r.stderr and "--rebuild" in r.stderr
    assert runner("index", corpus_file, "--method", "bm25", "--rebuild", "-o", out).exit_code == 0


# ---------------------------------------------------------------- search flags


@pytest.mark.parametrize("hits", ["0", "-5", "x"])
def test_search_hits_must_be_positive(hits, runner, queries_file, tmp_path):
    index(DOCS, tmp_path / "idx", method="bm25")
    r = runner("search", tmp_path / "idx", queries_file, "--hits", hits)
    assert r.exit_code == 2 and "--hits" in r.stderr and r.stdout == ""


def test_search_output_onto_a_directory_exits_2(runner, queries_file, tmp_path):
    index(DOCS, tmp_path / "idx", method="bm25")
    (tmp_path / "runs").mkdir()
    r = runner("search", tmp_path / "idx", queries_file, "-o", tmp_path / "runs")
    assert r.exit_code == 2 and "is a directory" in r.stderr
    assert list((tmp_path / "runs").iterdir()) == []


def test_mine_cache_is_versioned_and_keeps_one_version(tiny_bert, monkeypatch, tmp_path):
    from retrctl.retrievers import IndexRetriever, dense_index, open_retriever

    monkeypatch.setenv("RETRCTL_CACHE", str(tmp_path / "cache"))
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    docs = {d["docid"]: d for d in DOCS}
    dense_index(str(tiny_bert), docs, str(corpus), device="cpu")
    docs["d1"] = {**docs["d1"], "text": "changed"}
    again = dense_index(str(tiny_bert), docs, str(corpus), device="cpu")
    assert again.encoded == 1
    (where,) = [p for p in (tmp_path / "cache" / "mine").iterdir() if p.is_dir() and not p.name.endswith(".work")]
    assert resolve(where).name == "000002" and [p.name for p in (where / "versions").iterdir()] == ["000002"]
    # an index dir given as --retriever is opened through the pointer too
    r = open_retriever(str(where), model=None, docs={}, corpus_path=None)
    assert isinstance(r, IndexRetriever) and len(r.index) == len(DOCS)
