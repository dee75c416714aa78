"""Generation backends shared by qgen and rerank: a local Hugging Face causal LM, or any OpenAI-compatible server.

``load_llm(name_or_path, backend="hf"|"openai", base_url=None, **opts)`` returns an ``LLM``:

- ``generate(prompts, max_new_tokens=32, temperature=0.0, top_p=1.0, stop=None, seed=None, details=False)``:
  one completion per prompt, in input order. A prompt is a string (sent as is) or a list of chat messages
  ``[{"role", "content"}]`` (rendered with the model's chat template when it has one). ``seed`` is an int or one
  int per prompt: sampling is seeded per prompt, so a prompt's output does not depend on which other prompts
  share its batch (local backend: Gumbel-max sampling with one generator per row). ``details=True`` returns
  ``{"text", "logprob", "tokens"}`` per prompt, ``logprob`` being the mean raw log-prob of the kept tokens
  (InPars' query score, free from the generation pass).
- ``logprobs(prompt, continuation)``: mean token log-prob of ``continuation`` given ``prompt`` (lists of both give
  a list): InPars' score filter and pointwise reranking.
- ``count_tokens(text)``, ``render(prompt)`` (the text the model sees), ``usage`` (calls, prompt and generated
  tokens, retries) and ``describe()`` (backend, model path and fingerprint, chat-template hash, library versions:
  what manifests and run headers record, since results drift across stacks: rank_llm#410, tevatron#112).

The ``hf`` backend loads any causal-LM directory or GGUF file (shipped names and GGUF go through
``retrctl.models.resolve``), batches prompts longest first with left padding, and stops rows at EOS or at a stop
string (a stopping criterion per row). Decoding uses only the parameters given here, never the model's own
``generation_config`` defaults, so a manifest fully describes it. The ``openai`` backend talks to any
OpenAI-compatible server (vLLM, llama.cpp, TGI) over ``/v1/chat/completions`` and ``/v1/completions`` with
stdlib HTTP: a thread pool for concurrency, a timeout per request, retries with exponential backoff on
connection errors, 429 and 5xx (honouring Retry-After). Local servers need no key: a dummy bearer token is sent
when ``OPENAI_API_KEY`` is unset (rank_llm#410). ``logprobs`` on a server needs ``/v1/completions`` with
``echo`` and ``logprobs`` (vLLM has them; llama.cpp's server does not).

``Checkpoint`` is the append-only JSONL both LLM stages resume from: LLM calls are the expensive part, so a
re-run never repeats one that finished.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import http.client
import json
import logging
import math
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from retrctl import records
from retrctl.hashing import stable_int, weights_fingerprint

log = logging.getLogger("retrctl.llm")

BACKENDS = ("hf", "openai")


def load_llm(name_or_path, backend: str = "hf", base_url: str | None = None, **opts) -> LLM:
    """An LLM behind one interface. hf opts: device, dtype, batch_size, tokenizer_only.
    openai opts: concurrency, timeout, max_retries, backoff, tokenizer, api_key."""
    backend = backend or "hf"
    if backend == "hf":
        if base_url:
            raise ValueError("--base-url is for --backend openai")
        return HFLLM(name_or_path, **opts)
    if backend == "openai":
        return OpenAILLM(str(name_or_path), base_url=base_url, **opts)
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def llm_from_flags(name, opts: dict) -> LLM:
    """Pop the shared LLM flags (--backend, --base-url, --concurrency, --timeout, --max-retries) from a command's
    options and load the LLM with those that apply to its backend; --batch-size (left for the stage) also sets
    the hf backend's batch."""
    backend = opts.pop("backend", None) or "hf"
    base_url = opts.pop("base_url", None)
    server = {k: opts.pop(k, None) for k in ("concurrency", "timeout", "max_retries")}
    batch_size = opts.get("batch_size")
    if backend == "openai":
        kw = {k: v for k, v in server.items() if v is not None}
    else:
        if any(v is not None for v in server.values()) or base_url:
            log.warning("--base-url/--concurrency/--timeout/--max-retries apply to --backend openai only")
        base_url, kw = None, ({"batch_size": batch_size} if batch_size else {})
    return load_llm(name, backend, base_url, **kw)


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


