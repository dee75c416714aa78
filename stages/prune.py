"""prune: make a retriever smaller by dropping its least important sub-layers or layers (EffiR coarse step, ShortGPT).

Method: EffiR (the coarse, layer-dropping step): the importance of an attention or MLP sub-layer is
1 − cos(x_in, x_out) of the residual stream around it, averaged over calibration passages; attention and MLP are
ranked as two separate groups and the least important of each are dropped; EffiR finds MLPs far more prunable
than attention in a retriever. Whole blocks are dropped by Block Influence, the same measure around a block
(ShortGPT, Men et al. 2024, arXiv:2403.03853). The model is not trained here: train it afterwards
(``retrctl prune … -o small/ && retrctl mine … | retrctl train --model small/ …``), as EffiR and DRAMA do.

Encoders (BERT family: all-MiniLM-L6-v2, BGE/E5-small, RoBERTa, ...) lose whole layers only: ``--drop-layers N``
removes the N layers of least Block Influence, ``--target-params F`` whole layers until the budget is met. Their
layers are post-LayerNorm (``h = LN(x + Attn(x))``), so an attention or MLP sub-layer cannot be taken out alone
(its LayerNorm stays on the stream; retrctl/prune/anatomy.py): the per-sub-layer 1 − cos is measured and reported,
and ``--drop-mlp``, ``--drop-attn``, ``--slim-mlp`` and ``--target-shape`` are refused. The output is a stock
sentence-transformers dir with fewer layers (``num_hidden_layers`` updated, the pooling and normalisation of the
source kept): ``SentenceTransformer(dir)`` loads it with no retrctl code.

EffiR's fine step, self-slimming of the MLP width (``--slim-mlp F``, retrctl/prune/slimming.py): a gate per MLP
neuron trained on retrieval groups with InfoNCE + λ·L0, the top F of all gates kept across layers, the mask frozen
and the model trained on with InfoNCE (``--heal-steps``); the training is ``retrctl train``'s ``Trainer``. When the
source is a trained retriever (a retrctl or sentence-transformers dir, or a shipped name that is one), the healing
also distils it, unpruned, as the teacher (``--heal-teacher``, on by default): the student's vectors of the groups'
queries and passages regress onto the source's (``train --embed-distill-weight 1``) and the source's scores of each
group's passages are distilled (``--distill-weight 1``), as ``train --teacher`` does.

| knob | flag | default |
|---|---|---|
| calibration passages (a corpus: JSONL/Parquet/BEIR folder) | ``--calibration FILE`` | required unless ``--scores`` |
| how many (EffiR: 256 task-agnostic passages) | ``--calibration-size`` | 256, sampled by a stable hash of the docid (``--seed``) |
| tokens per passage | ``--max-length`` | 256 |
| MLP / attention sub-layers to drop | ``--drop-mlp N``, ``--drop-attn N`` | 0 |
| whole blocks to drop (ShortGPT; decoders and encoders) | ``--drop-layers N`` | 0 |
| keep this fraction of non-embedding params: MLPs first (at most half), then blocks (encoders: blocks only) | ``--target-params F`` | off |
| reuse the scores of an earlier run (its prune.json) | ``--scores FILE`` | compute them |
| self-slimming: MLP neurons kept, ranked globally | ``--slim-mlp F`` with ``--groups FILE --corpus FILE`` | off |
| gate training / healing steps, L0 weight, gate learning rate | ``--slim-steps``, ``--heal-steps``, ``--slim-lambda``, ``--gate-lr`` | 20, 20, 1.0, 0.05 |
| heal by distillation from the unpruned source (a trained retriever) | ``--heal-teacher/--no-heal-teacher`` | on |
| the training batch (self-slimming) | ``--train-batch-size``, ``--train-group-size``, ``--lr`` | 32, 2, 2e-5 |

The calibration passes run the model as the encoder runs it (``--bidirectional``, prompts), so the scores
measure the retriever, not the LM. Output (``-o DIR``, atomic: nothing is left on failure): an encoder dir that
stock ``AutoModel.from_pretrained`` and ``SentenceTransformer`` load, with prune.json (scores, masks, counts,
calibration hash), importance.png and a model card; it is reloaded with stock code and compared (1e-5) before
it is moved into place. Why single removed sub-layers are stored as zeros (and skipped only in memory):
retrctl/prune/surgery.py.

Sheared-LLaMA's targeted structured pruning (``--target-shape layers=…,hidden=…,heads=…,intermediate=…``,
retrctl/prune/shaping.py and shearing.py; what DRAMA used to cut Llama-3.2-1B to 0.1B/0.3B): hard-concrete masks on
blocks, hidden dims, key/value head groups and MLP neurons, pushed to the target shape by Lagrange multipliers,
trained with the model on ``--objective lm`` (next-token loss on the calibration passages) or ``contrastive``
(InfoNCE on ``--groups``, through Trainer); the masks become binary with the same count in every block, and the
pruned units are removed: the result is a smaller **uniform** stock model of exactly the target shape.

| knob | flag | default |
|---|---|---|
| the shape to reach (any subset; the rest stays) | ``--target-shape`` | off |
| what the masks are trained on | ``--objective lm|contrastive`` | lm |
| mask training steps, Lagrangian warm-up steps, mask/multiplier learning rate | ``--shape-steps``, ``--shape-warmup``, ``--mask-lr`` | 20, a fifth of the steps, 1.0 (LLM-Shearing) |

Resume: the run works in ``-o``'s ``.partial`` (retrctl/prune/work.py): the importance scores, each training
phase's checkpoints (``--save-steps``, ``--save-minutes``) and the settings of the run; ``--resume`` continues an
interrupted run of the same settings; without it, what an earlier run left there is removed first.

Refusals (exit 2, one line, no output dir): nothing to drop, more layers than exist, ``--target-params`` with
``--drop-*`` or outside (0, 1), ``--slim-mlp`` outside (0, 1) or without ``--groups``, a model with neither
layout, ``--scores`` computed on another model, a ``--target-shape`` larger than the model or mixed with
the other methods, a sub-layer flag (``--drop-mlp``, ``--drop-attn``, ``--slim-mlp``, ``--target-shape``) for an
encoder-only model.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from retrctl import memory, records
from retrctl.hashing import stable_hex, weights_fingerprint
from retrctl.options import config_flag, encoder_overrides, options
from retrctl.stage import progress, stage
from retrctl.train.config import TrainConfig

log = logging.getLogger("retrctl.prune")

METHOD = "EffiR coarse step: sub-layer importance 1 - cos(x_in, x_out), attention and MLP ranked apart; blocks by ShortGPT Block Influence"
ENCODER_METHOD = "ShortGPT Block Influence: whole encoder layers ranked by 1 - cos(x_in, x_out), the least influential removed"
SHAPE_METHOD = "Sheared-LLaMA targeted structured pruning: hard-concrete masks on layers, hidden dims, heads and MLP neurons with Lagrange multipliers, then removed"
SLIM_METHOD = "EffiR fine step (self-slimming): MLP neuron gates trained with InfoNCE + L0, kept globally, mask frozen, healed"
# the reload check always sees these too (a --scores run may have no calibration texts)
CHECK_TEXTS = ["retrctl prune: the reload check.", "A second, longer text, so that the batch is padded and the mask is used."]


def calibration_texts(path, size: int = 256, seed: int = 0) -> list[str]:
    """``size`` passages of a corpus, chosen by a stable hash of (seed, docid): the same on any machine."""
    docs = sorted(records.read(path, "doc"), key=lambda d: stable_hex(seed, d["docid"]))[:size]
    texts = [t for t in (records.passage_text(d) for d in docs) if t.strip()]
    if not texts:
        raise records.RecordError(path, message="no passage with text to calibrate on")
    return texts


def read_scores(path, fingerprint: str, n_blocks: int) -> dict:
    """The importance scores of an earlier run's prune.json, refused if they were computed on another model."""
    try:
        saved = json.loads(Path(path).read_text())
        scores, source = saved["scores"], saved["source_fingerprint"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise records.RecordError(path, message=f"not a prune.json with scores ({type(e).__name__}: {e})") from None
    if source != fingerprint or len(scores.get("block", [])) != n_blocks:
        raise records.RecordError(path, field="source_fingerprint", message=f"scores of another model ({source}, "
                                  f"{len(scores.get('block', []))} blocks), not this one ({fingerprint}, {n_blocks} blocks)")
    return saved


def prune(model, *, output, calibration=None, calibration_size: int = 256, max_length: int = 256, drop_mlp: int = 0,
          drop_attn: int = 0, drop_layers: int = 0, target_params: float | None = None, scores=None,
          slim_mlp: float | None = None, groups=None, corpus=None, slim_steps: int = 20, heal_steps: int = 20,
          slim_lambda: float = 1.0, gate_lr: float = 0.05, target_shape: str | None = None, objective: str = "lm",
          shape_steps: int = 20, shape_warmup: int | None = None, mask_lr: float = 1.0, batch_size: int = 16,
          heal_teacher: bool = True, seed: int = 0, encoder_settings: dict | None = None, train_settings: dict | None = None,
          resume: bool = False, save_steps: int = 0, save_minutes: float = 10.0) -> Path:
    """Prune ``model`` and save it to ``output`` (see the module docstring). Returns the output dir."""
    run = {k: v for k, v in locals().items() if k not in PER_INVOCATION}  # what a --resume must match
    from retrctl.models import Encoder, resolve
    from retrctl.prune import anatomy, importance, shaping, slimming, surgery, work

    records.check_outputs([output], [model, calibration, scores, groups, corpus], dir_output=True)
    records.check_own_dir(output, "prune.json", "a retrctl prune output")  # an earlier prune output is replaced
    coarse = bool(drop_mlp or drop_attn or drop_layers or target_params is not None)
    shape = shaping.parse_target_shape(target_shape) if target_shape is not None else None
    if shape is not None:
        if coarse or slim_mlp is not None or scores is not None:
            raise surgery.PruneError("--target-shape learns what to remove itself: give it without --drop-*, --target-params, "
                                     "--slim-mlp or --scores")
        if objective == "lm" and calibration is None:
            raise surgery.PruneError("--target-shape with --objective lm trains on text: give --calibration FILE")
        if objective == "contrastive" and groups is None:
            raise surgery.PruneError("--target-shape with --objective contrastive trains on retrieval groups: give --groups "
                                     "FILE (from retrctl mine) and --corpus")
        return _shape(model, shape, output=output, calibration=calibration, calibration_size=calibration_size,
                      max_length=max_length, objective=objective, steps=shape_steps, warmup=shape_warmup,
                      mask_lr=mask_lr, groups=groups, corpus=corpus, seed=seed, encoder_settings=encoder_settings,
                      train_settings=_phase_settings(train_settings, save_steps, save_minutes, resume), run=run, resume=resume)
    if not (coarse or slim_mlp is not None):
        raise surgery.PruneError("nothing to do: give --drop-mlp, --drop-attn, --drop-layers, --target-params, --slim-mlp "
                                 "or --target-shape")
    if coarse and calibration is None and scores is None:
        raise surgery.PruneError("--calibration FILE (a corpus to sample passages from) is needed, or --scores from an earlier run")
    if slim_mlp is not None:
        if not 0 < slim_mlp < 1:
            raise surgery.PruneError(f"--slim-mlp must be a fraction in (0, 1) of the MLP neurons to keep, got {slim_mlp}")
        if groups is None:
            raise surgery.PruneError("--slim-mlp trains gates on retrieval groups: give --groups FILE (from retrctl mine) and --corpus")
    enc = Encoder.load(model, **(encoder_settings or {}))
    max_length = memory.within_positions(enc.model.config, max_length)
    blocks = surgery.blocks_of(enc.model)
    for flag, given in (("--drop-mlp", drop_mlp), ("--drop-attn", drop_attn), ("--slim-mlp", slim_mlp is not None)):
        if given:
            surgery.check_decoder(enc.model, flag)
    if slim_mlp is not None:
        slimming.check_gated_mlp(enc.model)
    n = len(blocks.layers)
    whole_layers_only = blocks.kind == anatomy.ENCODER
    fingerprint = weights_fingerprint(resolve(model))
    texts = calibration_texts(calibration, calibration_size, seed) if calibration is not None else []
    run = _run_state(run, fingerprint, texts, max_length)
    work.prepare(output, run, resume)
    cached = work.partial_dir(output) / work.WORK / "scores.json"
    found = calib = None
    if scores is not None:
        saved = read_scores(scores, fingerprint, n)
        found, calib = saved["scores"], saved["calibration"]
        log.info("importance from %s (not recomputed)", scores)
    elif coarse and cached.is_file():  # --resume: computed before the interruption
        found, calib = json.loads(cached.read_text()).values()
    elif coarse:
        found = importance.importance(enc.model, enc.tokenizer, texts, max_length=max_length, batch_size=batch_size,
                                      progress=lambda it, total: progress(it, desc="importance", total=total, unit="batch"))
        calib = {"file": str(calibration), "texts": len(texts), "tokens": found.pop("tokens"), "max_length": max_length,
                 "seed": seed, "hash": stable_hex(max_length, *texts)}
    already = getattr(enc.model.config, "retrctl_pruned", None)
    p = surgery.plan(found, surgery.sublayer_params(enc.model), drop_layers=drop_layers, drop_mlp=drop_mlp,
                     drop_attn=drop_attn, target_params=target_params, already=already,
                     max_mlp_share=0.0 if whole_layers_only else 0.5) if coarse else surgery.Plan()
    before = surgery.non_embedding_params(enc.model)
    surgery.apply(enc.model, p)
    report = {
        "source": str(model), "source_fingerprint": fingerprint, "architecture": blocks.kind,
        "method": (ENCODER_METHOD if whole_layers_only else METHOD) if coarse else SLIM_METHOD,
        "settings": {"drop_mlp": drop_mlp, "drop_attn": drop_attn, "drop_layers": drop_layers, "target_params": target_params,
                     "slim_mlp": slim_mlp},
        "scores": found, "masks": p.masks(n), "removed": {"blocks": p.blocks, "mlp": p.mlp, "attention": p.attention},
        "calibration": calib,
    }
    gates = None
    with records.atomic_dir(output, resume=True) as tmp:  # -o appears only when done; a failure keeps .partial for --resume
        phases = work.open_work(tmp, run)
        if found is not None:
            (phases / "scores.json").write_text(json.dumps({"scores": found, "calibration": calib}) + "\n")
        if slim_mlp is not None:
            if coarse:
                report["method"] = f"{METHOD}; then {SLIM_METHOD}"
            kept = [i for i in range(n) if i not in p.blocks]  # source numbers of the blocks left
            removed = (getattr(enc.model.config, "retrctl_pruned", None) or {}).get("mlp", [])
            full = enc.model.layers[0].mlp.down_proj.in_features
            teacher = str(model) if heal_teacher and heal_steps and is_retriever(model) else None
            enc, gates, masks, metrics = slimming.self_slim(
                enc, slim_mlp, groups, records.read_corpus(corpus) if corpus is not None else None, phases,
                slim_steps=slim_steps, heal_steps=heal_steps, slim_lambda=slim_lambda, gate_lr=gate_lr,
                removed=removed, seed=seed, heal_teacher=teacher,
                **_phase_settings(train_settings, save_steps, save_minutes, resume))
            report["slimming"] = {
                "keep": slim_mlp, "groups": str(groups), "slim_steps": slim_steps, "heal_steps": heal_steps,
                "heal_teacher": teacher,
                "lambda": slim_lambda, "gate_lr": gate_lr, "train": train_settings or {}, "full_width": full,
                "blocks": [kept[i] for i in sorted(masks)], "widths": [int(masks[i].sum()) for i in sorted(masks)],
                "metrics": metrics}
            gates = {kept[i]: v for i, v in gates.items()}
        after = surgery.non_embedding_params(enc.model)
        log.info("removed blocks %s, MLPs %s, attention %s%s: non-embedding params %d -> %d (%.1f%%)", p.blocks, p.mlp,
                 p.attention, f", MLP neurons to {slim_mlp:.0%}" if slim_mlp else "", before, after, 100 * after / before)
        report["params"] = {"before": before, "after": after, "embedding": surgery.embedding_params(enc.model)}
        report["versions"] = records.versions()
        diff = _write(enc, tmp, report, texts, max_length, gates=gates)
    log.info("wrote %s (stock reload matches: max |diff| %.1e)", output, diff)
    return Path(output)


def is_retriever(model) -> bool:
    """Whether ``model`` is a trained retriever (a retrctl or sentence-transformers dir, or a shipped name that
    resolves to one), not a bare language model: the unpruned source then teaches the healing."""
    from retrctl.models import resolve

    root = Path(resolve(model))
    return root.is_dir() and ((root / "retrctl.json").is_file() or (root / "modules.json").is_file())


def _write(enc, tmp: Path, report: dict, texts: list[str], max_length: int, **extra) -> float:
    """The pruned model, its report and chart into the work dir; the stock reload checked (its max |diff|
    returned); the phases' work removed."""
    from retrctl.prune import save, work

    enc.save(tmp)
    save.write_report(tmp, report, **extra)
    diff = save.verify(enc.model, enc.tokenizer, tmp, CHECK_TEXTS + texts[:4], max_length)
    work.close_work(tmp)
    return diff


PER_INVOCATION = ("output", "resume", "save_steps", "save_minutes")  # how a run is carried out, not what it computes


def _run_state(run: dict, fingerprint: str, texts: list[str], max_length: int) -> dict:
    """The run's arguments as JSON, plus what its inputs hold (the model's weights, the calibration texts)."""
    state = json.loads(json.dumps(run, default=str))
    return {**state, "source_fingerprint": fingerprint, "calibration_hash": stable_hex(max_length, *texts) if texts else None}


def _phase_settings(train_settings: dict | None, save_steps: int, save_minutes: float, resume: bool) -> dict:
    """TrainConfig keys of prune's training phases: checkpoints as asked, resumed with --resume (without it
    ``work.prepare`` has cleared any)."""
    return {**(train_settings or {}), "save_steps": save_steps, "save_minutes": save_minutes, "resume": resume}


def _shape(model, shape, *, output, calibration, calibration_size, max_length, objective, steps, warmup, mask_lr,
           groups, corpus, seed, encoder_settings, train_settings, run, resume) -> Path:
    """prune --target-shape: learn Sheared-LLaMA's masks, cut the model to the shape, save it (atomic)."""
    import torch

    from retrctl.models import Encoder, resolve
    from retrctl.models.loading import saved_settings
    from retrctl.prune import shaping, shearing, surgery, work

    enc = Encoder.load(model, **(encoder_settings or {}))
    surgery.check_decoder(enc.model, "--target-shape")
    target = shaping.check_target(enc.model, shape)
    n = enc.model.config.num_hidden_layers
    fingerprint = weights_fingerprint(resolve(model))
    texts = calibration_texts(calibration, calibration_size, seed) if calibration is not None else []
    calib = None if not texts else {"file": str(calibration), "texts": len(texts), "max_length": max_length, "seed": seed,
                                    "hash": stable_hex(max_length, *texts)}
    before = surgery.non_embedding_params(enc.model)
    warmup = steps // 5 if warmup is None else warmup  # LLM-Shearing: a fifth of the pruning steps
    run = _run_state(run, fingerprint, texts, max_length)
    work.prepare(output, run, resume)
    torch.manual_seed(seed)  # the masks' initial noise
    with records.atomic_dir(output, resume=True) as tmp:  # -o appears only when done; a failure keeps .partial for --resume
        enc, kept, log_alpha, shaped = shearing.shear(
            enc, target, objective=objective, steps=steps, warmup=warmup, mask_lr=mask_lr, texts=texts,
            groups=groups, corpus=records.read_corpus(corpus) if corpus is not None else None,
            scratch=work.open_work(tmp, run), weights_dir=saved_settings(resolve(model))[0],
            check_texts=CHECK_TEXTS + texts[:4], max_length=max_length, train_settings=train_settings,
            progress=lambda it, total: progress(it, desc="shape", total=total, unit="step"))
        blocks = [i for i in range(n) if i not in shaped["kept_layers"]]
        after = surgery.non_embedding_params(enc.model)
        report = {
            "source": str(model), "source_fingerprint": fingerprint, "method": SHAPE_METHOD,
            "settings": {"target_shape": target, "objective": objective},
            "scores": None, "masks": surgery.Plan(blocks=blocks).masks(n), "removed": {"blocks": blocks, "mlp": [], "attention": []},
            "calibration": calib, "shape": shaped, "versions": records.versions(),
            "params": {"before": before, "after": after,
                       "embedding": sum(x.numel() for x in enc.model.get_input_embeddings().parameters())},
        }
        log.info("shape %s -> %s: non-embedding params %d -> %d (%.1f%%)", shaped["source"], shaped["target"], before,
                 after, 100 * after / before)
        diff = _write(enc, tmp, report, texts, max_length, shape_masks={"kept": kept, "log_alpha": log_alpha})
    log.info("wrote %s (stock reload matches: max |diff| %.1e)", output, diff)
    return Path(output)


@stage(prune, writes="dir", atomic=False)  # prune checks -o first, then builds its own atomic dir
@click.argument("source", metavar="MODEL")  # not named "model": that is the shared --model flag's name
@click.option("--calibration", help="Corpus to sample calibration passages from (JSONL/Parquet/BEIR folder).")
@click.option("--calibration-size", type=click.IntRange(min=1), help="Calibration passages (EffiR: 256).")
@click.option("--max-length", type=click.IntRange(min=1), help="Tokens per calibration passage.")
@click.option("--drop-mlp", type=click.IntRange(min=0), help="MLP sub-layers to remove (least important first; decoders only).")
@click.option("--drop-attn", type=click.IntRange(min=0), help="Attention sub-layers to remove (least important first; decoders only).")
@click.option("--drop-layers", type=click.IntRange(min=0), help="Whole blocks (layers) to remove, least Block Influence first (ShortGPT; decoders and BERT-family encoders).")
@click.option("--target-params", type=float, help="Keep this fraction of the non-embedding parameters (MLPs first, then blocks; encoders: whole layers only).")
@click.option("--scores", help="prune.json of an earlier run: reuse its importance scores instead of recomputing.")
@click.option("--slim-mlp", type=float, help="Self-slimming: keep this fraction of all MLP neurons, ranked globally by trained gates (decoders only).")
@click.option("--groups", help="Training groups for --slim-mlp (retrctl mine's output; the records train reads).")
@click.option("--slim-steps", type=click.IntRange(min=1), default=20, show_default=True, help="Steps training the gates (InfoNCE + L0).")
@click.option("--heal-steps", type=click.IntRange(min=0), default=20, show_default=True, help="Steps of InfoNCE after the mask is frozen.")
@click.option("--heal-teacher/--no-heal-teacher", default=True, show_default=True,
              help="Heal also by distillation from the unpruned source when it is a trained retriever (a retrctl or "
                   "sentence-transformers dir): its vectors and scores of the groups' texts (train --teacher).")
@click.option("--slim-lambda", type=click.FloatRange(min=0), default=1.0, show_default=True, help="Weight of the gates' relaxed L0 norm.")
@click.option("--gate-lr", type=click.FloatRange(min=0, min_open=True), default=0.05, show_default=True, help="Learning rate of the gates.")
@click.option("--target-shape", help="Sheared-LLaMA: prune to exactly this shape, e.g. layers=24,hidden=512,heads=6,intermediate=1024 (decoders only).")
@click.option("--objective", type=click.Choice(["lm", "contrastive"]), default="lm", show_default=True,
              help="What --target-shape's masks train on: next-token loss on --calibration, or InfoNCE on --groups.")
@click.option("--shape-steps", type=click.IntRange(min=1), default=20, show_default=True, help="Steps training the masks (--target-shape).")
@click.option("--shape-warmup", type=click.IntRange(min=0), help="Steps over which the target sparsity ramps up (default: a fifth of --shape-steps).")
@click.option("--mask-lr", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Learning rate of the masks and Lagrange multipliers (--target-shape; LLM-Shearing: 1.0).")
# the trainer's flags, as train declares them (the model's weights train in --slim-mlp and --target-shape; the
# groups, with --slim-mlp and --objective contrastive)
@config_flag(TrainConfig, "batch_size", "train_batch_size", type=click.IntRange(min=1), default=32, show_default=True)
@config_flag(TrainConfig, "train_group_size", type=click.IntRange(min=2), default=2, show_default=True)
@config_flag(TrainConfig, "lr", type=click.FloatRange(min=0, min_open=True), default=2e-5, show_default=True)
@config_flag(TrainConfig, "save_steps", type=click.IntRange(min=0), default=0, show_default=True)
@config_flag(TrainConfig, "save_minutes", type=click.FloatRange(min=0), default=10.0, show_default=True)
@config_flag(TrainConfig, "resume", is_flag=True)
@options("batch_size", "seed", "encoder", "corpus")
def command(source, train_batch_size, train_group_size, lr, **opts):
    """Drop the least important sub-layers, blocks (EffiR, ShortGPT) or MLP neurons (EffiR's self-slimming) of a decoder,
    or cut it to a target shape (Sheared-LLaMA); drop the least important whole layers of a BERT-family encoder
    (--drop-layers N, e.g. all-MiniLM-L6-v2: prune minilm --drop-layers 3 --calibration scifact/ -o small/).
    Encoder layers are post-LayerNorm, so their attention and MLP cannot be removed one at a time."""
    settings = encoder_overrides(opts)
    train = {"batch_size": train_batch_size, "train_group_size": train_group_size, "lr": lr}
    prune(source, encoder_settings=settings, train_settings=train, **opts)
