"""train: contrastive fine-tuning of an encoder on mined groups, from one CPU to many GPUs with one command.

Method: InfoNCE over in-batch negatives plus each query's hard negatives, as in DPR (Karpukhin et al. 2020,
arXiv:2004.04906) with the temperature-scaled cosine of E5 (Wang et al. 2022, arXiv:2212.03533); the recipe of
DRAMA (Ma et al. 2025, arXiv:2502.18460: decoder backbones with bidirectional attention, mean pooling) and
LightRetriever (Ma et al. 2025, arXiv:2505.12260: temperature 0.02). Large batches in bounded memory with
GradCache (Gao et al. 2021, arXiv:2101.06983); Matryoshka losses (Kusupati et al. 2022, arXiv:2205.13147);
LoRA (Hu et al. 2021, arXiv:2106.09685); ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054) through DeepSpeed.

| paper knob | flag |
|---|---|
| temperature τ (0.05 E5 and ours; 0.02 LightRetriever) | ``--temperature`` |
| hard negatives per query (group = 1 + n) | ``--train-group-size`` |
| batch size (queries per step per process) | ``--train-batch-size`` |
| negatives shared across devices | automatic under ``torchrun``/``deepspeed`` (all processes' passages) |
| GradCache and its sub-batch | ``--grad-cache auto|on|off --chunk-size`` (auto: chosen from memory) |
| memory cap | ``--max-memory 12GB`` |
| Matryoshka dims | ``--mrl-dims 64,128,384`` |
| LoRA r / alpha / dropout | ``--lora-r --lora-alpha --lora-dropout`` |
| ZeRO stage | ``--zero-stage`` or ``--deepspeed ds.json`` |
| distillation from reranker scores | ``--distill-weight --teacher-temperature`` |
| distillation from a teacher model: its scores (KL / MarginMSE), its embeddings (MSE, sentence-transformers' model distillation), its token states, last and intermediate layers (TinyBERT); a corpus alone as data | ``--teacher --distill-weight --embed-distill-weight --embed-distill-loss --token-distill-weight --layer-distill-weight --fresh-crops --attention-dropout`` |
| keep the base unless a paired test on held-out pseudo-queries prefers a trained or WiSE-FT candidate (not a guarantee on real queries) | ``--guard-shards --guard-alphas`` (its encode of the pool kept for the index: ``--guard-pool-index``) |
| nothing trained where a known-item verdict says the base cannot read the corpus (retrctl's addition) | ``--guard-known-items`` |
| query side only over a frozen index's passage vectors (LightRetriever's asymmetric towers) | ``--passage-index`` |
| LightRetriever's token-lookup query encoder | ``--query-encoder token-lookup --lookup-kl-weight`` |
| SPLADE sparse head (FLOPS λ, quadratic warm-up) | ``--heads dense,sparse --flops-weight --flops-warmup --sparse-query --sparse-top-k`` |
| BGE-M3: lexical + multi-vector heads, self-knowledge distillation | ``--heads dense,lexical,colbert --self-distill/--no-self-distill --ensemble-weights --head-loss-weights --colbert-dim`` |
| pooling, bidirectional attention, prompts, lengths | the shared encoder flags |

Defaults (τ 0.05, group size 2 = one hard negative, 3 epochs, batch 32) are the recipe that reached SciFact test
nDCG@10 0.69 from all-MiniLM's 0.645 on 809 queries (bench/RESULTS.md, "Training quality"). 3 epochs is HF TrainingArguments' default; τ≈0.05 is what E5 and
sentence-transformers use for small encoders.

Deviations and additions, each because a peer tool went wrong there:
- Memory is planned before step 1 (on a CPU an out-of-memory is a SIGKILL, which HF's
  ``auto_find_batch_size`` cannot see, and a smaller batch would change a contrastive objective). ``memory.py``
  measures what one text at the max length keeps for backward, reads what is free (cgroup, MemAvailable,
  ``torch.cuda.mem_get_info``, a per-process share under torchrun; ``--max-memory`` caps it) and picks plain
  steps, GradCache with the largest chunk that fits (same loss and gradient), or exit 2 naming what would fit.
  One stderr line says which and why; the plan is saved in train_config.json.
- Checkpoints every ``--save-minutes`` (10) as well as every ``--save-steps``, so a killed run (OOM, kill -9,
  reboot) loses minutes: ``--resume`` continues from the newest.
- In-batch candidates that are another positive of the same query (same doc id or same text) are masked out of
  the softmax rather than pushed away (ST#3189).
- Cross-process gather sums every process's gradient into the local slice, so N processes × B equal one process
  × N·B exactly (tested), instead of the local-slice-only gradient (tevatron#143).
- GradCache runs under every ZeRO stage 0-3, with or without LoRA, and no combination is refused (tested on 2
  processes against one plain process: test_zero_matrix, in the slow suite): its inner chunk backwards tell
  DeepSpeed which one ends the step, the case that breaks in peers (tevatron#206, ST#3173). LoRA fails loudly if
  its B weights have not moved after ``--lora-check-steps``; step 1 is padded to the max lengths so an
  out-of-memory shows at once.
- Groups with too few negatives are padded by resampling their own negatives (counted and reported); groups
  with none get random corpus passages. Gradient accumulation is not offered: it adds no negatives (ST#2916).
- Groups stream from a file or stdin; stdin is held in memory (ids and query text only), never written to disk,
  so epochs and the step count are known. ``--resume`` restores model, optimizer, scheduler, RNG and position.

Nothing lost, nothing executed; each refusal exits 2 with one line (the first three before any model
is loaded) and leaves every file as it was:
- ``-o DIR`` must be new, empty, or a retrctl model (``retrctl.json`` and only the files a saved model holds);
  a model is replaced only with ``--overwrite``, and a directory with anything else in it never is.
- ``DIR.partial`` (checkpoints, metrics of a run in progress) is continued only with ``--resume``; without it,
  checkpoints there are refused, naming ``--resume`` and ``--overwrite`` (which discards them). A ``.partial``
  holding files retrctl did not write is refused either way.
- ``--resume`` refuses a checkpoint whose data (the groups in order and the text of every doc they name, all the
  corpus when a group has no negatives; in any container: file or stdin, compressed or not) or settings differ
  from this run's, naming the differing keys;
  only ``--save-steps --save-minutes --save-total-limit --logging-steps --device --lora-check-steps`` (and
  ``--resume``, ``--overwrite``) and the memory plan (``--grad-cache --chunk-size --max-memory``: plain or GradCache
  with any chunk computes the same loss and gradient) may change, as they change where and how often the run
  reports or how it fits in memory, not what it computes.
- Checkpoints load with ``torch.load(weights_only=True)``, DeepSpeed's included (its loader is swapped for ours,
  allowing only its three plain-data classes): a file that would run code when unpickled exits 2, naming it.

Launching (the same flags everywhere; one process without --zero-stage/--deepspeed runs plain torch):

    retrctl mine q.jsonl --corpus c.jsonl --qrels qrels.tsv | retrctl train --corpus c.jsonl --model minilm -o m/
    retrctl train g.jsonl --corpus c.jsonl --model minilm --zero-stage 3 --grad-cache on -o m/   # 1 GPU, nccl
    torchrun --nproc_per_node 8 -m retrctl train g.jsonl --corpus c.jsonl --model smollm2 --zero-stage 2 -o m/
    deepspeed --num_gpus 8 --no_local_rank --module retrctl train g.jsonl … --zero-stage 2 -o m/
    retrctl train g.jsonl … --zero-stage 2 --save-steps 200 -o /shared/m --ray auto --workers 8 --worker-gpus 1
      # Ray Train places the 8 processes; a killed worker restarts the run from the newest checkpoint
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import typing
from pathlib import Path

import click

from retrctl import distributed, fusion, records
from retrctl.distributed import RaySettings
from retrctl.errors import UsageError
from retrctl.models.config import ENCODER_FLAGS
from retrctl.options import SHARED_TYPES, Size, config_flag_name, options, renamed
from retrctl.stage import stage
from retrctl.train.config import (
    EMBED_DISTILL_LOSSES,
    QUERY_ENCODERS,
    SETTLED,
    SPARSE_QUERIES,
    TrainConfig,
    parse_alphas,
)
from retrctl.train.distill import CorpusDistiller
from retrctl.train.loop import Trainer
from retrctl.train.query_side import QuerySideTrainer

log = logging.getLogger("retrctl.train")


def train(groups=None, *, output, corpus=None, config: TrainConfig | None = None, on_step=None,
          ray: RaySettings | None = None, collective_timeout: float | None = None, **settings) -> Path:
    """Train an encoder on groups (a path, '-' for stdin, or a list of group records) and save it to ``output``:
    a sentence-transformers directory with retrctl.json, metrics.jsonl and train_config.json.
    ``settings`` are TrainConfig fields overriding ``config``. Without groups (None): with a teacher, embedding
    distillation on the corpus alone (retrctl/train/distill.py); else groups are read from stdin.
    ``ray``: the same training in ``ray.workers`` processes placed by Ray Train (retrctl/train/on_ray.py), each
    running this function, restarted from the newest checkpoint when a worker dies; ``on_step`` then runs in
    every worker. Returns the output directory."""
    cfg = (config or TrainConfig()).replace(**settings)
    # never train onto the groups, the corpus or the teacher
    records.check_outputs([output], [groups, corpus, cfg.teacher], dir_output=True)
    if cfg.guard_known_items:
        verdict = _known_items(cfg.guard_known_items)
        if cfg.guard_shards and not verdict["reads"]:  # nothing to train: the settings and the output checked first
            from retrctl import guard

            (QuerySideTrainer if cfg.passage_index else Trainer).check(cfg, output)
            guard.deliver_base(output, cfg.model, verdict, keep=cfg.guard_keep or None,
                               pool_index=cfg.guard_pool_index or None)
            return Path(output)
    if ray is not None:
        from retrctl.train.on_ray import train_on_ray

        work = functools.partial(_train_in_worker, groups, str(Path(output).absolute()), corpus, cfg, on_step)
        return train_on_ray(ray, cfg, output, work, groups=groups, collective_timeout=collective_timeout)
    after_export = None
    if groups is None and cfg.teacher:
        if cfg.passage_index:
            raise UsageError("--passage-index trains a query tower on groups: give GROUPS", flag="--passage-index")
        if cfg.guard_shards:
            raise UsageError("--guard-shards holds out groups; a corpus alone has none: give GROUPS or drop --guard-shards")
        kind = CorpusDistiller
    else:
        groups = "-" if groups is None else groups
        if cfg.guard_shards:  # the held-out split and its pool need the corpus before the Trainer reads it
            corpus = records.read_corpus(corpus) if isinstance(corpus, (str, Path)) else corpus
            groups, after_export = _guarded(groups, corpus, cfg)
        kind = QuerySideTrainer if cfg.passage_index else Trainer  # with --passage-index the passage side is stored
    # build (check cfg and the output, read the data, load the teacher, plan memory, build the engine), then train
    trainer = kind.build(cfg, groups, corpus, output, on_step=on_step, after_export=after_export)
    return trainer.fit()


def _train_in_worker(groups, output, corpus, cfg: TrainConfig, on_step, resume: bool) -> Path:
    """One Ray Train worker's part of ``train(..., ray=...)``: this process is one of the run's ranks."""
    return train(groups, output=output, corpus=corpus, config=dataclasses.replace(cfg, resume=resume), on_step=on_step)


def _known_items(path: str) -> dict:
    """--guard-known-items' verdict (exit 2 for a file that is not a sweep made with --known-items)."""
    verdict = fusion.known_items_of(path, flag="--guard-known-items")
    if verdict is None:
        raise UsageError(f"{path}: not a sweep file (`retrctl eval --sweep … --known-items … --json`)",
                         flag="--guard-known-items")
    return verdict