def _pairs(prompt, continuation):
    """(list of prompts, list of continuations, single?) from scalar or list arguments."""
    if isinstance(continuation, str):
        return [prompt], [continuation], True
    conts = list(continuation)
    prompts = list(prompt) if isinstance(prompt, (list, tuple)) and not is_messages(prompt) else [prompt] * len(conts)
    if len(prompts) != len(conts):
        raise ValueError(f"{len(prompts)} prompts for {len(conts)} continuations")
    return prompts, conts, False


# ---------------------------------------------------------------- local Hugging Face causal LM


class HFLLM(LLM):
    backend = "hf"

    def __init__(self, name_or_path, *, device: str | None = None, dtype: str | None = None, batch_size: int = 8,
                 tokenizer_only: bool = False):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from retrctl.models import DTYPES, ensure_pad_token, resolve

        super().__init__(str(name_or_path))
        self.path = resolve(name_or_path)
        self.batch_size = max(1, int(batch_size))
        self.tokenizer = tok = ensure_pad_token(AutoTokenizer.from_pretrained(str(self.path)))
        bos = tok.bos_token_id
        self._bos = [bos] if bos is not None and tok("a")["input_ids"][:1] == [bos] else []
        self.model = None
        self.dtype = dtype or "fp32"
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if not tokenizer_only:
            self.model = AutoModelForCausalLM.from_pretrained(str(self.path), dtype=getattr(torch, DTYPES[self.dtype]))
            self.model.to(self.device).eval()
        cfg_eos = getattr(self.model.generation_config, "eos_token_id", None) if self.model is not None else None
        eos = {tok.eos_token_id} | set(cfg_eos if isinstance(cfg_eos, list) else [cfg_eos])
        self.eos_ids = sorted(e for e in eos if e is not None)
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None) if self.model is not None else None

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def render(self, prompt) -> str:
        if isinstance(prompt, str) or not self.has_chat_template:
            return super().render(prompt)
        return self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)

    def _ids(self, text: str) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        bos_text = self.tokenizer.bos_token
        return (self._bos + ids) if self._bos and not (bos_text and text.startswith(bos_text)) else ids

    def count_tokens(self, text) -> int:
        return len(self._ids(self.render(text)))

    def _need_model(self):
        if self.model is None:
            raise RuntimeError("this LLM was loaded with tokenizer_only=True")

    def _batches(self, rows: list[list[int]], new_tokens: int = 0, logits_kept: int = 1):
        """Longest first, in batches of --batch-size or fewer when that many rows (KV cache, prefill, logits at
        the longest row's width) would not fit in the memory free now (memory.py)."""
        from retrctl import memory

        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        if not order:
            return
        per_row = memory.generation_per_row(self.model.config, len(rows[order[0]]), new_tokens, logits_kept,
                                            next(self.model.parameters()).element_size())
        size = memory.fit_batch(per_row, self.batch_size, str(self.device), what=f"generation ({self.name})")
        for s in range(0, len(order), size):
            yield order[s : s + size]

    def _left_pad(self, rows: list[list[int]]):
        from retrctl.models import pad_ids

        batch = pad_ids(rows, self.tokenizer.pad_token_id, left=True)
        return batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)

    def _check_length(self, n: int, extra: int) -> None:
        if self.max_positions and n + extra > self.max_positions:
            self.warn_once("ctx", "a prompt of %d tokens + %d new exceeds the model's %d positions; output may be garbage",
                           n, extra, self.max_positions)

    def generate(self, prompts, *, max_new_tokens: int = 32, temperature: float = 0.0, top_p: float = 1.0,
                 stop: Sequence[str] | None = None, seed=None, details: bool = False) -> list:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        self._need_model()
        prompts = list(prompts)
        seeds = row_seeds(seed, len(prompts))
        rows = [self._ids(self.render(p)) for p in prompts]
        out: list = [None] * len(prompts)
        t0 = time.perf_counter()
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=self.eos_ids or None,
                                  pad_token_id=self.tokenizer.pad_token_id, return_dict_in_generate=True,
                                  output_logits=details)
        for idx in self._batches(rows, max_new_tokens, max_new_tokens if details else 1):
            batch = [rows[i] for i in idx]
            for r in batch:
                self._check_length(len(r), max_new_tokens)
            ids, mask = self._left_pad(batch)
            procs = LogitsProcessorList()
            if temperature and temperature > 0:
                from transformers import TemperatureLogitsWarper, TopPLogitsWarper

                procs.append(TemperatureLogitsWarper(float(temperature)))
                if top_p < 1.0:
                    procs.append(TopPLogitsWarper(float(top_p)))
                procs.append(_GumbelSampler([seeds[i] for i in idx], self.device))
            stopping = StoppingCriteriaList([_StopStrings(self.tokenizer, stop, ids.size(1))]) if stop else None
            with torch.inference_mode():
                res = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                          logits_processor=procs, stopping_criteria=stopping)
            new = res.sequences[:, ids.size(1) :].tolist()
            logits = torch.stack(res.logits, 1).float().log_softmax(-1) if details else None
            for b, i in enumerate(idx):
                text, kept, spent = self._finish(new[b], stop)
                self._count(calls=1, prompt_tokens=len(rows[i]), generated_tokens=spent)
                if details:
                    lp = logits[b, torch.arange(kept), torch.tensor(new[b][:kept], dtype=torch.long)] if kept else None
                    out[i] = {"text": text, "logprob": float(lp.mean()) if kept else None, "tokens": kept}
                else:
                    out[i] = text
        self._count(seconds=time.perf_counter() - t0)
        return out

    def _finish(self, ids: list[int], stop) -> tuple[str, int, int]:
        """(text cut at EOS/stop, tokens kept for the text, tokens the model spent)."""
        end = next((k for k, t in enumerate(ids) if t in self.eos_ids), len(ids))
        spent = min(end + 1, len(ids))
        text = self.tokenizer.decode(ids[:end], skip_special_tokens=True)
        text, found = cut_at_stop(text, stop)
        kept = end
        if found:  # the token that completes the stop string is the last one spent; tokens before it are the text
            for k in range(1, end + 1):
                if cut_at_stop(self.tokenizer.decode(ids[:k], skip_special_tokens=True), stop)[1]:
                    # text before the stop inside that token: score the token rather than nothing
                    kept, spent = (k - 1 if k > 1 or not text.strip() else 1), k
                    break
        return text.strip(), kept, spent

    def logprobs(self, prompt, continuation):
        import torch

        self._need_model()
        prompts, conts, single = _pairs(prompt, continuation)
        p_rows = [self._ids(self.render(p)) for p in prompts]
        c_rows = [self.tokenizer(c, add_special_tokens=False)["input_ids"] for c in conts]
        if any(not c for c in c_rows) or any(not p for p in p_rows):
            raise ValueError("logprobs needs a non-empty prompt and continuation")
        rows = [p + c for p, c in zip(p_rows, c_rows, strict=True)]
        out = [0.0] * len(rows)
        t0 = time.perf_counter()
        for idx in self._batches(rows, 0, max(len(c) for c in c_rows) + 1):
            ids, mask = self._left_pad([rows[i] for i in idx])
            keep = max(len(c_rows[i]) for i in idx) + 1
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            with torch.inference_mode():
                logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=keep).logits
            logp = logits.float().log_softmax(-1)
            for b, i in enumerate(idx):
                c = c_rows[i]
                # logits at kept index j predict the token at position width - keep + j + 1
                steps = torch.arange(keep - len(c) - 1, keep - 1, device=logp.device)
                out[i] = float(logp[b, steps, torch.tensor(c, device=logp.device)].mean())
                self._count(calls=1, prompt_tokens=len(rows[i]))
        self._count(seconds=time.perf_counter() - t0)
        return out[0] if single else out

    def describe(self) -> dict:
        tmpl = getattr(self.tokenizer, "chat_template", None)
        return {"backend": "hf", "model": self.name, "path": str(self.path), "revision": weights_fingerprint(self.path),
                "chat_template": sha(tmpl) if isinstance(tmpl, str) else None, "dtype": self.dtype,
                "device": str(self.device), "versions": records.versions()}


