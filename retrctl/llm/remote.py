"""The hf backend's model on Ray workers (``--ray``): the driver keeps a tokenizer-only copy for prompts, token
counts and the manifest, and each LLM call (a batch of prompts) runs on a worker of a ``retrctl.distributed``
pool. The batch loop (``resume.resumable``) keeps several batches in flight and checkpoints their rows here, in
input order, so the output is what one process writes.
"""

from __future__ import annotations

from retrctl.distributed import WorkerPool


class LoadOnWorker:
    """What a worker holds: the hf backend's arguments (``HFLLM``); the model is loaded in the worker on its first
    call (and again in a restarted one). Each call returns (result, the usage it added), for the driver's counters."""

    def __init__(self, name, opts: dict):
        self.name, self.opts = name, dict(opts)
        self._llm = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_llm": None}  # the arguments travel, never a loaded model

    def _loaded(self):
        if self._llm is None:
            from retrctl.llm.hf import HFLLM

            self._llm = HFLLM(self.name, **self.opts)
        return self._llm

    def _counted(self, method: str, *args, **kwargs):
        llm = self._loaded()
        before = dict(llm.usage)
        out = getattr(llm, method)(*args, **kwargs)
        return out, {k: v - before[k] for k, v in llm.usage.items()}

    def generate(self, *args, **kwargs):
        return self._counted("generate", *args, **kwargs)

    def logprobs(self, *args, **kwargs):
        return self._counted("logprobs", *args, **kwargs)


class RemoteLLM:
    """An LLM whose ``generate`` and ``logprobs`` run on ``pool``; everything else (name, render, count_tokens,
    describe, usage, report) is the local tokenizer-only copy's. ``pool`` is what ``resumable`` runs batches on;
    ``close()`` lets the workers go."""

    def __init__(self, pool: WorkerPool, local):
        self.pool, self._local = pool, local

    def __getattr__(self, name):
        return getattr(self._local, name)

    def _remote(self, method: str, *args, **kwargs):
        out, used = self.pool.call(method, *args, **kwargs)
        self._local._count(**used)
        return out

    def generate(self, *args, **kwargs):
        return self._remote("generate", *args, **kwargs)

    def logprobs(self, *args, **kwargs):
        return self._remote("logprobs", *args, **kwargs)

    def close(self) -> None:
        self.pool.close()