def _guarded(groups, docs, cfg: TrainConfig):
    """The groups to train on, and the guard that chooses what to deliver from the held-out rest."""
    from retrctl import guard

    if not docs:
        raise UsageError("--guard-shards needs --corpus: held-out queries are searched among corpus documents")
    if cfg.guard_pool_runs and cfg.passage_index:
        raise UsageError("--guard-pool-runs with --passage-index: the guard searches every vector of that index")
    if cfg.guard_pool_index and cfg.passage_index:
        raise UsageError("--guard-pool-index with --passage-index: the guard encodes no passage, the index holds them")
    if cfg.guard_base_index and cfg.passage_index:
        raise UsageError("--guard-base-index with --passage-index: the guard scores every candidate on that index's "
                         "vectors already")
    if cfg.guard_base_index:  # checked now, not after the training
        guard.base_index_checked(cfg.guard_base_index, cfg.model, docs)
    kept, dev = guard.hold_out(records.read(groups, "group") if isinstance(groups, (str, Path)) else groups, cfg.guard_shards)
    log.info("guard holds out %d groups (positives in shard 0 of %d), %d trained on", len(dev), cfg.guard_shards, len(kept))
    if len(dev) < 2:
        raise UsageError(f"--guard-shards {cfg.guard_shards}: {len(dev)} of the groups are held out, the guard needs at least 2 "
                         "(use fewer shards or more groups)")
    veto = set()
    if cfg.guard_veto:
        wanted = {q["query_id"] for q in records.read(cfg.guard_veto, "query")}
        veto = {g["query_id"] for g in dev if g["query_id"] in wanted}
        if len(veto) < 2:
            raise UsageError(f"{cfg.guard_veto}: {len(veto)} of its queries have held-out groups, the veto needs at "
                             "least 2", flag="--guard-veto")
        log.info("guard: %d held-out groups of the queries in %s may veto", len(veto), cfg.guard_veto)
    pool_runs = _pool_runs(cfg.guard_pool_runs, guard.scored(dev, veto))
    alphas = parse_alphas(cfg.guard_alphas)
    return kept, lambda model_dir: guard.select(model_dir, cfg.model, dev, docs, alphas=alphas, seed=cfg.seed,
                                                batch_size=cfg.chunk_size, veto=veto, pool_runs=pool_runs,
                                                keep=cfg.guard_keep or None, passage_index=cfg.passage_index or None,
                                                deliver=cfg.guard_deliver, base_index=cfg.guard_base_index or None,
                                                pool_index=cfg.guard_pool_index or None)