class _GumbelSampler:
    """Sampling as argmax(logits + Gumbel noise), the noise drawn from one generator per row.

    Equivalent to sampling from softmax(processed logits), but a row's draws depend only on its own seed, so a
    prompt gets the same output whatever batch it lands in (and on resume)."""

    def __init__(self, seeds: list[int | None], device):
        import torch

        self.gens = []
        for s in seeds:
            g = torch.Generator(device="cpu")
            g.manual_seed(s if s is not None else random.getrandbits(63))
            self.gens.append(g)
        self.device = device

    def __call__(self, input_ids, scores):
        import torch

        noise = torch.stack([torch.rand(scores.size(-1), generator=g) for g in self.gens]).to(scores.device)
        gumbel = -torch.log(-torch.log(noise.clamp(1e-20, 1.0 - 1e-7)))
        return scores + gumbel.to(scores.dtype)


class _StopStrings:
    """Per-row stopping criterion: a row is done once its new text contains a stop string."""

    def __init__(self, tokenizer, stop, prompt_width: int):
        self.tokenizer, self.stop, self.start = tokenizer, [s for s in stop if s], prompt_width

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        done = [any(s in self.tokenizer.decode(row[self.start :], skip_special_tokens=True) for s in self.stop)
                for row in input_ids.tolist()]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


