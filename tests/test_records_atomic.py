"""The one atomic-directory helper (records.atomic_dir) and its sweeper (records.sweep_dir).

A failed body leaves the old directory as it was; a successful one replaces it by renames only; a process
killed at any point (real SIGKILL, no cleanup runs) leaves the old or the new directory whole once swept, and
only leftovers that sweep_dir recognises. resume=True (train) keeps ``<path>.partial`` for the next run.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from retrctl import records
from retrctl.records import containers

ROOT = Path(__file__).resolve().parents[1]


def _old(tmp_path, content="old"):
    target = tmp_path / "idx"
    target.mkdir()
    (target / "a").write_text(content)
    (target / "only-old").write_text("x")
    return target


def _names(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir())


def test_failed_body_leaves_old_dir_and_no_temp(tmp_path):
    target = _old(tmp_path)
    with pytest.raises(RuntimeError, match="died"), records.atomic_dir(target, resume=False) as d:
        assert d.parent == tmp_path and d != target and d.name.startswith(".idx.tmp-")
        (d / "a").write_text("new")
        raise RuntimeError("died")
    assert (target / "a").read_text() == "old" and (target / "only-old").exists()
    assert _names(tmp_path) == ["idx"]


def test_success_replaces_the_whole_dir(tmp_path):
    target = _old(tmp_path)
    with records.atomic_dir(target, resume=False) as d:
        (d / "a").write_text("new")
        assert (target / "a").read_text() == "old"  # untouched until the block has finished
    assert sorted(p.name for p in target.iterdir()) == ["a"] and (target / "a").read_text() == "new"
    assert _names(tmp_path) == ["idx"]
    fresh = tmp_path / "sub" / "fresh"  # parents are created
    with records.atomic_dir(fresh, resume=False) as d:
        (d / "b").write_text("1")
    assert (fresh / "b").read_text() == "1" and _names(fresh.parent) == ["fresh"]


def test_resume_mode_keeps_partial_for_the_next_run(tmp_path):
    target = _old(tmp_path)
    with pytest.raises(RuntimeError), records.atomic_dir(target) as d:
        assert d == tmp_path / "idx.partial"
        (d / "checkpoint").write_text("step 2")
        raise RuntimeError("died")
    assert (target / "a").read_text() == "old"
    assert _names(tmp_path) == ["idx", "idx.partial"] and records.sweep_dir(target) == []  # a resume point, not debris
    with records.atomic_dir(target) as d:
        assert (d / "checkpoint").read_text() == "step 2"  # the next run finds it
        (d / "a").write_text("new")
    assert (target / "a").read_text() == "new" and _names(tmp_path) == ["idx"]


def test_failed_second_rename_puts_the_old_dir_back(tmp_path, monkeypatch):
    target = _old(tmp_path)
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == 2:  # old moved aside; the new one fails to move in
            raise OSError("disk gone")
        real(src, dst)

    monkeypatch.setattr(containers.os, "replace", replace)
    with pytest.raises(OSError, match="disk gone"), records.atomic_dir(target, resume=False) as d:
        (d / "a").write_text("new")
    monkeypatch.undo()
    assert calls[0][1].startswith(".idx.old-") and calls[1][1] == "idx"
    assert (target / "a").read_text() == "old" and _names(tmp_path) == ["idx"]


def test_a_first_build_published_by_another_meanwhile_is_replaced_whole(tmp_path, monkeypatch):
    """Two first builds at once: the other's directory appears at -o between this one's check and its rename."""
    target, real, published = tmp_path / "idx", os.replace, []

    def replace(src, dst):
        if Path(dst) == target and not published:
            published.append(dst)
            target.mkdir()
            (target / "a").write_text("theirs")
        real(src, dst)

    monkeypatch.setattr(containers.os, "replace", replace)
    with records.atomic_dir(target, resume=False) as d:
        (d / "a").write_text("new")
    monkeypatch.undo()
    assert (target / "a").read_text() == "new" and _names(tmp_path) == ["idx"]


def test_an_index_moved_away_by_another_meanwhile_is_not_an_error(tmp_path, monkeypatch):
    """Another writer's swap renames -o aside between this one's check and its own rename of -o aside."""
    target, real = _old(tmp_path), os.replace
    theirs = tmp_path / ".idx.old-1"

    def replace(src, dst):
        if Path(src) == target and target.exists() and not theirs.exists():
            real(target, theirs)
        real(src, dst)

    monkeypatch.setattr(containers.os, "replace", replace)
    with records.atomic_dir(target, resume=False) as d:
        (d / "a").write_text("new")
    monkeypatch.undo()
    assert (target / "a").read_text() == "new" and _names(tmp_path) == [".idx.old-1", "idx"]


# ---------------------------------------------------------------- killed processes

KILLER = """
import os, shutil, signal, sys
from pathlib import Path
from retrctl import records

target, n, resume = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
steps = [0]

