"""This process and others: stdout kept for records, and whether another process is still running.

stdout carries records only, yet libraries print there: DeepSpeed (its import, init and checkpoints; transformers'
``save_pretrained`` imports it), Seismic's Rust core (its build log, on file descriptor 1, which swapping
``sys.stdout`` never reaches), and anything a Ray worker's code prints (a worker's stdout reaches the driver's).
``stdout_onto_stderr`` sends both ``sys.stdout`` and descriptor 1 to stderr; ``stdout_to_stderr`` does it for a
block and undoes it after; a worker process calls ``stdout_onto_stderr`` once and never undoes it.

``pid_alive`` is the one check of a process id that a lock or a leftover file names: a killed writer's work is
swept, a live one's is left alone. ``free_port``: a loopback port no one listens on now, for a process this one
starts (torch.distributed's rendezvous, llama.cpp's server). ``dies_with_parent``: a child process (a server) that
ends with the process that started it, even one killed with no chance to stop it (SIGKILL: the OOM killer).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator


def stdout_onto_stderr() -> Callable[[], None]:
    """Send what is written to stdout, by Python (``sys.stdout``) or below it (descriptor 1: C, Rust), to stderr;
    returns the function that undoes it. What was written to stdout before is flushed there first."""
    with contextlib.suppress(OSError, ValueError):  # a closed stdout has nothing to flush
        sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # descriptor 1 is closed: nothing below Python can reach it
        saved = None
    else:
        os.dup2(2, 1)
    python_stdout, sys.stdout = sys.stdout, sys.stderr

    def undo() -> None:
        for stream in (sys.stderr, python_stdout):  # what the block wrote lands on stderr, not after it on stdout
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        sys.stdout = python_stdout
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)

    return undo


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """``stdout_onto_stderr`` for the block (around a library call that prints)."""
    undo = stdout_onto_stderr()
    try:
        yield
    finally:
        undo()


def pid_alive(pid) -> bool:
    """Whether process ``pid`` (an int, or its text as a lock file or a file name holds it) is running on this
    machine. A process of another user is running (signal 0 is refused with EPERM, but it exists); None, junk and
    pids below 1 (0 and negative numbers name process groups) are no running process."""
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        return False
    if pid < 1:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except (OSError, OverflowError):  # no such process, or a pid beyond what the system has
        return False
    return True


def free_port() -> int:
    """A loopback TCP port free at the time of asking (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dies_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``, made in the parent (the child only calls it: no import after the
    fork): on Linux the child is sent SIGTERM when the parent's thread that started it ends, however it ends, so a
    server it started is not left running; a parent already gone by then ends the child at once. None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()

    def preexec() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent ended before the request took effect
            os._exit(1)

    return preexec
