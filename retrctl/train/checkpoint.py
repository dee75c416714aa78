"""What training keeps on disk: the output directory (what may be replaced), checkpoints (listed, loaded without
running code), RNG states.

Nothing lost, nothing executed. ``check_output`` runs before any model is loaded: ``-o`` must be new,
empty, or a retrctl model (``retrctl.json`` and only the files ``Encoder.save`` and the trainer write), the latter
replaced only with ``overwrite``; a ``.partial`` holding anything else is refused, and one holding checkpoints is
continued with ``resume`` or discarded with ``overwrite``, never silently.

Loading a checkpoint never runs code: a pickle can call anything, and ``<output>.partial`` is just a directory.
Every checkpoint file goes through ``load_tensors`` (``torch.load(weights_only=True)``: tensors, containers,
numbers, strings); RNG states are saved as exactly those types. DeepSpeed's ``load_checkpoint`` reads its files
with an unrestricted unpickler (deepspeed 0.19 ``TorchCheckpointEngine.load``), so for resume its engine's loader
is swapped for ``load_tensors`` allowing the three DeepSpeed classes its ZeRO 0-3 files hold
(``deepspeed_globals``), and every file is first scanned (``_scan``) for any other global before DeepSpeed sees it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from retrctl import records
from retrctl.records import RecordError
from retrctl.train.config import resume_conflicts

if TYPE_CHECKING:
    from retrctl.train.config import TrainConfig

# ---------------------------------------------------------------- the output directory

# What Encoder.save (transformers' save_pretrained included) and the trainer write into a model directory; a
# directory with anything else in it is not retrctl's to replace: it may hold a user's files.
MODEL_FILES = ("retrctl.json", "train_config.json", "metrics.jsonl", "guard.json", "modules.json", "sentence_bert_config.json",
               "config_sentence_transformers.json", "config.json", "generation_config.json", "model.safetensors",
               "model-*-of-*.safetensors", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "added_tokens.json", "tokenizer.model", "vocab.txt", "vocab.json", "merges.txt",
               "spiece.model", "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json")
MODEL_DIRS = {"1_Pooling": ("config.json",), "2_Normalize": ()}
SCRATCH_FILES = ("metrics.jsonl.tmp",)  # besides checkpoints/, in <output>.partial only (an earlier retrctl's temp name)


def foreign_files(d: Path, partial: bool = False) -> list[str]:
    """Entries of ``d`` that no retrctl model (``partial``: or training scratch, i.e. checkpoints) contains."""
    out, names = [], MODEL_FILES + (SCRATCH_FILES if partial else ())
    for p in sorted(d.iterdir()):
        real_dir = p.is_dir() and not p.is_symlink()
        if real_dir and p.name in MODEL_DIRS:
            out += [f"{p.name}/{q.name}" for q in sorted(p.iterdir()) if q.name not in MODEL_DIRS[p.name] or not q.is_file()]
        elif real_dir and partial and p.name == "checkpoints":
            out += [f"checkpoints/{q.name}" for q in sorted(p.iterdir())
                    if not (q.is_dir() and not q.is_symlink() and re.fullmatch(r"step-\d+(\.tmp)?", q.name))]
        elif real_dir and partial and p.name == "teacher":  # a teacher's vectors of the corpus (train/distill.py)
            out += [f"teacher/{q.name}" for q in sorted(p.iterdir())
                    if not (q.is_file() and re.fullmatch(r"(query|passage)-\d+(\.tmp)?\.(npy|json)",
                                                         records.temp_target(q.name) or q.name))]
        elif partial and p.is_file() and records.temp_target(p.name) == "metrics.jsonl":  # a rewrite's, killed
            continue
        elif not (p.is_file() and any(fnmatch.fnmatchcase(p.name, pat) for pat in names)):
            out.append(p.name + ("/" if p.is_dir() else ""))
    return out


def _is_model(d: Path) -> bool:
    try:
        return isinstance(json.loads((d / "retrctl.json").read_text()), dict)
    except (OSError, ValueError):
        return False


def _names(files: list[str]) -> str:
    return ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")


def check_output(output, cfg: TrainConfig) -> None:
    """Refuse (exit 2), before anything is loaded or written, an ``-o`` whose replacement would lose data."""
    out = Path(output)
    if out.name in ("", ".", ".."):
        raise records.RecordError(out, message="give -o a new directory's name, not '.', '..' or '/'")
    partial = out.with_name(out.name + ".partial")
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise records.RecordError(out, message="exists and is not a directory: choose another -o")
        if any(out.iterdir()):
            foreign = foreign_files(out) or ([] if _is_model(out) else ["no retrctl.json"])
            if foreign:
                raise records.RecordError(out, message=f"is not empty and not a retrctl model ({_names(foreign)}): retrctl "
                                                        "replaces only its own models, even with --overwrite; choose another -o")
            if not cfg.overwrite:
                raise records.RecordError(out, message="is a retrctl model already: give --overwrite to replace it, or choose another -o")
    if partial.exists() or partial.is_symlink():
        if not partial.is_dir() or partial.is_symlink():
            raise records.RecordError(partial, message="is in the way of training's scratch directory: remove it or choose another -o")
        foreign = foreign_files(partial, partial=True)
        if foreign:
            raise records.RecordError(partial, message=f"holds files retrctl did not write ({_names(foreign)}): move them away "
                                                        "or choose another -o")
        done = checkpoints(partial / "checkpoints")
        if done and not cfg.resume and not cfg.overwrite:
            raise records.RecordError(partial, message=f"holds checkpoints of an earlier run (newest {done[-1].name}): give "
                                                        "--resume to continue it, or --overwrite to discard them")


def clear_partial(partial: Path) -> None:
    """Empty ``<output>.partial`` for a fresh start (``check_output`` has seen only retrctl's files there)."""
    for p in partial.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def read_state(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise records.RecordError(path, message="missing from the checkpoint; delete the checkpoint to resume from an earlier one") from None
    except (OSError, ValueError) as e:
        raise records.RecordError(path, message=f"damaged checkpoint file ({e}); delete the checkpoint to resume from an earlier one") from None
    if not isinstance(data, dict):
        raise records.RecordError(path, message="damaged checkpoint file (not a JSON object)")
    return data


# ---------------------------------------------------------------- checkpoints

RESTART = "delete it (or the whole .partial directory) and start over"


def deepspeed_globals() -> list[type]:
    """The classes besides tensors and containers that DeepSpeed 0.19 pickles into ZeRO 0-3 checkpoints (fp32 and
    bf16; found with torch.serialization.get_unsafe_globals_in_checkpoint): plain data, no code runs to build them."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def _refuse(path, e: Exception) -> RecordError:
    if isinstance(e, FileNotFoundError):
        return RecordError(path, message=f"missing from the checkpoint; {RESTART}")
    if isinstance(e, pickle.UnpicklingError):
        m = re.search(r"GLOBAL (\S+)|Unsupported operand \d+|Unsupported class \S+", str(e))
        what = f" (it asks for {m.group(1) or m.group(0)})" if m else ""
        return RecordError(path, message=f"not a plain-tensor checkpoint{what}: refusing to unpickle it, as that could run "
                                         f"code; retrctl did not write this file: {RESTART}")
    first = str(e).split(". ")[0].splitlines()[0] if str(e) else type(e).__name__
    return RecordError(path, message=f"damaged checkpoint file ({first}); {RESTART}")


def load_tensors(path, map_location=None, allow: list[type] = ()):
    """``torch.load`` that never runs code: ``weights_only=True`` (tensors, containers, numbers, strings) plus the
    classes in ``allow``. Anything else, a damaged or a missing file is bad input: exit 2 naming the file."""
    try:
        with torch.serialization.safe_globals(list(allow)):
            return torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as e:
        raise _refuse(path, e) from None


def _scan(path: Path, allowed: set[str]) -> None:
    """Refuse a file that names any global outside torch's weights-only set and ``allowed`` (reads the pickle
    opcodes only, not the tensors); a file that is not torch's zip format is refused too."""
    try:
        unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(path)) - allowed
    except (RuntimeError, ValueError, OSError, pickle.UnpicklingError) as e:
        raise _refuse(path, e if isinstance(e, OSError) else pickle.UnpicklingError("not a torch zip file")) from None
    if unsafe:
        raise _refuse(path, pickle.UnpicklingError(f"GLOBAL {sorted(unsafe)[0]}"))