def _pool_runs(paths: str, scored: list[dict]) -> list[dict] | None:
    """--guard-pool-runs read before training, each cut to the held-out queries the guard scores: a run that holds
    none of them (another query set's) is refused now, not after the training."""
    if not paths:
        return None
    wanted = {g["query_id"] for g in scored}
    runs = []
    for path in paths.split(","):
        run = {q: hits for q, hits in records.read_run(path).items() if q in wanted}
        if not run:
            raise UsageError(f"{path}: none of the {len(wanted)} held-out queries the guard scores (ids like "
                             f"{next(iter(sorted(wanted)))!r}) is in this run: give runs of the held-out queries",
                             flag="--guard-pool-runs")
        if len(run) < len(wanted):
            log.warning("%s holds %d of the %d held-out queries the guard scores", path, len(run), len(wanted))
        runs.append(run)
    return runs


# ---------------------------------------------------------------- command line

# --seed keeps the shared name and help (FORMATS.md) but takes its default from TrainConfig; train's batch, query
# groups per step per process, is --train-batch-size (--batch-size is texts per forward pass everywhere else).
SHARED = {"model", *ENCODER_FLAGS}
INTERNAL = {"plan"}  # written by train into train_config.json, not set by users
CHOICES = {"query_encoder": QUERY_ENCODERS, "sparse_query": SPARSE_QUERIES, "embed_distill_loss": EMBED_DISTILL_LOSSES}


