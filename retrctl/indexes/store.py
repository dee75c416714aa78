"""The index directory on disk: immutable versions, one atomic pointer, a writer lock.

Layout of an index directory IDX::

    IDX/index.json          the pointer: {"format": "retrctl-index", "format_version": 2, "current": "000007",
                            ...a copy of that version's manifest}; replaced with os.replace, never edited
    IDX/versions/000007/    a complete index (index.json + the backend's files), never changed once named
    IDX/versions/000006/    the previous one, kept for readers that resolved it just before the switch
    IDX/index.lock          the writer lock (fcntl.flock) with the holder's pid

A reader resolves the pointer once (``resolve``: one read of IDX/index.json) and reads only from that version
directory, so an update running at the same time can never mix two versions into one reader. A writer builds
``versions/.N.tmp-<pid>``, renames it to ``versions/N`` and then replaces the pointer: the pointer switch is the one
atomic step, and a kill at any point leaves the previous version current and searchable. A new index is built whole in a private
sibling (``.IDX.tmp-<pid>-…``) and renamed to IDX when it is complete, so a killed first build leaves no IDX at
all (make and other file-target tools see no finished target). Leftovers of dead writers (temp versions,
versions written but never published, the old swap's ``.IDX.tmp-<pid>``/``.IDX.old-<pid>`` siblings) are swept
by the next writer.

``--keep N``: a version is deleted once N newer versions have been published (default 2: the superseded version
survives one whole further update, so a reader that resolved it just before a switch is not pulled from under
it; on POSIX files a reader already opened — faiss and Parquet are read whole, bm25s arrays mmapped — stay
readable even after deletion, so the window that matters is only a reader's open).

The flat layout written by earlier retrctl (IDX/index.json + files, no pointer) still opens as a version living in
IDX itself; its first update publishes versions/000001, and its files go like any old version's.

An existing IDX is written only when it is recognisably a retrctl index (``check_target``): a pointer with the
format marker, or a flat manifest of a known backend, and no file that retrctl did not put there; anything else
(a project dir, another tool's output, a regular file, ``/``) is refused before anything is touched (12.1, 12.12).

Lock (12.9): ``writer(IDX)`` holds ``fcntl.flock`` on IDX/index.lock for the whole update (read, encode, publish);
a second writer gets ``records.BusyError`` at once (the CLI exits 75, EX_TEMPFAIL, naming the holder's pid).
The kernel drops a flock when its process dies, so a lock file still naming a dead holder is stale: the next
writer takes it over with a warning.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from retrctl import records
from retrctl.process import pid_alive

log = logging.getLogger("retrctl.index")

MANIFEST = "index.json"
FORMAT_VERSION = 1  # a version's own manifest (the same files the flat layout had)
LAYOUT_VERSION = 2  # the pointer; earlier retrctl reading it stops with "format_version 2 is newer"
MARKER = "retrctl-index"
VERSIONS = "versions"
LOCK = "index.lock"
KEEP = 2
BACKEND_NAMES = ("dense", "bm25")  # the flat layout's backends: it predates any other (new ones are versioned)
LEGACY_FILES = frozenset({"index.faiss", "docids.parquet", "vectors.npy", "bm25s", "tokens.npy", "offsets.npy"})  # the flat layout's

_NUM = re.compile(r"^\d{6,}$")
_TMP = re.compile(r"^\.(\d{6,})\.tmp-(\d+)$")
_POINTER_TMP = re.compile(r"^\.index\.json\.tmp-\d+$")  # the pointer's temporary file before records.atomic_path wrote it


def _pointer_temp(name: str) -> bool:
    """A temporary file of the pointer that a killed writer left (this retrctl's, or an earlier one's)."""
    return records.temp_target(name) == MANIFEST or bool(_POINTER_TMP.match(name))


@dataclass(frozen=True)
class Version:
    root: Path  # the directory the user named
    path: Path  # where this version's files are: root/versions/NAME, or root itself (flat layout)
    name: str | None  # "000007", or None for the flat layout
    manifest: dict


def damaged(path, why: str) -> records.RecordError:
    return records.RecordError(path, message=f"{why}: the index is damaged; rebuild it "
                                             "(retrctl index CORPUS -o DIR --rebuild)")


@contextlib.contextmanager
def reading(path):
    """Turn any failure to read an index file (missing, truncated, corrupt) into one line naming it."""
    try:
        yield
    except records.RecordError:
        raise
    except (OSError, ValueError, RuntimeError, EOFError, KeyError, TypeError) as e:
        what = getattr(e, "filename", None) or path
        reason = "missing" if isinstance(e, FileNotFoundError) else f"unreadable ({type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else 'no detail'})"
        raise damaged(what, reason) from None


def _parse(path: Path, text: str, limit: int) -> dict:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise records.RecordError(path, e.lineno, None, f"invalid JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise records.RecordError(path, message="not an index manifest (expected a JSON object)")
    fv = data.get("format_version", 0)
    if not isinstance(fv, int) or fv > limit:
        raise records.RecordError(path, None, "format_version", f"{fv} is newer than this retrctl reads ({limit})")
    return data


def _read_pointer(root: Path) -> str:
    path = root / MANIFEST
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        raise records.RecordError(root, message=f"not an index directory (no {MANIFEST})") from None
    except IsADirectoryError:
        raise records.RecordError(path, message="not an index manifest (a directory)") from None
    except UnicodeDecodeError:
        raise records.RecordError(path, message="not an index manifest (not UTF-8 text)") from None


def resolve(directory: str | os.PathLike, text: str | None = None) -> Version:
    """The version a reader must use: one read of the pointer (or its ``text``), then only that version's directory."""
    root = Path(directory)
    path = root / MANIFEST
    text = _read_pointer(root) if text is None else text
    if '"' + MARKER + '"' not in text:
        return Version(root, root, None, _parse(path, text, FORMAT_VERSION))
    data = _parse(path, text, LAYOUT_VERSION)
    if data.get("format") != MARKER:
        return Version(root, root, None, _parse(path, text, FORMAT_VERSION))
    name = data.get("current")
    if not isinstance(name, str) or not _NUM.match(name):
        raise records.RecordError(path, None, "current", f"not a version name: {name!r}")
    vdir = root / VERSIONS / name
    vpath = vdir / MANIFEST
    try:
        vtext = vpath.read_text()
    except (FileNotFoundError, NotADirectoryError):
        raise damaged(vdir if not vdir.exists() else vpath, "missing") from None
    return Version(root, vdir, name, _parse(vpath, vtext, FORMAT_VERSION))


