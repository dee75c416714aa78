"""The ``openai`` backend: any OpenAI-compatible server (vLLM, llama-cpp-python's ``llama_cpp.server``, TGI,
Ollama) over ``/v1/chat/completions`` and ``/v1/completions``, with stdlib HTTP.

A thread pool gives concurrency; each request has a timeout and is retried with exponential backoff on
connection errors, a connection closed mid-response, an answer that is not JSON, 429 and 5xx (honouring
Retry-After). When the server cannot go on (it is not there, keeps failing, refuses the request or answers
something that is not a completion) a ``ServerError`` names the URL: a ``RecordError``, so the command line
prints one line and exits 2. Local servers need no key: a dummy bearer token is sent when ``OPENAI_API_KEY``
is unset (rank_llm#410).

Decoding is what the caller asks for and nothing else: servers apply samplers of their own by default
(llama-cpp-python: repeat penalty 1.1, top-k 40, min-p 0.05, even when greedy), so each request also sends the
neutral values of those extension fields (``NEUTRAL``). A server that refuses one of them (HTTP 400/422 naming
the field, as OpenAI's own API does) gets the request again without them, and no more of them after that.

``logprobs`` needs ``/v1/completions`` with ``echo`` and ``logprobs`` (vLLM has them; llama-cpp-python's
server has them as started by default, ``logits_all`` on; llama.cpp's C++ ``llama-server`` has not). The
continuation's tokens are found by character offsets counted back from the first generated token, because
llama-cpp-python counts offsets in text without its special tokens (``<|im_start|>``) while vLLM counts them in
the prompt as sent. A local tokenizer, when the model name resolves to one, gives exact token counts and chat
templates; otherwise counts are approximate (4 characters a token).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import json
import logging
import math
import os
import random
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from retrctl import records
from retrctl.errors import RecordError
from retrctl.llm.base import LLM, cut_at_stop, is_messages, pairs, plain_render, row_seeds, sha

log = logging.getLogger("retrctl.llm")

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
# extension fields whose neutral values switch off a server's own samplers (llama.cpp's names; vLLM reads
# top_k and min_p and ignores the rest)
NEUTRAL = {"repeat_penalty": 1.0, "top_k": 0, "min_p": 0.0}


class ServerError(RecordError, RuntimeError):
    """The server at ``url`` cannot go on: bad input to the stage, named by the URL (exit 2)."""

    def __init__(self, url: str, message: str, status: int | None = None, body: str = ""):
        super().__init__(url, message=message)
        self.status, self.body = status, body


class OpenAILLM(LLM):
    backend = "openai"

    def __init__(self, model: str, *, base_url: str | None = None, concurrency: int = 4, timeout: float = 120.0,
                 max_retries: int = 5, backoff: float = 1.0, tokenizer=None, api_key: str | None = None):
        super().__init__(model)
        url = (base_url or os.environ.get("OPENAI_BASE_URL") or "http://127.0.0.1:8000/v1").rstrip("/")
        self.base_url = url if url.endswith("/v1") else url + "/v1"
        # local servers never need a key; a dummy one keeps servers that insist on the header happy (rank_llm#410)
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.concurrency, self.timeout = max(1, int(concurrency)), float(timeout)
        self.max_retries, self.backoff = max(0, int(max_retries)), float(backoff)
        self.tokenizer = self._local_tokenizer(tokenizer if tokenizer is not None else model)
        self.neutral = True  # send NEUTRAL until the server refuses it

    @staticmethod
    def _local_tokenizer(name):
        """A local tokenizer for exact token counts and chat templates, when the model name resolves to one."""
        from retrctl.models import SHIPPED

        if name is None or not (str(name) in SHIPPED or Path(str(name)).exists()):
            return None
        try:
            from transformers import AutoTokenizer

            from retrctl.models import resolve

            return AutoTokenizer.from_pretrained(str(resolve(name)))
        except Exception as e:  # a served name that happens to be a path without a tokenizer
            log.debug("no local tokenizer for %s: %s", name, e)
            return None

    @property
    def has_chat_template(self) -> bool:
        return bool(self.tokenizer is not None and getattr(self.tokenizer, "chat_template", None))

    def render(self, prompt) -> str:
        if isinstance(prompt, str):
            return prompt
        if self.has_chat_template:
            return self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        self.warn_once("render", "no local chat template for %s: messages sent to /v1/completions are rendered as plain text",
                       self.name)
        return super().render(prompt)

    def count_tokens(self, text) -> int:
        if not isinstance(text, str) and not self.has_chat_template:
            # chat requests are templated server side: count the contents
            text = plain_render(text)
        text = self.render(text)
        if self.tokenizer is not None:
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return max(1, math.ceil(len(text) / 4))  # the usual ~4 characters per token, when no tokenizer is at hand

    # -- HTTP with retries

    def _post(self, route: str, payload: dict) -> dict:
        """The server's JSON answer; the neutral sampler fields go along until the server refuses one of them."""
        if self.neutral:
            try:
                return self._send(route, {**NEUTRAL, **payload})
            except ServerError as e:
                if e.status not in (400, 422) or not any(k in e.body for k in NEUTRAL):
                    raise
                self.neutral = False
                self.warn_once("neutral", "%s refuses the sampler fields %s; sending OpenAI's fields only (its own "
                               "sampler defaults then apply)", self.base_url, ", ".join(NEUTRAL))
        return self._send(route, payload)

    def _send(self, route: str, payload: dict) -> dict:
        url = self.base_url + route
        data = json.dumps(payload).encode("utf-8")
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"}
        last = ""
        for attempt in range(self.max_retries + 1):
            wait = None
            try:
                req = urllib.request.Request(url, data=data, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return json.loads(resp.read().decode("utf-8"))
            except urllib.error.HTTPError as e:
                body = e.read().decode("utf-8", "replace")[:300]
                last = f"HTTP {e.code}: {body}"
                if e.code not in RETRY_STATUS:
                    raise ServerError(url, last, status=e.code, body=body) from None
                with contextlib.suppress(TypeError, ValueError):
                    wait = float(e.headers.get("Retry-After"))
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            except ValueError as e:  # JSONDecodeError, UnicodeDecodeError: not an answer
                last = f"the answer is not JSON ({e})"
            if attempt == self.max_retries:
                break
            delay = wait if wait is not None else self.backoff * (2**attempt) * (1 + 0.1 * random.random())
            self._count(retries=1)
            log.debug("%s failed (%s); retry %d in %.2fs", url, last, attempt + 1, delay)
            time.sleep(min(delay, 60.0))
        raise ServerError(url, f"failed after {self.max_retries + 1} attempts; last error {last}")

    def _choice(self, route: str, res) -> dict:
        """The first choice of a completion answer, or a ServerError naming the URL when it is not one."""
        choices = res.get("choices") if isinstance(res, dict) else None
        if not choices or not isinstance(choices[0], dict):
            raise ServerError(self.base_url + route, f"the answer is not a completion (no choices): {json.dumps(res)[:200]}")
        return choices[0]

    def _map(self, fn, n: int) -> list:
        if self.concurrency == 1 or n <= 1:
            return [fn(i) for i in range(n)]
        with concurrent.futures.ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(fn, range(n)))

    # -- the interface

    def generate(self, prompts, *, max_new_tokens: int = 32, temperature: float = 0.0, top_p: float = 1.0,
                 stop: Sequence[str] | None = None, seed=None, details: bool = False) -> list:
        prompts = list(prompts)
        seeds = row_seeds(seed, len(prompts))
        stop = [s for s in stop or () if s]

        def one(i):
            p = prompts[i]
            payload = {"model": self.name, "max_tokens": max_new_tokens, "temperature": float(temperature),
                       "top_p": float(top_p), "n": 1}
            if stop:
                payload["stop"] = stop
            if seeds[i] is not None:
                payload["seed"] = int(seeds[i] % (2**31))
            if isinstance(p, str):
                payload["prompt"] = p
                if details:
                    payload["logprobs"] = 1
                res = self._post("/completions", payload)
                choice = self._choice("/completions", res)
                text = choice.get("text", "")
                lp = choice.get("logprobs") or {}
                scored = list(zip(lp.get("tokens") or [], lp.get("token_logprobs") or [], strict=False))
            else:
                if not is_messages(p):
                    raise TypeError("a prompt is a string or a list of {role, content} messages")
                payload["messages"] = p
                if details:  # llama-cpp-python returns none without top_logprobs
                    payload.update(logprobs=True, top_logprobs=1)
                res = self._post("/chat/completions", payload)
                choice = self._choice("/chat/completions", res)
                text = (choice.get("message") or {}).get("content") or ""
                scored = [(t.get("token"), t.get("logprob")) for t in (choice.get("logprobs") or {}).get("content") or []]
            text, _ = cut_at_stop(text, stop)
            usage = res.get("usage") or {}
            self._count(calls=1, prompt_tokens=int(usage.get("prompt_tokens") or self.count_tokens(p)),
                        generated_tokens=int(usage.get("completion_tokens") or 0))
            if not details:
                return text.strip()
            lps = [v for v in (text_tokens(scored, len(text)) if stop else [v for _, v in scored]) if v is not None]
            return {"text": text.strip(), "logprob": sum(lps) / len(lps) if lps else None, "tokens": len(lps)}

        t0 = time.perf_counter()
        out = self._map(one, len(prompts))
        self._count(seconds=time.perf_counter() - t0)
        return out

    def logprobs(self, prompt, continuation):
        prompts, conts, single = pairs(prompt, continuation)
        route = "/completions"

        def one(i):
            p, c = self.render(prompts[i]), conts[i]
            if not p or not c:
                raise ValueError("logprobs needs a non-empty prompt and continuation")
            res = self._post(route, {"model": self.name, "prompt": p + c, "max_tokens": 1, "echo": True, "logprobs": 1,
                                     "temperature": 0.0})
            choice = self._choice(route, res)
            lp = choice.get("logprobs") or {}
            offsets, values, tokens = lp.get("text_offset"), lp.get("token_logprobs"), lp.get("tokens")
            usage = res.get("usage") or {}
            generated = int(usage.get("completion_tokens") or 0)
            if not offsets or not values or len(offsets) != len(values) or generated >= len(values):
                raise ServerError(self.base_url + route, "the answer has no prompt log-probs (a server needs echo and "
                                  "logprobs on /v1/completions, as vLLM and llama_cpp.server have); use --llm-backend hf")
            text = choice.get("text") or ""
            if generated and tokens and len(tokens) == len(values) and text.startswith(p + c):
                said, listed = text[len(p + c):], "".join(tokens[len(values) - generated:])
                if not (said.startswith(listed) or listed.startswith(said)):
                    # llama-cpp-python scores a prompt that does not begin with the model's BOS token one token off
                    # (and drops the generated token): the values cannot be used
                    raise ServerError(self.base_url + route, "the prompt log-probs are one token off the prompt's "
                                      "tokens (llama-cpp-python does this when a prompt does not begin with the model's "
                                      "BOS token): give --llm a model whose chat template begins with it, or use "
                                      "--llm-backend hf")
            # the echoed text ends where the first generated token starts (or where the last token ends)
            end = offsets[len(values) - generated] if generated else offsets[-1] + len((tokens or [""])[-1])
            picked = [v for o, v in zip(offsets, values, strict=True) if v is not None and end - len(c) <= o < end]
            if not picked:  # a token straddling the boundary: score the last prompt-side token
                picked = [next(v for o, v in reversed(list(zip(offsets, values, strict=True))) if v is not None and o < end)]
            self._count(calls=1, prompt_tokens=int(usage.get("prompt_tokens") or 0), generated_tokens=generated)
            return sum(picked) / len(picked)

        t0 = time.perf_counter()
        out = self._map(one, len(prompts))
        self._count(seconds=time.perf_counter() - t0)
        return out[0] if single else out

    def server_models(self) -> list[str]:
        try:
            req = urllib.request.Request(self.base_url + "/models", headers={"Authorization": f"Bearer {self.api_key}"})
            with urllib.request.urlopen(req, timeout=min(self.timeout, 10.0)) as resp:
                return [m.get("id") for m in json.loads(resp.read().decode("utf-8")).get("data", [])]
        except Exception as e:
            log.debug("GET /v1/models failed: %s", e)
            return []

    def describe(self) -> dict:
        tmpl = getattr(self.tokenizer, "chat_template", None) if self.tokenizer is not None else None
        return {"backend": "openai", "model": self.name, "base_url": self.base_url, "server_models": self.server_models(),
                "chat_template": sha(tmpl) if isinstance(tmpl, str) else None,
                "token_counts": "exact" if self.tokenizer is not None else "approximate (chars/4)",
                "versions": records.versions()}


def text_tokens(scored: list[tuple], length: int) -> list:
    """The log-probs of the tokens that start inside the text's first ``length`` characters (the text cut at a
    stop string): the token that completes the stop string, which llama-cpp-python returns, is left out, as the
    hf backend leaves it out. Without token strings every value is kept."""
    if any(not isinstance(t, str) for t, _ in scored):
        return [v for _, v in scored]
    out, start = [], 0
    for t, v in scored:
        if start >= length:
            break
        out.append(v)
        start += len(t)
    return out