def config_options(f):
    """One flag per TrainConfig field not already a shared flag; help and default from the field."""
    hints = typing.get_type_hints(TrainConfig)
    for field in reversed(dataclasses.fields(TrainConfig)):
        if field.name in SHARED | INTERNAL:
            continue
        flag, kind = config_flag_name(field), hints[field.name]
        help = f"{field.metadata['help']} [default: {SETTLED.get(field.name, field.default)}]"
        if field.name == "grad_cache":  # a bare --grad-cache (as before auto existed) means on
            f = click.option(flag, field.name, type=click.Choice(["auto", "on", "off"]), is_flag=False, flag_value="on",
                             default=None, help=help)(f)
        elif field.name in CHOICES:
            f = click.option(flag, field.name, type=click.Choice(CHOICES[field.name]), default=None, help=help)(f)
        elif field.name == "max_memory":
            f = click.option(flag, field.name, type=Size(), default=None, help=help)(f)
        elif kind in (bool, bool | None):
            f = click.option(f"{flag}/--no-{flag[2:]}", field.name, default=None, help=help)(f)
        elif field.name == "mrl_dims":
            f = click.option(flag, field.name, help=help, callback=_int_list)(f)
        else:
            base = next(t for t in typing.get_args(kind) or (kind,) if t is not type(None))
            f = click.option(flag, field.name, type=SHARED_TYPES.get(field.name, base), default=None, help=help)(f)
    return f


