"""llama-cpp-python's OpenAI-compatible server (the ``retrctl[llamacpp]`` extra) as a child process.

``LlamaCppServer(model)`` starts it the stock way on a GGUF file (a shipped name such as ``smollm2`` or a path)::

    python -m llama_cpp.server --model FILE --host 127.0.0.1 --port PORT

on a free loopback port, waits until ``GET /v1/models`` answers, and stops it on exit (SIGTERM, then SIGKILL).
The recipe's ``LLM_SERVER=llamacpp`` (examples/beir/with_llm_server.py), the tests and bench/llm_server.py start
it through this class; retrctl's client (``server.OpenAILLM``) then reaches it through ``--base-url``.

The server's defaults serve every request retrctl sends: /v1/chat/completions renders the chat template the
GGUF carries, and /v1/completions answers ``echo`` + ``logprobs`` (prompt log-probabilities, for query
likelihood and pointwise rerank) because its ``--logits_all`` is on by default. It runs one request at a time
(a lock around its model), with ``--n_threads`` half the cores unless told otherwise (``args``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from retrctl.errors import UsageError
from retrctl.process import dies_with_parent, free_port

log = logging.getLogger("retrctl.llm")

EXTRA = "pip install 'retrctl[llamacpp]' (it compiles llama.cpp: several minutes)"
# what `python -m llama_cpp.server` imports besides llama_cpp itself (llama-cpp-python's [server] extra)
SERVER_MODULES = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings")


def available() -> bool:
    """Whether llama-cpp-python and its server's dependencies are installed (nothing is imported)."""
    return all(importlib.util.find_spec(m) is not None for m in SERVER_MODULES)


def gguf_file(model) -> Path:
    """The GGUF file of a shipped model name or a path."""
    from retrctl.models.loading import SHIPPED, locate_shipped

    path = locate_shipped(str(model)) if str(model) in SHIPPED else Path(model)
    if path.suffix != ".gguf" or not path.is_file():
        raise UsageError(f"llama.cpp's server runs a GGUF file; {model} is not one", flag="--llm")
    return path


class LlamaCppServer:
    """The server on ``model`` (GGUF) at ``url`` while in a ``with`` block. ``args``: more server flags
    (``--n_threads 2``). Its output goes to ``log_path``, whose tail is shown when it fails to start. Without
    one it goes to a temporary file, removed when ``stop`` ends a running server and kept when the server failed
    to start or ended on its own, for the error that names it."""

    def __init__(self, model, *, port: int | None = None, args=(), ready_timeout: float = 120.0, log_path=None):
        self.gguf = gguf_file(model)
        self.port = port or free_port()
        self.args, self.ready_timeout = [str(a) for a in args], float(ready_timeout)
        self.temporary_log = not log_path
        self.log_path = Path(log_path) if log_path else None  # the temporary file is made by start
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "llama_cpp.server", "--model", str(self.gguf), "--host", "127.0.0.1",
                "--port", str(self.port), *self.args]

    def start(self) -> LlamaCppServer:
        if not available():
            raise UsageError(f"llama.cpp's server is not installed: {EXTRA}")
        if self.temporary_log:
            self.log_path = Path(tempfile.mkstemp(prefix="llamacpp-", suffix=".log")[1])
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         preexec_fn=dies_with_parent())  # no server left behind a killed parent
        deadline = time.monotonic() + self.ready_timeout
        while not self.ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = self.ended() or f"not ready after {self.ready_timeout:.0f}s"
                self.stop(keep_log=True)
                raise RuntimeError(f"llama.cpp's server on {self.gguf.name} {why}; its log ({self.log_path}) ends:\n"
                                   + self.log_tail())
            time.sleep(0.2)
        log.info("llama.cpp's server on %s is ready at %s (pid %d, log %s)", self.gguf.name, self.url, self.proc.pid,
                 self.log_path)
        return self

    def ended(self) -> str | None:
        """How the server ended on its own ("killed by SIGSEGV", "exited with status 1"); None while it runs."""
        code = None if self.proc is None else self.proc.poll()
        if code is None:
            return None
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/models", timeout=2.0) as resp:
                return bool(json.loads(resp.read()).get("data"))
        except (OSError, ValueError):
            return False

    def log_tail(self, lines: int = 15) -> str:
        if self.log_path is None:  # never started
            return ""
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self, sig: int = signal.SIGTERM, wait: float = 15.0, *, keep_log: bool = False) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``wait`` seconds); ``sig=SIGKILL`` kills it at once. A
        temporary log goes with it unless ``keep_log``; nothing is done to a server that already ended."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.temporary_log and not keep_log:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> LlamaCppServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