def step(fn):
    def wrapped(*a, **kw):
        steps[0] += 1
        if steps[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(*a, **kw)
    return wrapped

os.replace, shutil.rmtree = step(os.replace), step(shutil.rmtree)
with records.atomic_dir(target, resume=resume) as d:
    (d / "a").write_text("new")
    if n == -1:  # killed mid-write, inside the body
        os.kill(os.getpid(), signal.SIGKILL)
print(steps[0])
"""


def _killed_at(target: Path, n: int, resume: bool) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", KILLER, str(target), str(n), "1" if resume else "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_kill_mid_write_leaves_only_a_sweepable_temp(tmp_path):
    target = _old(tmp_path)
    done = _killed_at(target, -1, resume=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert (target / "a").read_text() == "old"
    left = [n for n in _names(tmp_path) if n != "idx"]
    assert len(left) == 1 and left[0].startswith(".idx.tmp-"), left
    assert [p.name for p in records.sweep_dir(target)] == left
    assert _names(tmp_path) == ["idx"] and (target / "a").read_text() == "old"


def test_next_write_sweeps_what_a_killed_one_left(tmp_path):
    target = _old(tmp_path)
    assert _killed_at(target, -1, resume=False).returncode == -signal.SIGKILL
    with records.atomic_dir(target, resume=False) as d:
        (d / "a").write_text("newer")
    assert _names(tmp_path) == ["idx"] and (target / "a").read_text() == "newer"


def test_sweep_spares_a_live_writers_temp(tmp_path):
    target = _old(tmp_path)
    mine = tmp_path / f".idx.tmp-{os.getpid()}-abc"
    mine.mkdir()
    other = tmp_path / ".other.tmp-999999999-abc"  # another directory's: not ours to judge
    other.mkdir()
    assert records.sweep_dir(target) == [] and mine.is_dir() and other.is_dir()


@pytest.mark.parametrize("resume", [False, True], ids=["private-temp", "partial"])
@pytest.mark.parametrize("existing", [True, False], ids=["replace", "create"])
def test_kill_at_every_step_of_the_swap_leaves_old_or_new_whole(tmp_path, resume, existing):
    probe = tmp_path / "probe"
    probe.mkdir()
    count = _killed_at(_old(probe) if existing else probe / "idx", 0, resume)  # n=0: no kill; prints the steps
    assert count.returncode == 0, count.stderr
    steps = int(count.stdout)
    assert steps >= (3 if existing else 1)
    for n in range(1, steps + 1):
        base = tmp_path / f"k{n}"
        base.mkdir()
        target = _old(base) if existing else base / "idx"
        done = _killed_at(target, n, resume)
        assert done.returncode == -signal.SIGKILL, (n, done.stderr)
        records.sweep_dir(target)
        kept = ["idx", "idx.partial"] if resume else ["idx"]
        names = _names(base)
        assert set(names) <= set(kept), (n, names)
        if (target / "a").exists():
            content = (target / "a").read_text()
            assert content in ("old", "new"), (n, content)
            # whole: the old one with all its files, or the new one with only its own
            assert sorted(p.name for p in target.iterdir()) == (["a", "only-old"] if content == "old" else ["a"]), n
        else:
            assert not existing and not target.exists(), n  # a first build killed before its rename: nothing there


# ---------------------------------------------------------------- the one atomic-file helper (records.atomic_path)


def test_atomic_path_renames_on_success_and_names_its_temp_for_sweeps(tmp_path):
    target = tmp_path / "sub" / "index.json"
    with records.atomic_path(target, suffix=".gz") as tmp:
        assert Path(tmp).parent == target.parent and Path(tmp).name.endswith(".tmp.gz")
        assert records.temp_target(Path(tmp).name) == "index.json" and not target.exists()
        Path(tmp).write_text("new")
    assert target.read_text() == "new" and sorted(p.name for p in target.parent.iterdir()) == ["index.json"]
    with pytest.raises(RuntimeError), records.atomic_path(target, durable=True) as tmp:
        Path(tmp).write_text("half")
        raise RuntimeError("died")
    assert target.read_text() == "new" and sorted(p.name for p in target.parent.iterdir()) == ["index.json"]
    with records.atomic_path(target, durable=True) as tmp:
        Path(tmp).write_text("durable")
    assert target.read_text() == "durable"
    assert records.temp_target("index.json") is None and records.temp_target(".index.json") is None


def test_outputs_get_the_mode_a_plain_write_gives_not_a_private_one(tmp_path):
    """A temporary file or dir is private by tempfile's default; the output renamed from it is for others to read
    as much as a file written in place would be (an index's pointer, a shared model cache)."""
    old = os.umask(0o022)
    try:
        plain = tmp_path / "plain"
        plain.write_text("x")
        (tmp_path / "plain-dir").mkdir()
        with records.atomic_path(tmp_path / "f") as tmp:
            Path(tmp).write_text("x")
        with records.atomic_dir(tmp_path / "d", resume=False) as d:
            (d / "a").write_text("x")
    finally:
        os.umask(old)
    assert (tmp_path / "f").stat().st_mode & 0o777 == plain.stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "d").stat().st_mode & 0o777 == (tmp_path / "plain-dir").stat().st_mode & 0o777 == 0o755
