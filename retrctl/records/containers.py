"""Files: compression containers, line reading, and writes that are atomic (a file or a whole directory).

Containers: .jsonl (also .json lines), .jsonl.gz, .jsonl.zst, .parquet; '-' is stdin/stdout (JSONL). gzip/zstd
is picked from the extension; zstd is written with a checksum and read by a reader that notices a truncated
stream (zstandard's own stream_reader stays silent). Lines are decoded one at a time, so bytes that are not UTF-8
and a truncated compressed stream name their own line.

Nothing is lost: a file output is written to a temporary file beside it and renamed over it only when the write
has finished (``atomic_path``, ``open_output``); a directory output is built beside it and swapped in by renames
only (``atomic_dir``, the one directory helper; ``sweep_dir`` cleans or repairs what a killed one left); and
``check_outputs`` refuses, before anything is read, an output that is, is inside, or contains an input.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import logging
import os
import re
import secrets
import shutil
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

from retrctl.errors import RecordError
from retrctl.process import pid_alive

log = logging.getLogger("retrctl.records")

# ---------------------------------------------------------------- raw text containers


def _compression(path: str) -> str | None:
    name = str(path).lower()
    if name.endswith(".gz"):
        return "gz"
    if name.endswith(".zst") or name.endswith(".zstd"):
        return "zst"
    return None


def is_parquet(path, fmt: str | None = None) -> bool:
    return fmt == "parquet" or (fmt is None and str(path).lower().endswith(".parquet"))


def open_text(path, mode: str = "r"):
    """Open a text stream, picking gzip/zstd from the extension; '-' is stdin/stdout."""
    path = str(path)
    if path == "-":
        stream = sys.stdin.buffer if "r" in mode else sys.stdout.buffer
        return io.TextIOWrapper(stream, encoding="utf-8", newline="\n", write_through=True)
    comp = _compression(path)
    if comp == "gz":
        return gzip.open(path, mode + "t", encoding="utf-8", newline="\n")
    if comp == "zst":
        import zstandard

        raw = open(path, mode + "b")
        if "r" in mode:
            stream = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        else:
            stream = zstandard.ZstdCompressor(level=10, write_checksum=True).stream_writer(raw, closefd=True)  # damage is detected
        return io.TextIOWrapper(stream, encoding="utf-8", newline="\n")
    return open(path, mode, encoding="utf-8", newline="\n")


class _ZstdReader(io.RawIOBase):
    """Raw zstd decompressing reader that notices a truncated stream (zstandard's stream_reader stays silent)."""

    def __init__(self, raw):
        import zstandard

        self._zstd, self._raw, self._pending = zstandard, raw, b""
        self._dobj, self._started = zstandard.ZstdDecompressor().decompressobj(), False

    def readable(self):
        return True

    def readinto(self, buf):
        while not self._pending:
            chunk = self._raw.read(1 << 16)
            if not chunk:
                if self._started and not self._dobj.eof:
                    raise EOFError("zstd stream ended before the end of its frame (truncated file?)")
                return 0
            self._started = True
            try:
                out = self._dobj.decompress(chunk)
                while self._dobj.eof and self._dobj.unused_data:  # concatenated frames
                    rest, self._dobj = self._dobj.unused_data, self._zstd.ZstdDecompressor().decompressobj()
                    out += self._dobj.decompress(rest)
            except self._zstd.ZstdError as e:
                raise OSError(str(e)) from None
            self._pending = out
        n = min(len(buf), len(self._pending))
        buf[:n], self._pending = self._pending[:n], self._pending[n:]
        return n

    def close(self):
        self._raw.close()
        super().close()


def _open_binary(path: str):
    if path == "-":
        return contextlib.nullcontext(sys.stdin.buffer)  # never close the process's stdin
    comp = _compression(path)
    if comp == "gz":
        return gzip.open(path, "rb")
    if comp == "zst":
        return io.BufferedReader(_ZstdReader(open(path, "rb")), 1 << 16)
    return open(path, "rb")


def _lines(path) -> Iterator[tuple[int, str]]:
    """(line number, text) for each non-blank line.

    Lines are decoded one at a time so that bytes that are not UTF-8 name their own line (a text wrapper
    decodes whole chunks and would blame an earlier line); truncated gzip/zstd streams name the line reached.
    """
    path = str(path)
    if path != "-" and not os.path.exists(path):
        raise RecordError(path, message="no such file")
    try:
        opened = _open_binary(path)
    except OSError as e:
        raise RecordError(path, message=f"cannot open: {e.strerror or e}") from None
    lineno = 0
    try:
        with opened as f:
            for raw in f:
                lineno += 1
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise RecordError(path, lineno, None, f"not UTF-8 ({e.reason} at byte {e.start} of the line)") from None
                if lineno == 1:
                    line = line.removeprefix("\ufeff")  # UTF-8 byte order mark
                if line.strip():
                    yield lineno, line
    except (OSError, EOFError, zlib.error) as e:  # truncated or corrupt gzip/zstd (zlib.error: a bad block mid-stream)
        raise RecordError(path, lineno + 1, None, f"unreadable compressed stream: {e}") from None


# ---------------------------------------------------------------- atomic writes


def _flat(paths) -> list[str]:
    out = []
    for p in paths:
        if isinstance(p, (list, tuple)):
            out += _flat(p)
        elif isinstance(p, (str, os.PathLike)) and str(p) != "-":  # records given in memory are no paths
            out.append(str(p))
    return out


def check_own_dir(out, marker: str, what: str) -> None:
    """A stage's output directory may be new, empty, or an earlier output of that stage (it holds ``marker``), which
    is replaced; anything else is refused before any work, so nothing of the user's is lost."""
    out = Path(out)
    if out.is_dir() and any(out.iterdir()) and not (out / marker).is_file():
        raise RecordError(out, message=f"exists and is not {what}: choose another -o (nothing written)")


def check_outputs(outputs, inputs, *, dir_output: bool = False) -> None:
    """Refuse an output that is, is inside, or (a directory output) contains an input (real paths, symlinks
    resolved), before anything is read: writing it would destroy the input. '-' never clashes; inputs that do not exist cannot be
    lost (and are reported as missing by their reader). A file output that is an existing directory (or a
    directory output that is an existing file) is refused too, instead of failing after all the work."""
    ins = [(i, Path(os.path.realpath(i))) for i in _flat(inputs) if os.path.lexists(i)]
    for out in _flat(outputs):
        real = Path(os.path.realpath(out))
        for given, rin in ins:
            if real == rin:
                how = "is"
            elif real.is_relative_to(rin):
                how = "is inside"
            elif dir_output and rin.is_relative_to(real):  # a directory output replaces what is inside it
                how = "contains"
            else:
                continue
            raise RecordError(out, message=f"the output {how} the input {given}: writing it would destroy the input; "
                              "nothing written (choose another -o)")
        above = next((a for a in real.parents if a.exists()), real)  # '/' has no parents
        if not above.is_dir():
            raise RecordError(out, message=f"cannot be created: {above} is a file, not a directory")
        if dir_output and os.path.isfile(out):
            raise RecordError(out, message="is a file: -o needs a directory here")
        if not dir_output and os.path.isdir(out):
            raise RecordError(out, message="is a directory: -o needs a file path here")


@contextlib.contextmanager
def atomic_path(path, suffix: str = "", *, durable: bool = False):
    """Yield a temporary path beside ``path`` (``.<name>.<random>.tmp<suffix>``); rename it into place only if the
    block succeeds. Every file retrctl writes whole goes through here (or ``open_output``, which uses it).

    suffix: what a writer that picks its format from the name needs at the end (``.gz``, ``.npy``, ``.png``).
    durable: the file's data is on disk before the rename and the rename is on disk before this returns (fsync of
    the file, then of the directory): what a reader in another process may act on at once (an index's pointer).
    A killed process leaves the temporary file; ``temp_target`` names what it was for, so a sweep can tell it apart.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_beside(path, lambda tag: f".{path.name}.{tag}.tmp{suffix}", directory=False)
    try:
        yield tmp
        if durable:
            _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        _fsync(path.parent)


def _create_beside(path: Path, name, directory: bool) -> str:
    """Create a new file or directory beside ``path`` named ``name(random tag)``, with the mode that a plain open or
    mkdir gives (the umask's; tempfile's would be private, 0600/0700, and the renamed output with it)."""
    for _ in range(100):
        tmp = path.parent / name(secrets.token_hex(4))
        try:
            if directory:
                os.mkdir(tmp, 0o777)
            else:
                os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            continue
        return str(tmp)
    raise FileExistsError(f"no free temporary name beside {path}")


def _fsync(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_TEMP = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]+\.tmp(?P<suffix>[^/]*)$")  # atomic_path's temporary files


def temp_target(name: str) -> str | None:
    """The name of the file that ``name``, a temporary file of ``atomic_path``, was to become; None if it is none."""
    m = _TEMP.match(name)
    return m["name"] if m else None


@contextlib.contextmanager
def atomic_dir(path, *, resume: bool = True):
    """Yield a work directory beside ``path``; when the block succeeds it replaces ``path`` by renames only.

    ``path`` is not touched before the block has finished: then the old directory is renamed to
    ``.<name>.old-<pid>``, the work directory to ``path``, and the old one deleted. A failed block leaves ``path``
    as it was.

    resume=True (training): the work directory is ``<path>.partial``, reused when it is there and kept when the
    block fails, so a long stage continues from what it holds.
    resume=False: a private ``.<name>.tmp-<pid>-<random>``, removed when the block fails; what a killed process
    left (this, or the old directory between the two renames) is for ``sweep_dir``, which runs first here.
    """
    path = Path(path)
    if resume:
        work = path.with_name(path.name + ".partial")
        work.mkdir(parents=True, exist_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep_dir(path)
        work = Path(_create_beside(path, lambda tag: f".{path.name}.tmp-{os.getpid()}-{tag}", directory=True))
    try:
        yield work
        _swap(work, path)
    except BaseException:
        if not resume:
            shutil.rmtree(work, ignore_errors=True)
        raise


def link_tree(src: Path, dst: Path) -> None:
    """``src`` (a file or a directory tree) at ``dst`` as hard links where one file system holds both, else as
    copies: for files that are never changed once written (an index version's), so sharing them is safe."""
    if src.is_dir():
        dst.mkdir()
        for item in sorted(src.iterdir()):
            link_tree(item, dst / item.name)
        return
    try:
        os.link(src, dst)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(src, dst)


def _swap(src: Path, dst: Path, attempts: int = 100) -> None:
    """Move the finished directory ``src`` to ``dst``, replacing what is there by renames only.

    Another process may publish its own ``dst`` between two of these steps (two first builds of one index at once,
    each in its own work directory): a rename onto a directory that has just appeared fails (ENOTEMPTY) and starts
    the swap again, and a ``dst`` moved away meanwhile is simply not there to move aside, so the later rename wins
    whole."""
    old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
    for _ in range(attempts):
        shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(dst, old)
            moved_aside = True
        except FileNotFoundError:  # a first build, or moved away by another meanwhile
            moved_aside = False
        try:
            os.replace(src, dst)
        except BaseException as e:
            if getattr(e, "errno", None) in (errno.ENOTEMPTY, errno.EEXIST):  # another's arrived meanwhile: newer than old
                continue
            if moved_aside:
                os.replace(old, dst)  # the old directory goes back; a kill right here is sweep_dir's to repair
            raise
        shutil.rmtree(old, ignore_errors=True)
        return
    raise OSError(errno.EBUSY, f"other processes kept replacing {dst} while {src} was being moved there")


_LEFT = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)(?:-[^/]*)?$")  # atomic_dir's siblings


def sweep_dir(path) -> list[Path]:
    """Clean up after an ``atomic_dir(path)`` whose process was killed; returns what was removed.

    Only siblings whose process is gone are touched. If the kill came between the swap's two renames, ``path``
    is missing and the old directory lies beside it: it is put back (the new one was never reported done).
    Work directories (``.<name>.tmp-<pid>-…``) and old directories are then deleted. ``<path>.partial`` is a
    resume point, never swept.
    """
    path = Path(path)
    parent = path.parent
    if not path.name or not parent.is_dir():
        return []
    left = []
    for p in sorted(parent.iterdir()):
        m = _LEFT.match(p.name)
        if m and m["name"] == path.name and p.is_dir() and not p.is_symlink() and not pid_alive(m["pid"]):
            left.append((p, m["kind"]))
    if not (path.exists() or path.is_symlink()):
        old = next((p for p, kind in left if kind == "old"), None)
        if old is not None:
            log.warning("restoring %s from %s (an earlier write was killed while swapping it in)", path, old)
            os.replace(old, path)
            left.remove((old, "old"))
    for p, _ in left:
        log.warning("removing %s, left by a write that did not finish", p)
        shutil.rmtree(p, ignore_errors=True)
    return [p for p, _ in left]


@contextlib.contextmanager
def open_output(path, fmt: str | None = None):
    """A text stream for ``path`` ('-' = stdout), written atomically."""
    if str(path) == "-":
        stream = open_text("-", "w")
        try:
            yield stream
        finally:
            with contextlib.suppress(BrokenPipeError, ValueError):
                stream.flush()
            stream.detach()
        return
    comp = _compression(path)
    # the temp name keeps the compression extension so open_text picks the same codec
    with atomic_path(path, suffix={"gz": ".gz", "zst": ".zst"}.get(comp, "")) as tmp, open_text(tmp, "w") as f:
        yield f