# ---------------------------------------------------------------- OpenAI-compatible server

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class ServerError(RuntimeError):
    pass


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
                    raise ServerError(f"{url}: {last}") from None
                with contextlib.suppress(TypeError, ValueError):
                    wait = float(e.headers.get("Retry-After"))
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            except json.JSONDecodeError as e:
                last = f"invalid JSON in response ({e.msg})"
            if attempt == self.max_retries:
                break
            delay = wait if wait is not None else self.backoff * (2**attempt) * (1 + 0.1 * random.random())
            self._count(retries=1)
            log.debug("%s failed (%s); retry %d in %.2fs", url, last, attempt + 1, delay)
            time.sleep(min(delay, 60.0))
        raise ServerError(f"{url}: failed after {self.max_retries + 1} attempts; last error {last}")

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
                choice = res["choices"][0]
                text = choice.get("text", "")
                lps = (choice.get("logprobs") or {}).get("token_logprobs")
            else:
                if not is_messages(p):
                    raise TypeError("a prompt is a string or a list of {role, content} messages")
                payload["messages"] = p
                if details:
                    payload["logprobs"] = True
                res = self._post("/chat/completions", payload)
                choice = res["choices"][0]
                text = (choice.get("message") or {}).get("content") or ""
                content = (choice.get("logprobs") or {}).get("content")
                lps = [t.get("logprob") for t in content] if content else None
            text, _ = cut_at_stop(text, stop)
            usage = res.get("usage") or {}
            self._count(calls=1, prompt_tokens=int(usage.get("prompt_tokens") or self.count_tokens(p)),
                        generated_tokens=int(usage.get("completion_tokens") or 0))
            if not details:
                return text.strip()
            lps = [x for x in lps or [] if x is not None]
            return {"text": text.strip(), "logprob": sum(lps) / len(lps) if lps else None, "tokens": len(lps)}

        t0 = time.perf_counter()
        out = self._map(one, len(prompts))
        self._count(seconds=time.perf_counter() - t0)
        return out

    def logprobs(self, prompt, continuation):
        prompts, conts, single = _pairs(prompt, continuation)

        def one(i):
            p, c = self.render(prompts[i]), conts[i]
            if not p or not c:
                raise ValueError("logprobs needs a non-empty prompt and continuation")
            res = self._post("/completions", {"model": self.name, "prompt": p + c, "max_tokens": 1, "echo": True,
                                              "logprobs": 1, "temperature": 0.0})
            lp = (res["choices"][0].get("logprobs") or {})
            offsets, values = lp.get("text_offset"), lp.get("token_logprobs")
            if not offsets or not values:
                raise ServerError(f"{self.base_url}: the server returned no prompt log-probs (needs echo + logprobs "
                                  "on /v1/completions, as vLLM has); use --backend hf")
            picked = [v for o, v in zip(offsets, values, strict=False) if v is not None and len(p) <= o < len(p) + len(c)]
            if not picked:  # a token straddling the boundary: score the last prompt-side token
                picked = [next(v for o, v in reversed(list(zip(offsets, values, strict=False))) if v is not None and o < len(p) + len(c))]
            usage = res.get("usage") or {}
            self._count(calls=1, prompt_tokens=int(usage.get("prompt_tokens") or 0),
                        generated_tokens=int(usage.get("completion_tokens") or 0))
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


