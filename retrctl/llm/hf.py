"""The ``hf`` backend: a local Hugging Face causal LM (any directory or GGUF file; shipped names resolve through
``retrctl.models.resolve``).

Prompts are batched longest first with left padding, in batches that fit the memory free now (memory.py); rows
stop at EOS or at a stop string (a stopping criterion per row). Decoding uses only the parameters given, never the
model's own ``generation_config`` defaults, so a manifest fully describes it. Sampling is Gumbel-max with one
generator per row, so a prompt's output does not depend on its batch (nor on a resume).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from retrctl import records
from retrctl.hashing import weights_fingerprint
from retrctl.llm.base import LLM, cut_at_stop, pairs, row_seeds, sha


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
        prompts, conts, single = pairs(prompt, continuation)
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

    Equivalent to sampling from softmax(processed logits), but a row's draws depend only on its own seed and the
    device, so a prompt gets the same output whatever batch it lands in (and on resume on the same device)."""

    def __init__(self, seeds: list[int | None], device):
        import torch

        # the generators live on the logits' device: drawn on the CPU, a batch of 128 rows' noise over a 49k
        # vocabulary costs ~85 ms a decoding step, more than the step itself on a GPU
        self.gens = []
        for s in seeds:
            g = torch.Generator(device=device)
            g.manual_seed(s if s is not None else random.getrandbits(63))
            self.gens.append(g)
        self.device = device

    def __call__(self, input_ids, scores):
        import torch

        noise = torch.stack([torch.rand(scores.size(-1), generator=g, device=self.device) for g in self.gens])
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

