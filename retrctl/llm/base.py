"""The LLM interface qgen and rerank call, and the prompt helpers every backend shares.

A prompt is a string (sent as is) or a list of chat messages ``[{"role", "content"}]``; backends render messages
with the model's chat template when there is one and as plain lines otherwise (see the package docstring for the
methods). Usage counters are guarded by a lock: the server backend calls from a thread pool.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Sequence

from retrctl.hashing import stable_int

log = logging.getLogger("retrctl.llm")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def row_seeds(seed, n: int) -> list[int | None]:
    """One seed per prompt: an int seed is spread deterministically; a list is used as given."""
    if seed is None:
        return [None] * n
    if isinstance(seed, int):
        return [stable_int(seed, i, size=7) for i in range(n)]
    seeds = list(seed)
    if len(seeds) != n:
        raise ValueError(f"got {len(seeds)} seeds for {n} prompts")
    return seeds


def cut_at_stop(text: str, stop: Sequence[str] | None) -> tuple[str, bool]:
    """Text up to the first stop string (exclusive), and whether one was found."""
    cut = min((i for s in stop or () if s and (i := text.find(s)) >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def is_messages(prompt) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt)


def plain_render(messages: list[dict]) -> str:
    """Messages as plain text, for models without a chat template."""
    return "\n".join(m["content"] for m in messages) + "\n"


class LLM:
    """The interface; see the module docstring."""

    backend = "base"

    def __init__(self, name: str):
        self.name = name
        self.usage = {"calls": 0, "prompt_tokens": 0, "generated_tokens": 0, "retries": 0, "seconds": 0.0}
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def _count(self, **kw) -> None:
        with self._lock:
            for k, v in kw.items():
                self.usage[k] += v

    def warn_once(self, key: str, msg: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    @property
    def has_chat_template(self) -> bool:
        return False

    @property
    def prefers_chat(self) -> bool:
        """Whether generation prompts should be chat messages: the model has a chat template, or it is served
        and we cannot tell (servers apply their model's template to /v1/chat/completions)."""
        return self.has_chat_template or (self.backend == "openai" and getattr(self, "tokenizer", None) is None)

    def render(self, prompt) -> str:
        if isinstance(prompt, str):
            return prompt
        if not is_messages(prompt):
            raise TypeError("a prompt is a string or a list of {role, content} messages")
        return plain_render(prompt)

    def count_tokens(self, text) -> int:
        raise NotImplementedError

    def generate(self, prompts, *, max_new_tokens: int = 32, temperature: float = 0.0, top_p: float = 1.0,
                 stop: Sequence[str] | None = None, seed=None, details: bool = False) -> list:
        raise NotImplementedError

    def logprobs(self, prompt, continuation):
        raise NotImplementedError

    def describe(self) -> dict:
        raise NotImplementedError

    def report(self, what: str = "llm") -> str:
        u = self.usage
        rate = u["generated_tokens"] / u["seconds"] if u["seconds"] else 0.0
        return (f"{what}: {u['calls']} LLM calls, {u['prompt_tokens']} prompt tokens, {u['generated_tokens']} generated "
                f"tokens ({rate:.1f} tok/s), {u['retries']} retries")


def pairs(prompt, continuation):
    """(list of prompts, list of continuations, single?) from scalar or list arguments."""
    if isinstance(continuation, str):
        return [prompt], [continuation], True
    conts = list(continuation)
    prompts = list(prompt) if isinstance(prompt, (list, tuple)) and not is_messages(prompt) else [prompt] * len(conts)
    if len(prompts) != len(conts):
        raise ValueError(f"{len(prompts)} prompts for {len(conts)} continuations")
    return prompts, conts, False

