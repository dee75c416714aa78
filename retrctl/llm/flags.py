"""Choosing and loading an LLM: the backend table and the shared command-line flags (--llm, --llm-backend,
--base-url, --concurrency, --timeout, --max-retries; declared once in ``retrctl.options.OPTIONS``) turned into
a loaded model. qgen and rerank call ``llm_from_flags``; rerank's --dry-run calls ``planning_llm``.
A --base-url with no --llm-backend means the openai client: a served model is what a URL points to.
"""

from __future__ import annotations

import logging

from retrctl.errors import UsageError
from retrctl.llm.base import LLM
from retrctl.llm.hf import HFLLM
from retrctl.llm.server import OpenAILLM

log = logging.getLogger("retrctl.llm")

BACKENDS = ("hf", "openai")
SERVER_FLAGS = ("concurrency", "timeout", "max_retries")


def load_llm(name_or_path, backend: str = "hf", base_url: str | None = None, **opts) -> LLM:
    """An LLM behind one interface. hf opts: device, dtype, batch_size, tokenizer_only.
    openai opts: concurrency, timeout, max_retries, backoff, tokenizer, api_key."""
    backend = backend or "hf"
    if backend == "hf":
        if base_url:
            raise UsageError("--base-url is for --llm-backend openai")
        return HFLLM(name_or_path, **opts)
    if backend == "openai":
        return OpenAILLM(str(name_or_path), base_url=base_url, **opts)
    raise UsageError(f"--llm-backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def chosen_backend(opts: dict) -> tuple[str, str | None]:
    """Pop --llm-backend and --base-url: (the backend, the URL); a URL alone chooses openai."""
    base_url = opts.pop("base_url", None)
    return opts.pop("llm_backend", None) or ("openai" if base_url else "hf"), base_url


def llm_from_flags(name, opts: dict, ray=None) -> LLM:
    """Pop the shared LLM flags (--llm-backend, --base-url, --concurrency, --timeout, --max-retries) from a
    command's options and load the LLM with those that apply to its backend; --batch-size (left for the stage)
    also sets the hf backend's batch. ``ray`` (retrctl.distributed settings): the hf model runs on Ray workers
    (llm/remote.py; the caller closes it), only its tokenizer here."""
    backend, base_url = chosen_backend(opts)
    if ray is not None and backend != "hf":
        raise UsageError("--ray runs the hf backend's model on Ray workers; a served model (--llm-backend openai) "
                         "scales with its server (--concurrency)", flag="--ray")
    server = {k: opts.pop(k, None) for k in SERVER_FLAGS}
    batch_size = opts.get("batch_size")
    if backend == "openai":
        kw = {k: v for k, v in server.items() if v is not None}
    else:
        if any(v is not None for v in server.values()) or base_url:
            log.warning("--base-url/--concurrency/--timeout/--max-retries apply to --llm-backend openai only")
        base_url, kw = None, ({"batch_size": batch_size} if batch_size else {})
    if ray is not None:
        from retrctl.distributed import WorkerPool
        from retrctl.llm.remote import LoadOnWorker, RemoteLLM

        local = load_llm(name, backend, tokenizer_only=True, **kw)
        return RemoteLLM(WorkerPool(ray, LoadOnWorker(name, kw), "generation"), local)
    return load_llm(name, backend, base_url, **kw)


def planning_llm(name, opts: dict) -> LLM:
    """Pop the shared LLM flags and --batch-size, and load only what counting tokens needs: the tokenizer (hf),
    or a server backend that is never called (its local tokenizer when the name resolves to one)."""
    backend, _ = chosen_backend(opts)
    for k in (*SERVER_FLAGS, "batch_size"):
        opts.pop(k, None)
    if backend == "hf":
        return load_llm(name, tokenizer_only=True)
    return load_llm(name, backend="openai", base_url="http://dry-run.invalid")