def open_consistent(directory, load, attempts: int = 5):
    """``load(version)`` of the current version; when it fails because writers replaced and removed that version
    while it was being read (the pointer moved meanwhile), the new current version is opened instead. A failure
    while the pointer stays put is real damage and is raised."""
    if isinstance(directory, Version):
        return load(directory)
    root = Path(directory)
    for attempt in range(attempts):
        text = _read_pointer(root)
        try:
            return load(resolve(root, text))
        except records.RecordError:
            try:
                moved = _read_pointer(root) != text
            except records.RecordError:
                moved = False
            if not moved or attempt == attempts - 1:
                raise
            log.debug("%s: the version being opened was replaced meanwhile; opening the current one", root)
    raise AssertionError("unreachable")


def resolved(directory) -> Version:
    return directory if isinstance(directory, Version) else resolve(directory)


# ---------------------------------------------------------------- recognising an index directory


def _lock_record(path: Path) -> dict | None:
    """The lock file's record, or None when the file is not ours."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    if not text.strip():
        return {}
    try:
        rec = json.loads(text)
    except json.JSONDecodeError:
        return None
    return rec if isinstance(rec, dict) and rec.get("lock") == MARKER else None


def _why_not_ours(root: Path) -> str | None:
    """None when ``root`` is a retrctl index (or the beginning of one); else why not."""
    try:
        entries = {p.name for p in root.iterdir()}
    except OSError as e:
        return f"cannot list it ({e.strerror})"
    if not entries:
        return None
    if MANIFEST in entries:
        try:
            data = json.loads((root / MANIFEST).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return f"its {MANIFEST} is not a retrctl manifest"
        pointer = isinstance(data, dict) and data.get("format") == MARKER
        flat = isinstance(data, dict) and data.get("backend") in BACKEND_NAMES and isinstance(data.get("format_version"), int) \
            and isinstance(data.get("files"), dict)
        if not (pointer or flat):
            return f"its {MANIFEST} is not a retrctl manifest"
    elif LOCK not in entries or _lock_record(root / LOCK) is None:
        return f"no {MANIFEST}"
    if LOCK in entries and _lock_record(root / LOCK) is None:
        return f"{LOCK} is not retrctl's lock"
    foreign = sorted(e for e in entries if e not in (MANIFEST, VERSIONS, LOCK) and e not in LEGACY_FILES and not _pointer_temp(e))
    if VERSIONS in entries:
        vroot = root / VERSIONS
        if not vroot.is_dir():
            foreign.append(VERSIONS)
        else:
            foreign += [f"{VERSIONS}/{e.name}" for e in vroot.iterdir() if not (_NUM.match(e.name) or _TMP.match(e.name))]
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        return f"it holds files retrctl did not write: {', '.join(foreign[:3])}{more}"
    return None


def check_target(directory) -> bool:
    """Refuse (RecordError, exit 2) an ``-o`` that is not an index retrctl may write; True when it exists."""
    root = Path(directory)
    if not root.exists():
        if root.is_symlink():
            raise records.RecordError(root, message="is a dangling symlink, not an index directory: choose another -o")
        return False
    if not root.is_dir():
        raise records.RecordError(root, message="exists and is not a directory, so not an index directory: choose another -o")
    why = _why_not_ours(root)
    if why:
        raise records.RecordError(root, message=f"exists and is not an index directory written by retrctl index ({why}): "
                                                "choose another -o (nothing was changed)")
    return True


# ---------------------------------------------------------------- the writer lock

_HELD: dict[str, tuple[int, int, Path]] = {}  # realpath -> (thread, depth, where it is written) of this process's writers
_HELD_GUARD = threading.Lock()


def _write_lock_record(f, held: bool) -> None:
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"lock": MARKER, "pid": os.getpid(), "host": socket.gethostname(), "held": held,
                        "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
    f.flush()


@contextlib.contextmanager
def _flock(root: Path):
    import fcntl

    path = root / LOCK
    while True:
        f = open(path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            holder = (_lock_record(path) or {}).get("pid")
            raise records.BusyError(f"{root} is being written by another `retrctl index` (pid {holder or 'unknown'}, "
                                    f"lock {path}): try again when it has finished") from None
        try:  # a first build may have renamed a new directory over this one meanwhile: lock the live file
            same = os.fstat(f.fileno()).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()
        root.mkdir(parents=True, exist_ok=True)
    try:
        prev = _lock_record(path) or {}
        if prev.get("held") and prev.get("pid") != os.getpid():
            state = "no longer running" if not pid_alive(prev.get("pid")) else "no longer holding it"
            log.warning("%s: taking over the stale lock of pid %s (%s; it was killed before it finished)", path, prev.get("pid"), state)
        _write_lock_record(f, True)
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            if path.exists():
                _write_lock_record(f, False)
        f.close()  # closing drops the flock


@contextlib.contextmanager
def writer(directory):
    """Hold the writer lock of an index directory for the block (re-entrant: nested calls for the same -o yield the
    same directory); yields the directory to write into. Checks the target first (nothing is created for a refused
    -o), restores an index left by the old swap, sweeps dead writers' leftovers. A new index is built in a private
    sibling (``records.atomic_dir``) renamed to -o when the block succeeds, so a killed first build leaves no -o for
    make to take as done; of two first builds at once, the later rename wins whole."""
    root = Path(directory)
    key, me = os.path.realpath(root), threading.get_ident()
    with _HELD_GUARD:
        holder = _HELD.get(key)
        if holder is not None and holder[0] != me:  # flock would not stop a second thread of this process
            raise records.BusyError(f"{root} is being written by another thread of this process (pid {os.getpid()})")
        if holder is not None:
            _HELD[key] = (me, holder[1] + 1, holder[2])
    if holder is not None:
        try:
            yield holder[2]
        finally:
            with _HELD_GUARD:
                _HELD[key] = (me, _HELD[key][1] - 1, holder[2])
        return
    _restore_old_swap(root)
    if check_target(root):
        with _locked(root, key, me):
            check_target(root)  # again under the lock: another writer may have changed it meanwhile
            sweep(root)
            yield root
        return
    with records.atomic_dir(root, resume=False) as stage, _locked(stage, key, me):
        yield stage


@contextlib.contextmanager
def _locked(target: Path, key: str, me: int):
    """The flock on ``target``'s lock file, and this process's record that thread ``me`` writes ``key`` there."""
    with _flock(target):
        with _HELD_GUARD:
            if key in _HELD:
                raise records.BusyError(f"{target} is being written by another thread of this process (pid {os.getpid()})")
            _HELD[key] = (me, 1, target)
        try:
            yield
        finally:
            with _HELD_GUARD:
                _HELD.pop(key, None)


# ---------------------------------------------------------------- publishing versions


def _versions(root: Path) -> list[int]:
    vroot = root / VERSIONS
    if not vroot.is_dir():
        return []
    return sorted(int(p.name) for p in vroot.iterdir() if _NUM.match(p.name))


def _current(root: Path) -> int | None:
    """The published version number, None for the flat layout or no index."""
    try:
        v = resolve(root)
    except records.RecordError:
        try:
            data = json.loads((root / MANIFEST).read_text())
            return int(data["current"]) if data.get("format") == MARKER else None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
    return int(v.name) if v.name else None


def _fsync(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_tree(top: Path) -> None:
    for dirpath, _, files in os.walk(top):
        for f in files:
            _fsync(Path(dirpath) / f)
        _fsync(Path(dirpath))


def _write_pointer(root: Path, name: str, manifest: dict) -> None:
    data = {"format": MARKER, "format_version": LAYOUT_VERSION, "current": name,
            **{k: v for k, v in manifest.items() if k != "format_version"}}
    with records.atomic_path(root / MANIFEST, durable=True) as tmp:  # the one atomic step a reader can observe
        with open(tmp, "w") as f:
            f.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def new_version(directory, keep: int = KEEP):
    """Yield an empty directory; when the block has written a complete index into it, publish it as current."""
    if keep < 1:
        raise ValueError("keep must be at least 1 (the current version)")
    with writer(directory) as root:
        vroot = root / VERSIONS
        vroot.mkdir(exist_ok=True)
        n = max([*_versions(root), _current(root) or 0]) + 1
        tmp = vroot / f".{n:06d}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            yield tmp
            _fsync_tree(tmp)
            final = vroot / f"{n:06d}"
            os.replace(tmp, final)
            _fsync(vroot)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _write_pointer(root, final.name, json.loads((final / MANIFEST).read_text()))
        gc(root, keep)


def publish_copy(source: Version, directory, manifest: dict, keep: int = KEEP) -> str:
    """Publish the files of the version ``source`` with ``manifest`` as a new version of ``directory`` (`index
    --copy-from`); returns its name."""
    with new_version(directory, keep) as tmp:
        link_files(source, tmp)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return tmp.name[1:].split(".")[0]  # .NNNNNN.tmp-PID, published as NNNNNN


def link_files(source: Version, directory: Path) -> None:
    """The files of the version ``source``, its manifest apart, in ``directory``: hard links where one file system
    holds both (a version's files never change once written), else copies (records.link_tree)."""
    for item in sorted(source.path.iterdir()):  # a flat-layout source keeps its files beside these
        if item.name not in (MANIFEST, LOCK, VERSIONS) and not _POINTER_TMP.match(item.name):
            records.link_tree(item, directory / item.name)


def gc(root: Path, keep: int = KEEP) -> list[str]:
    """Delete versions that ``keep`` newer published versions supersede (and the flat layout's files); returns them."""
    current = _current(root)
    if current is None:
        return []
    published = [v for v in _versions(root) if v <= current]
    gone = []
    for v in published:
        if sum(p > v for p in published) >= keep:
            shutil.rmtree(root / VERSIONS / f"{v:06d}", ignore_errors=True)
            gone.append(f"{v:06d}")
    if len(published) >= keep:
        for name in LEGACY_FILES:
            p = root / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
                gone.append(name)
            elif p.exists() or p.is_symlink():
                p.unlink()
                gone.append(name)
    if gone:
        log.debug("removed old index versions %s", ", ".join(gone))
    return gone


def sweep(root: Path) -> None:
    """Remove what dead writers left (called with the lock held, so no live writer owns any of it)."""
    for p in root.iterdir():
        if _pointer_temp(p.name):
            p.unlink(missing_ok=True)
    vroot = root / VERSIONS
    if vroot.is_dir():
        current = _current(root) or 0
        for p in vroot.iterdir():
            if _TMP.match(p.name) or (_NUM.match(p.name) and int(p.name) > current):
                log.warning("removing %s, left by an update that did not finish", p)
                shutil.rmtree(p, ignore_errors=True)
    _sweep_old_swap(root)


_SWAP = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)$")


def _old_swap_dirs(root: Path):
    """The old swap's siblings of ``root`` (``.IDX.tmp-<pid>``, ``.IDX.old-<pid>``) whose process is gone."""
    parent = root.parent if root.name else None
    if parent is None or not parent.is_dir():
        return
    for p in parent.iterdir():
        m = _SWAP.match(p.name)
        if m and m["name"] == root.name and p.is_dir() and not pid_alive(m["pid"]):
            yield p, m["kind"]


def _restore_old_swap(root: Path) -> None:
    """A kill between the old swap's two renames left IDX missing and the index at .IDX.old-<pid>: put it back."""
    if root.exists() or root.is_symlink():
        return
    for p, kind in _old_swap_dirs(root):
        if kind == "old" and (p / MANIFEST).exists() and _why_not_ours(p) is None:
            log.warning("restoring %s from %s (an earlier update was killed while swapping)", root, p)
            os.replace(p, root)
            return


def _sweep_old_swap(root: Path) -> None:
    for p, _ in list(_old_swap_dirs(root)):
        log.warning("removing %s, left by an update that did not finish", p)
        shutil.rmtree(p, ignore_errors=True)