def rng_state() -> dict:
    """Every generator's state as tensors, numbers and lists only, so it loads with weights_only=True."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    version, mt, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": {"kind": kind, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "gauss": float(gauss)},
            "python": {"version": version, "state": list(mt), "gauss_next": gauss_next},
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    n = s["numpy"]
    np.random.set_state((n["kind"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = s["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a kill mid-save leaves only a step-N.tmp, which is ignored)."""
    found = [p for p in root.glob("step-*") if p.is_dir() and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


@dataclasses.dataclass
class Position:
    """Where a run is, as a checkpoint records it."""

    step: int = 0  # optimizer steps done
    epoch: int = 0
    batch_in_epoch: int = 0  # global batches of this epoch already trained
    groups_consumed: int = 0  # groups read from the input so far (the stream offset)


def resume_point(root: Path, cfg: TrainConfig, *, world: int, data_hash: str, groups: bool) -> Path | None:
    """The newest checkpoint under ``root``, refused (exit 2) if it was written for other data (``data_hash``),
    settings or process count (``world``); None when there is none."""
    found = checkpoints(root)
    if not found:
        return None
    d = found[-1]
    state = read_state(d / "trainer_state.json")
    if state.get("world_size") != world:
        raise RecordError(d, message=f"written by {state.get('world_size')} processes; resume with the same number (now {world})")
    differ = resume_conflicts(read_state(d / "train_config.json"), cfg, groups=groups)
    if state.get("data_hash") != data_hash:
        differ.insert(0, "the data (groups, or the text of the docs they name)")
    if differ:
        raise RecordError(d, message=f"--resume: this run differs from the checkpoint in {'; '.join(differ)}. Rerun with "
                                     "the checkpoint's data and settings (its train_config.json), or drop --resume and "
                                     "give --overwrite to start over")
    return d


def legacy_keys(module: torch.nn.Module) -> None:
    """Let ``module`` (the Encoder being trained) load checkpoints written by earlier retrctl,
    which trained a wrapper around it, whose weights are named ``enc.<name>``."""

    def hook(state_dict, prefix, *_):
        old = prefix + "enc."
        for key in [k for k in state_dict if k.startswith(old)]:
            state_dict[prefix + key[len(old):]] = state_dict.pop(key)

    module._register_load_state_dict_pre_hook(hook)
