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

Modules, one job each:

- ``base``: the ``LLM`` interface and the prompt helpers every backend shares (seeds per row, stop strings,
  plain rendering of messages).
- ``hf``: the local backend (``HFLLM``); ``server``: the OpenAI-compatible one (``OpenAILLM``).
- ``resume``: the append-only ``Checkpoint`` and ``resumable``, the one batch loop qgen and rerank run, so a
  re-run never repeats an LLM call that finished and writes what an uninterrupted run writes.
- ``flags``: the backend table, ``load_llm``, and the shared LLM flags turned into a loaded model.
- ``llamacpp``: llama-cpp-python's OpenAI-compatible server (the ``retrctl[llamacpp]`` extra) started on a GGUF
  file as a child process, for the recipe, the tests and the bench (not imported here).

Importing this package imports no torch: a backend imports it when it loads a model.
"""

from __future__ import annotations

from retrctl.llm.base import LLM, cut_at_stop, is_messages, plain_render, row_seeds, sha
from retrctl.llm.flags import BACKENDS, llm_from_flags, load_llm, planning_llm
from retrctl.llm.hf import HFLLM
from retrctl.llm.resume import Checkpoint, CheckpointMismatch, resumable
from retrctl.llm.server import RETRY_STATUS, OpenAILLM, ServerError

__all__ = ["BACKENDS", "LLM", "Checkpoint", "CheckpointMismatch", "HFLLM", "OpenAILLM", "RETRY_STATUS", "ServerError",
           "cut_at_stop", "is_messages", "llm_from_flags", "load_llm", "plain_render", "planning_llm", "resumable",
           "row_seeds", "sha"]

