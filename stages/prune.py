"""prune: make a decoder retriever smaller by dropping its least important sub-layers (EffiR coarse step).

Method: EffiR (the coarse, layer-dropping step): the importance of an attention or MLP sub-layer is
1 − cos(x_in, x_out) of the residual stream around it, averaged over calibration passages; attention and MLP are
ranked as two separate groups and the least important of each are dropped; EffiR finds MLPs far more prunable
than attention in a retriever. Whole blocks are dropped by Block Influence, the same measure around a block
(ShortGPT, Men et al. 2024, arXiv:2403.03853). The model is not trained here: train it afterwards
(``retrctl prune … -o small/ && retrctl mine … | retrctl train --model small/ …``), as EffiR and DRAMA do.

| knob | flag | default |
|---|---|---|
| calibration passages (a corpus: JSONL/Parquet/BEIR folder) | ``--calibration FILE`` | required unless ``--scores`` |
| how many (EffiR: 256 task-agnostic passages) | ``--calibration-size`` | 256, sampled by a stable hash of the docid (``--seed``) |
| tokens per passage | ``--max-length`` | 256 |
| MLP / attention sub-layers to drop | ``--drop-mlp N``, ``--drop-attn N`` | 0 |
| whole blocks to drop (ShortGPT) | ``--drop-layers N`` | 0 |
| keep this fraction of non-embedding params: MLPs first (at most half), then blocks | ``--target-params F`` | off |
| reuse the scores of an earlier run (its prune.json) | ``--scores FILE`` | compute them |

The calibration passes run the model as the encoder runs it (``--bidirectional``, prompts), so the scores
measure the retriever, not the LM. Output (``-o DIR``, atomic: nothing is left on failure): an encoder dir that
stock ``AutoModel.from_pretrained`` and ``SentenceTransformer`` load, with prune.json (scores, masks, counts,
calibration hash), importance.png and a model card; it is reloaded with stock code and compared (1e-5) before
it is moved into place. Why single removed sub-layers are stored as zeros (and skipped only in memory):
retrctl/prune/surgery.py.

Refusals (exit 2, one line, no output dir): nothing to drop, more layers than exist, ``--target-params`` with
``--drop-*`` or outside (0, 1), an encoder-only model (BERT/MiniLM), ``--scores`` computed on another model.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from retrctl import records
from retrctl.hashing import stable_hex, weights_fingerprint
from retrctl.stage import encoder_overrides, options, progress, stage

log = logging.getLogger("retrctl.prune")

METHOD = "EffiR coarse step: sub-layer importance 1 - cos(x_in, x_out), attention and MLP ranked apart; blocks by ShortGPT Block Influence"
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
          batch_size: int = 16, seed: int = 0, encoder_settings: dict | None = None) -> Path:
    """Prune ``model`` and save it to ``output`` (see the module docstring). Returns the output dir."""
    from retrctl.models import Encoder, resolve
    from retrctl.prune import importance, save, surgery

    records.check_outputs([output], [model, calibration, scores], dir_output=True)
    records.check_own_dir(output, "prune.json", "a retrctl prune output")  # an earlier prune output is replaced
    if not (drop_mlp or drop_attn or drop_layers or target_params is not None):
        raise surgery.PruneError("nothing to do: give --drop-mlp, --drop-attn, --drop-layers or --target-params")
    if calibration is None and scores is None:
        raise surgery.PruneError("--calibration FILE (a corpus to sample passages from) is needed, or --scores from an earlier run")
    enc = Encoder.load(model, **(encoder_settings or {}))
    surgery.check_decoder(enc.model)
    n = len(enc.model.layers)
    fingerprint = weights_fingerprint(resolve(model))
    texts = calibration_texts(calibration, calibration_size, seed) if calibration is not None else []
    if scores is not None:
        saved = read_scores(scores, fingerprint, n)
        found, calib = saved["scores"], saved["calibration"]
        log.info("importance from %s (not recomputed)", scores)
    else:
        found = importance.importance(enc.model, enc.tokenizer, texts, max_length=max_length, batch_size=batch_size,
                                      progress=lambda it, total: progress(it, desc="importance", total=total, unit="batch"))
        calib = {"file": str(calibration), "texts": len(texts), "tokens": found.pop("tokens"), "max_length": max_length,
                 "seed": seed, "hash": stable_hex(max_length, *texts)}
    already = getattr(enc.model.config, "retrctl_pruned", None)
    p = surgery.plan(found, surgery.sublayer_params(enc.model), drop_layers=drop_layers, drop_mlp=drop_mlp,
                     drop_attn=drop_attn, target_params=target_params, already=already)
    before = surgery.non_embedding_params(enc.model)
    surgery.apply(enc.model, p)
    after = surgery.non_embedding_params(enc.model)
    log.info("removed blocks %s, MLPs %s, attention %s: non-embedding params %d -> %d (%.1f%%)",
             p.blocks, p.mlp, p.attention, before, after, 100 * after / before)
    report = {
        "source": str(model), "source_fingerprint": fingerprint, "method": METHOD,
        "settings": {"drop_mlp": drop_mlp, "drop_attn": drop_attn, "drop_layers": drop_layers, "target_params": target_params},
        "scores": found, "masks": p.masks(n), "removed": {"blocks": p.blocks, "mlp": p.mlp, "attention": p.attention},
        "params": {"before": before, "after": after, "embedding": sum(x.numel() for x in enc.model.get_input_embeddings().parameters())},
        "calibration": calib, "versions": records.versions(),
    }
    with records.atomic_dir(output, resume=False) as tmp:  # a failure leaves nothing half-written
        enc.save(tmp)
        save.write_report(tmp, report)
        diff = save.verify(enc.model, enc.tokenizer, tmp, CHECK_TEXTS + texts[:4], max_length)
    log.info("wrote %s (stock reload matches: max |diff| %.1e)", output, diff)
    return Path(output)


@stage(prune, writes="dir", atomic=False)  # prune checks -o first, then builds its own atomic dir
@click.argument("source", metavar="MODEL")  # not named "model": that is the shared --model flag's name
@click.option("--calibration", help="Corpus to sample calibration passages from (JSONL/Parquet/BEIR folder).")
@click.option("--calibration-size", type=click.IntRange(min=1), help="Calibration passages (EffiR: 256).")
@click.option("--max-length", type=click.IntRange(min=1), help="Tokens per calibration passage.")
@click.option("--drop-mlp", type=click.IntRange(min=0), help="MLP sub-layers to remove (least important first).")
@click.option("--drop-attn", type=click.IntRange(min=0), help="Attention sub-layers to remove (least important first).")
@click.option("--drop-layers", type=click.IntRange(min=0), help="Whole blocks to remove (ShortGPT Block Influence).")
@click.option("--target-params", type=float, help="Keep this fraction of the non-embedding parameters (MLPs first, then blocks).")
@click.option("--scores", help="prune.json of an earlier run: reuse its importance scores instead of recomputing.")
@options("batch_size", "seed", "encoder")
def command(source, **opts):
    """Drop the least important attention / MLP sub-layers or whole blocks of a decoder (EffiR, ShortGPT)."""
    from retrctl.prune.surgery import PruneError

    settings = encoder_overrides(opts)
    try:
        prune(source, encoder_settings=settings, **opts)
    except PruneError as e:
        raise click.UsageError(str(e)) from None