def _int_list(ctx, param, value):
    if value is None:
        return None
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UsageError("expected comma-separated integers, e.g. 64,128,256", flag=param.opts[-1]) from None


@stage(train, writes="dir", atomic=False)  # the trainer swaps its own resumable partial (rank 0)
@click.argument("groups", default=None, required=False)
@options("model", "corpus", "encoder", "ray")
@click.option("--config", "config_file", help="TrainConfig as JSON (train_config.json of an earlier run); flags override it. "
              "--resume and --overwrite come from flags only.")
@config_options
@renamed("--batch-size", "--train-batch-size", type=SHARED_TYPES["batch_size"])
def command(groups, output, corpus, config_file, **flags):
    """Contrastive training on groups (from `retrctl mine`, file or stdin): InfoNCE with in-batch and hard
    negatives, GradCache, LoRA, Matryoshka, DeepSpeed ZeRO 0-3 under torchrun/deepspeed or on a Ray cluster
    (--ray --workers N: one training process per worker, -o on storage every node sees).

    \b
    Distillation from a frozen --teacher MODEL: with groups, its scores of each group's passages (--distill-weight,
    default 1 then); without a GROUPS argument the corpus alone is the data (--corpus C --teacher T: each doc's
    passage and a sentence crop of it, the student's vectors regressed onto the teacher's; 2 epochs, lr 3e-4,
    batch 32, no attention dropout by default: SciFact's 5,183 docs in ~20 min on 2 CPU cores). With --teacher,
    groups come from stdin only as GROUPS '-'."""
    collective_timeout = flags.get("ray_timeout")  # under --ray: also the wait for the other workers, when given
    ray = distributed.pop_settings(flags)
    cfg = (TrainConfig.from_json(config_file) if config_file else TrainConfig()).replace(**flags)
    train(groups, output=output, corpus=corpus, config=cfg, ray=ray, collective_timeout=collective_timeout)