# ---------------------------------------------------------------- resumable work


class CheckpointMismatch(ValueError):
    pass


_HEADER = b'{"checkpoint": '


class Checkpoint:
    """Append-only JSONL of finished work for resumable LLM jobs.

    ``resume(settings)`` returns the rows already done; the file's first line records the settings that produced
    them, and resuming with other settings is refused, so a file never mixes two configurations. A line torn by
    a kill mid-write (only the last line can be: rows are appended whole) is cut off. A file that is not a
    checkpoint, or one damaged before its end, is refused and left as it is: cutting it would destroy a
    user's file given by mistake. ``append(rows)`` writes and flushes."""

    def __init__(self, path):
        self.path = Path(path)
        self.settings: dict | None = None
        self._f = None

    def resume(self, settings: dict) -> list[dict]:
        self.settings = json.loads(json.dumps(settings, default=str))
        if not self.path.exists() or self.path.stat().st_size == 0:
            return []
        rows, good = [], 0
        with open(self.path, "rb") as f:
            for n, line in enumerate(f):
                if not line.endswith(b"\n"):  # killed mid-write: the line may parse, yet the next append would join it
                    if n == 0 and not _HEADER.startswith(line[: len(_HEADER)]):
                        raise CheckpointMismatch(f"{self.path} is not a retrctl checkpoint: delete it or write elsewhere")
                    break
                try:
                    obj = json.loads(line)
                except ValueError:  # JSONDecodeError, UnicodeDecodeError
                    obj = None
                if n == 0 and not (isinstance(obj, dict) and "checkpoint" in obj):
                    raise CheckpointMismatch(f"{self.path} is not a retrctl checkpoint (no header line): delete it or "
                                             "write elsewhere")
                if not isinstance(obj, dict):
                    raise CheckpointMismatch(f"{self.path}:{n + 1}: damaged checkpoint line (not a JSON object): delete "
                                             "the file or write elsewhere")
                if n == 0:
                    old = obj.get("settings")
                    if old != self.settings:
                        diff = sorted(k for k in set(old or {}) | set(self.settings)
                                      if (old or {}).get(k) != self.settings.get(k))
                        raise CheckpointMismatch(f"{self.path} was made with other settings (differ in: "
                                                 f"{', '.join(diff) or 'format'}); delete it or write elsewhere")
                else:
                    rows.append(obj)
                good += len(line)
        if good < self.path.stat().st_size:
            log.warning("%s: dropping a torn last line (interrupted write)", self.path)
            with open(self.path, "r+b") as f:
                f.truncate(good)
        return rows

    def append(self, rows: list[dict]) -> None:
        if self.settings is None:
            raise RuntimeError("call resume(settings) before append")
        if self._f is None:
            fresh = not self.path.exists() or self.path.stat().st_size == 0
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", encoding="utf-8")
            if fresh:
                self._f.write(json.dumps({"checkpoint": 1, "settings": self.settings}) + "\n")  # starts with _HEADER
        for r in rows:
            self._f.write(json.dumps(r, ensure_ascii=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
