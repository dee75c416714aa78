"""Learning the Sheared-LLaMA masks (shaping.py) and cutting the model to the target shape.

Two objectives (``--objective``), trained jointly with the model's weights as LLM-Shearing does:
- ``lm``: next-token loss on calibration text, the model run causally (DRAMA pruned its LLM as a language model
  before turning it into a retriever). The LM head is the tied input embeddings (masked like them) or the
  source's ``lm_head.weight``; a dir without one is refused.
- ``contrastive``: InfoNCE on retrieval groups through ``retrctl train``'s Trainer, the Lagrangian added as its
  per-step penalty (as self-slimming's L0 term is), the encoder run as it retrieves.
Then the masks become binary (every block keeps the same top-k), are folded into the weights, and the zeroed
units are removed; the small model is compared with the masked one (``check_same``) before it is returned.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

import torch

from retrctl import records
from retrctl.prune import shaping, work
from retrctl.prune.surgery import PruneError

log = logging.getLogger("retrctl.prune")
OBJECTIVES = ("lm", "contrastive")


def lm_head_weight(model, weights_dir) -> torch.Tensor | None:
    """The untied LM head of the source (None when the head is the input embeddings)."""
    if getattr(model.config, "tie_word_embeddings", False):
        return None
    from safetensors import safe_open

    for f in sorted(Path(weights_dir).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            key = next((k for k in st.keys() if k.endswith("lm_head.weight")), None)
            if key:
                return st.get_tensor(key).to(next(model.parameters()).dtype)
    raise PruneError(f"--objective lm needs the model's LM head: {weights_dir} has no lm_head.weight and its embeddings "
                     "are not tied (an encoder dir saved without the head): use --objective contrastive")


def _lm_loss(model, tok, rows: list[str], head, max_length: int) -> torch.Tensor:
    """Mean next-token cross-entropy of ``rows`` (right-padded; padding not scored)."""
    device = next(model.parameters()).device
    batch = tok(rows, truncation=True, max_length=max_length, padding=True, return_tensors="pt").to(device)
    h = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).last_hidden_state
    w = model.get_input_embeddings().weight if head is None else head  # the embeddings are masked like the stream
    labels = batch["input_ids"][:, 1:].masked_fill(batch["attention_mask"][:, 1:] == 0, -100)
    return torch.nn.functional.cross_entropy((h[:, :-1] @ w.T).flatten(0, 1).float(), labels.flatten())


@contextlib.contextmanager
def causal_lm(enc):
    """The encoder's model run as a language model: causal attention, right padding; restored afterwards."""
    from retrctl.models.backbone import set_bidirectional

    model, tok = enc.model, enc.tokenizer
    causal, side, training = getattr(model.config, "is_causal", True), tok.padding_side, model.training
    set_bidirectional(model.config, False)
    tok.padding_side = "right"  # positions count from the first token
    try:
        yield
    finally:
        set_bidirectional(model.config, not causal)
        tok.padding_side = side
        model.train(training)


def learn_lm(enc, masks, texts: list[str], head: torch.Tensor | None, *, steps: int, batch_size: int, max_length: int,
             lr: float, checkpoint=None, save_steps: int = 0, save_minutes: float = 0.0, progress=None) -> dict:
    """``steps`` steps of next-token loss + the Lagrangian on ``texts`` (cycled in order), causal attention.
    ``checkpoint`` (a file): written every ``save_steps`` steps / ``save_minutes`` minutes (model and masks,
    optimizer, step, RNG), and continued from when it is there, so a resumed run ends where an uninterrupted one
    would. Returns the LM loss per step and the pruned model's (binary masks) on the first batch."""
    from retrctl.train.engines import param_groups

    model, tok = enc.model, enc.tokenizer
    head = None if head is None else head.to(next(model.parameters()).device)
    opt = torch.optim.AdamW(param_groups(model, 0.0), lr=lr)
    curve, start = [], 0
    if checkpoint is not None and Path(checkpoint).is_file():
        state = torch.load(checkpoint, weights_only=True)  # tensors, numbers, lists: no pickled code
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        start, curve = state["step"], state["curve"]
        log.info("resumed the target-shape masks from %s (step %d)", checkpoint, start)
    last_save = time.monotonic()
    with causal_lm(enc):
        model.train()
        it = range(start, steps)
        for step in progress(it, total=steps - start) if progress else it:
            rows = [texts[(step * batch_size + j) % len(texts)] for j in range(batch_size)]
            penalty = masks.step_penalty()
            lm = _lm_loss(model, tok, rows, head, max_length)
            (lm + penalty).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            curve.append(round(lm.item(), 4))
            log.debug("shape step %d: lm loss %.4f, penalty %.4f", step + 1, lm.item(), penalty.item())
            due = (save_steps and (step + 1) % save_steps == 0) or (save_minutes and time.monotonic() - last_save >= 60 * save_minutes)
            if checkpoint is not None and due and step + 1 < steps:
                _save(checkpoint, {"step": step + 1, "curve": curve, "model": model.state_dict(),
                                   "optimizer": opt.state_dict(), "rng": torch.get_rng_state()})
                last_save = time.monotonic()
        model.eval()
        with torch.no_grad():
            pruned = _lm_loss(model, tok, texts[:batch_size], head, max_length).item()
    return {"step": steps, "lm_loss": curve, "lm_loss_pruned": round(pruned, 4)}


def _save(path, state: dict) -> None:
    with records.atomic_path(path) as tmp:
        torch.save(state, tmp)
    log.info("checkpoint %s (step %d)", path, state["step"])


def learn_contrastive(enc, masks, groups, corpus, scratch, *, steps: int, **train_settings):
    """``steps`` steps of ``retrctl train``'s Trainer with the Lagrangian as its penalty, into ``scratch/shaped``
    (resumed from its checkpoints; not trained again when finished: the masks' state is kept beside it). Returns
    (the trained encoder with the final masks folded in, its last metrics)."""
    from retrctl.models import Encoder
    from retrctl.train.config import TrainConfig
    from retrctl.train.loop import Trainer

    out, saved = Path(scratch) / "shaped", Path(scratch) / "shape_masks.pt"
    if not (saved.is_file() and work.finished(out)):
        Trainer.build(TrainConfig(max_steps=steps, **train_settings), groups, corpus, out, encoder=enc,
                      penalty=masks.step_penalty, finish=lambda e: shaping.fold(e.model)).fit()
        _save(saved, {"step": steps, "masks": masks.state_dict()})
    masks.load_state_dict(torch.load(saved, weights_only=True)["masks"])
    return Encoder.load(out, device="cpu"), work.last_metrics(out)


@torch.no_grad()
def check_same(masked_model, small_model, tokenizer, texts: list[str], hidden_kept: torch.Tensor, max_length: int,
               rtol: float = 1e-4) -> float:
    """Max |diff| between the masked model's kept hidden dims and the small model's hidden states, relative to the
    largest |state|. The removal is exact in exact arithmetic, but cutting hidden dims scales every RMSNorm weight
    by √(d/d'), which float32 stores rounded (one ulp), and a deep model amplifies that: SmolLM2 cut to hidden 480
    and 24 blocks differs by ~3e-5 of its largest state (~300); stock transformers computes RMSNorm in float32 even
    for a float64 model, so no wider check is possible. A wrong cut differs by orders of magnitude more."""
    device = next(small_model.parameters()).device
    batch = tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt").to(device)
    a = masked_model(**batch).last_hidden_state[..., hidden_kept.to(device)]
    b = small_model(**batch).last_hidden_state
    m = batch["attention_mask"].bool()
    diff = (a[m] - b[m]).abs().max().item() / max(1.0, a[m].abs().max().item())
    if not diff <= rtol:
        raise RuntimeError(f"the pruned model's hidden states are {diff:.2e} (of the largest) away from the masked model's (> {rtol})")
    return diff


def shear(enc, target: dict[str, int], *, objective: str, steps: int, warmup: int, mask_lr: float, texts: list[str],
          groups, corpus, scratch, weights_dir, check_texts: list[str], max_length: int, train_settings: dict,
          progress=None):
    """Learn the masks, fold them, remove the pruned units (``train_settings``: batch_size, lr, save_steps,
    save_minutes and, for the contrastive objective, the rest of TrainConfig's keys; ``scratch``: where the
    training keeps what a resume continues from). Returns (the small Encoder, the binary masks, the
    log α of every mask, a report for prune.json)."""
    import copy

    cfg = enc.model.config
    full = shaping.check_target(enc.model, target)
    if objective not in OBJECTIVES:
        raise PruneError(f"--objective must be one of {', '.join(OBJECTIVES)}, not {objective!r}")
    head = lm_head_weight(enc.model, weights_dir) if objective == "lm" else None
    source = shaping.source_shape(cfg)
    masks = shaping.ShapeMasks(cfg, full, lr=mask_lr, warmup=warmup)
    if objective == "lm":
        with causal_lm(enc), torch.no_grad():
            unpruned = _lm_loss(enc.model.eval(), enc.tokenizer, texts[: train_settings["batch_size"]], head, max_length).item()
    shaping.attach(enc.model, masks)
    if objective == "lm":
        metrics = {"lm_loss_unpruned": round(unpruned, 4)} | learn_lm(
            enc, masks, texts, head, steps=steps, batch_size=train_settings["batch_size"], max_length=max_length,
            lr=train_settings["lr"], checkpoint=Path(scratch) / "shape-lm.pt", save_steps=train_settings.get("save_steps", 0),
            save_minutes=train_settings.get("save_minutes", 0.0), progress=progress)
        trained = enc
        shaping.fold(trained.model)
    else:
        trained, metrics = learn_contrastive(enc, masks, groups, corpus, scratch, steps=steps, **train_settings)
    kept = masks.kept(cfg)
    log_alpha = {k: m.log_alpha.detach().float().cpu() for k, m in masks.masks.items()}
    per_block = {k: masks.masks[k].nonzero_prob().detach().float().reshape(source["layers"], -1).mean(-1).tolist()
                 for k in ("layers", "heads", "intermediate") if k in masks.masks}
    sparsity = masks.report()
    masked = copy.deepcopy(trained.model).eval()
    got = shaping.reshape(trained.model, kept)
    if got != full:  # LLM-Shearing#74: the result must be the shape asked for
        raise RuntimeError(f"pruned to {got}, not the target {full}")
    diff = check_same(masked, trained.model, trained.tokenizer, check_texts, kept["hidden"], max_length)
    del masked
    log.info("shaped %s -> %s (%s objective, %d steps; removed vs masked: %.1e of the largest state)", source, got, objective, steps, diff)
    report = {"source": source, "target": full, "objective": objective, "steps": steps, "warmup": warmup,
              "mask_lr": mask_lr, "train": train_settings, "masks": sparsity, "metrics": metrics,
              "kept_layers": [i for i, k in enumerate(kept["layers"].tolist()) if k], "per_block": per_block,
              "masked_vs_removed": diff}
    return trained, kept, log_alpha, report
