"""Training settings: ``TrainConfig`` (saved as train_config.json beside each checkpoint and the model) and what a
resume may change. ``TrainConfig`` lives in the core rather than in the stage because every training stage shares it
(the core never imports a stage). Its encoder settings (pooling, prompts, lengths, bidirectional, dtype, device) are
not listed here: they come from ``retrctl/models/config.py``, where each is declared once.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from retrctl import records
from retrctl.errors import UsageError
from retrctl.models.config import (
    HEADS_HELP,
    QUERY_ENCODER_HELP,
    SETTING_FLAGS,
    SPARSE_TOP_K_HELP,
    with_encoder_flags,
)

QUERY_ENCODERS = ("full", "token-lookup")
TRAIN_HEADS = ("dense", "sparse", "lexical", "colbert")  # sparse = SPLADE, lexical = BGE-M3's; one of the two
SPARSE_QUERIES = ("tokens", "encoder")


def parse_train_heads(value: str) -> list[str]:
    """``--heads`` of train: dense first, at most one sparse kind; UsageError naming what is wrong."""
    got = [h.strip() for h in value.split(",") if h.strip()]
    bad = [h for h in got if h not in TRAIN_HEADS]
    if bad or "dense" not in got or len(set(got)) != len(got):
        raise UsageError(f"--heads {value}: dense plus any of sparse (SPLADE), lexical (BGE-M3) and colbert, "
                         "comma-separated, e.g. dense,lexical,colbert")
    if "sparse" in got and "lexical" in got:
        raise UsageError("--heads: sparse (SPLADE) and lexical (BGE-M3) are two kinds of the one sparse head; choose one")
    return [h for h in TRAIN_HEADS if h in got]


def parse_floats(value: str, n: int, flag: str) -> list[float]:
    try:
        out = [float(v) for v in value.split(",")]
    except ValueError:
        out = []
    if len(out) != n or any(v < 0 for v in out):
        raise UsageError(f"{flag} takes {n} comma-separated non-negative numbers, got {value!r}")
    return out


DISTILL_LOSSES = ("kl", "margin-mse")
EMBED_DISTILL_LOSSES = ("mse", "cosine")
GUARD_DELIVERS = ("pick", "trained")  # what a candidate that passes the guard delivers


def parse_alphas(value: str) -> list[float]:
    """'0.5,1' -> [0.5, 1.0]: the guard's interpolation weights of the trained model, tried beside the base."""
    try:
        alphas = sorted({float(v) for v in str(value).split(",") if v.strip()})
    except ValueError:
        alphas = []
    if not alphas or any(not 0 < a <= 1 for a in alphas):
        raise UsageError(f"--guard-alphas must be comma-separated numbers in (0, 1], got {value!r}")
    return alphas


# Settings whose default depends on the run: what --help shows for them, and ``TrainConfig.settle`` fills them in.
SETTLED = {"lr": "2e-5 with groups, 3e-4 from a corpus alone", "epochs": "3 with groups, 2 from a corpus alone",
           "distill_weight": "1 with --teacher and groups, else 0",
           "embed_distill_weight": "1 with --teacher and no groups, else 0",
           "attention_dropout": "the model's own with groups, 0 from a corpus alone"}


def _f(default, help: str, flag: str | None = None):
    """A field with its flag's help; ``flag``: the flag's name when it is not the field's (--batch-size means texts
    per forward pass in the other stages, so train's groups per step are --train-batch-size)."""
    return dataclasses.field(default=default, metadata={"help": help, **({"flag": flag} if flag else {})})


@dataclasses.dataclass
@with_encoder_flags(after="model")
class TrainConfig:
    """Everything a training run needs besides its data; saved as train_config.json beside each checkpoint."""

    model: str | None = _f(None, "Encoder to start from: directory, GGUF file, 'minilm' or 'smollm2'.")
    # here: one field per shared encoder flag (pooling, prompts, lengths, bidirectional, dtype, device), default None
    batch_size: int = _f(32, "Query groups per step per process (prune --objective lm: texts); in-batch negatives span "
                             "all processes.", flag="--train-batch-size")
    train_group_size: int = _f(2, "Passages per query: 1 positive + N-1 hard negatives (resampled per epoch from the group's).")
    temperature: float = _f(0.05, "Softmax temperature on cosine scores (0.05 as E5/sentence-transformers; LightRetriever 0.02).")
    lr: float | None = _f(None, "Peak learning rate of the model's weights (AdamW).")
    weight_decay: float = _f(0.01, "AdamW weight decay (not on biases and norms).")
    warmup_ratio: float = _f(0.1, "Linear warmup over this fraction of the steps, then linear decay to 0.")
    warmup_steps: int | None = _f(None, "Warmup steps (overrides --warmup-ratio).")
    epochs: int | None = _f(None, "Passes over the groups (3, as HF TrainingArguments), or over the corpus when it is "
                                  "the only data (2: SciFact's 5,183 docs in ~20 min on 2 CPU cores for MiniLM cut "
                                  "to 3 layers).")
    max_steps: int | None = _f(None, "Stop after this many optimizer steps (overrides --epochs).")
    attention_dropout: float | None = _f(None, "Dropout on the attention probabilities while training (not saved). "
                                               "0 lets attention run fused on CPU: a MiniLM step ~1.7x faster.")
    max_grad_norm: float = _f(1.0, "Gradient clipping (global norm); 0 = off.")
    seed: int = _f(42, "Random seed.")  # sampling, dropout, LoRA init; the help is the shared --seed's
    mrl_dims: list[int] | None = _f(None, "Matryoshka: loss summed over these truncated dims, e.g. 64,128,384.")
    distill_weight: float | None = _f(None, "Weight of the distillation term: the teacher's scores of each group's "
                                            "passages (--teacher), else those the groups carry (positive/negative_scores).")
    distill_loss: str = _f("kl", "kl: KL(teacher || student) over each group (RocketQAv2); margin-mse: MSE between the "
                           "student's and the teacher's positive-minus-negative score margins (GPL's MarginMSE).")
    teacher_temperature: float = _f(1.0, "Teacher scores are divided by this (before the softmax, or the margins).")
    calibrate_teacher: bool = _f(False, "Set the teacher temperature from the data instead: the untrained student's "
                                        "temperature × the teacher's mean positive-minus-negative margin over 64 groups "
                                        "spread over those trained on ÷ the student's, so both margins are on one scale (logged).")
    teacher: str | None = _f(None, "A frozen teacher the student learns from: a retrctl or sentence-transformers "
                                   "model dir or a shipped name ('minilm'). With groups: its scores of each group's "
                                   "passages (--distill-weight, --distill-loss); its vectors of the same texts "
                                   "(--embed-distill-weight). Without a GROUPS argument the corpus alone is the data: "
                                   "its passages and one sentence crop of each, embedding distillation only.")
    embed_distill_weight: float | None = _f(None, "Weight of embedding distillation: the student's vectors of each "
                                                  "text regress onto the teacher's (a learned projection, dropped at "
                                                  "save, when the widths differ).")
    embed_distill_loss: str = _f("mse", "mse: squared distance of the unit vectors (sentence-transformers' model "
                                        "distillation); cosine: 1 - cos.")
    token_distill_weight: float | None = _f(None, "Weight of token-level distillation, from a corpus alone: the student's "
                                                  "final hidden state of each token regresses onto the teacher's of the "
                                                  "same token (TinyBERT's hidden-state loss, last layer). Needs a teacher "
                                                  "with the student's tokenizer and width, as a model pruned from it.")
    layer_distill_weight: float | None = _f(None, "Weight of layer-wise distillation, from a corpus alone: the student's "
                                                  "hidden state of each token after each of its blocks but the last "
                                                  "regresses onto the teacher's after the block it was cut from (the "
                                                  "student's prune.json; the same block of a teacher as deep), each "
                                                  "token's error relative to its state (TinyBERT's intermediate layers).")
    fresh_crops: bool = _f(False, "From a corpus alone: a new sentence crop of each doc on each pass (distinct sentences "
                                  "while the doc has them, then again from its first; Contriever's crops drawn anew each "
                                  "time), where by default the one crop serves every pass.")
    contrastive_weight: float = _f(1.0, "Weight of the InfoNCE term (0 = distillation alone, as GPL).")
    query_encoder: str = _f("full", QUERY_ENCODER_HELP)
    lookup_kl_weight: float = _f(1.0, "Weight of KL(full || token-lookup) over the in-batch candidates (--query-encoder token-lookup).")
    heads: str = _f("dense", HEADS_HELP)  # the sparse head's terms are FLOPS-regularised (--flops-weight)
    sparse_query: str | None = _f(None, "Sparse query side: tokens (LightRetriever: token counts, no encoder) or "
                                        "encoder (symmetric). Default: tokens for sparse, encoder for lexical.")
    sparse_top_k: int = _f(256, SPARSE_TOP_K_HELP)
    flops_weight: float = _f(1e-3, "FLOPS regulariser weight on the sparse doc (and encoder-query) weights.")
    flops_warmup: int = _f(4000, "Steps over which the FLOPS weight grows quadratically to --flops-weight (SPLADE).")
    colbert_dim: int = _f(128, "Width of the colbert head's token vectors (ColBERT's 128).")
    self_distill: bool = _f(True, "With two or more of dense/lexical/colbert: BGE-M3's self-knowledge distillation "
                                  "(the weighted sum of the heads' scores teaches each head); --no-self-distill is the "
                                  "plain multi-objective ablation.")
    ensemble_weights: str = _f("1,0.3,1", "w_dense,w_sparse,w_colbert of the ensemble score s_inter (BGE-M3).")
    head_loss_weights: str = _f("1,0.1,1", "λ_dense,λ_sparse,λ_colbert of each head's loss in the multi-head objective (BGE-M3).")
    passage_index: str = _f("", "A dense index built by --model: train the query side only, each group's passages "
                            "being the index's stored vectors (never re-encoded); the model saved is a query tower for "
                            "that index (`retrctl index IDX --query-model`), and the guard scores queries against it.")
    guard_shards: int = _f(0, "Hold out the groups whose positive is in shard 0 of N docs (as --shard-id 0 --shard-num N "
                           "selects them) and keep the base model unless the trained one, or a weight interpolation of "
                           "the two, beats it there beyond noise (retrctl/guard.py); 0 = off.")
    guard_alphas: str = _f("0.5,1", "With --guard-shards: weights α of the trained model in α·trained + (1-α)·base tried "
                           "beside the base (WiSE-FT).")
    guard_veto: str = _f("", "With --guard-shards: queries (a query file) whose held-out groups may veto: a candidate "
                         "that scores below the base on them is refused, whatever the whole held-out set says (e.g. "
                         "the held-out documents' generated queries: crops copy their document's words and flatter "
                         "a model trained on crops).")
    guard_keep: str = _f("", "With --guard-shards: also write the trained model (α = 1) to this directory, whatever the "
                         "guard delivers, to audit its decision against judgements.")
    guard_pool_runs: str = _f("", "With --guard-shards: runs of the held-out queries over the whole corpus "
                              "(comma-separated TREC files, e.g. the base model's and BM25's), whose top hits make the "
                              "guard's pool of a corpus above 2,000 documents instead of BM25 and the base model "
                              "searched again (one corpus encode saved).")
    guard_base_index: str = _f("", "With --guard-shards: a dense index of --corpus built by --model (a pipeline's "
                               "base index): the guard scores the base model (α = 0) on its stored vectors, and "
                               "searches them for a pool of the base's top hits, instead of encoding the pool again "
                               "(one pool encode saved; the other candidates encode it).")
    guard_pool_index: str = _f("", "With --guard-shards: write the delivered model's vectors of the guard's pool (the "
                               "whole corpus up to 2,000 documents) to this directory as a dense index, where the "
                               "guard encoded the pool with that model; `retrctl index --model OUTPUT --vectors-from "
                               "DIR` then encodes only the documents outside it. Where it did not (the base kept on "
                               "--guard-base-index's vectors), an earlier run's directory is removed.")
    guard_known_items: str = _f("", "With --guard-shards: a sweep made with `retrctl eval --sweep --known-items` "
                                "(its verdict on --model: whether it finds known items' documents at least half as "
                                "well as BM25). Where it says --model does not read the corpus, nothing is trained: "
                                "the guard delivers --model as it is (and --guard-keep receives it), guard.json says "
                                "why.")
    guard_deliver: str = _f("pick", "With --guard-shards: what a passing candidate delivers: pick (the candidate) or "
                            "trained (the trained model, α = 1, for an ensemble with the base model: the output-space "
                            "counterpart of the interpolation the guard passed). The base when none passes.")
    lora_r: int = _f(0, "LoRA rank (0 = full fine-tuning); adapters are merged on save.")
    lora_alpha: int = _f(32, "LoRA alpha.")
    lora_dropout: float = _f(0.05, "LoRA dropout.")
    gradient_checkpointing: bool = _f(False, "Recompute activations in backward (less memory, ~30% slower).")
    grad_cache: str = _f("auto", "GradCache (same loss and gradient, bounded memory): auto = when plain steps would not fit.")
    chunk_size: int = _f(32, "Texts per forward pass (length-sorted, padding trimmed); GradCache's sub-batch (auto: the largest that fits).")
    max_memory: int | None = _f(None, "Cap on this process's memory, e.g. 12GB or 12GiB (default: what the machine has free).")
    group_by_length: bool = _f(True, "Batch groups of similar length (less padding); order shuffled per epoch.")
    zero_stage: int | None = _f(None, "DeepSpeed ZeRO stage 0-3 (config generated); implies DeepSpeed.")
    deepspeed: str | None = _f(None, "DeepSpeed JSON config ('auto' values are filled in).")
    save_steps: int = _f(0, "Checkpoint every N steps into <output>.partial (0 = none).")
    save_minutes: float = _f(10.0, "Also checkpoint when this many minutes passed since the last one (0 = none).")
    save_total_limit: int = _f(2, "Checkpoints kept.")
    resume: bool = _f(False, "Continue from the newest checkpoint in <output>.partial (refused if its data or settings differ).")
    logging_steps: int = _f(10, "Log loss, lr and groups/s every N steps (metrics.jsonl gets every step).")
    first_step_max_len: bool = _f(True, "Pad step 1 to the max lengths so an out-of-memory shows at step 1.")
    lora_check_steps: int = _f(5, "Fail if LoRA B weights are still zero after this many steps.")
    overwrite: bool = _f(False, "Replace -o if it is a retrctl model (never other files); without --resume, also "
                                "discard the checkpoints in <output>.partial.")
    plan: dict | None = _f(None, "The memory plan of the run (written by train, not a flag).")

    def __post_init__(self):
        if isinstance(self.grad_cache, bool):  # train_config.json files written before auto|on|off
            self.grad_cache = "on" if self.grad_cache else "off"
        if isinstance(self.max_memory, str):
            from retrctl.memory import parse_size

            self.max_memory = parse_size(self.max_memory)

    @classmethod
    def from_json(cls, path) -> TrainConfig:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict):
            raise records.RecordError(path, message="expected a JSON object of training settings")
        for key in ("resume", "overwrite", "plan"):  # per invocation: an earlier run's train_config.json must not carry them over
            data.pop(key, None)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise records.RecordError(path, message=f"unknown training setting(s): {', '.join(unknown)}")
        return cls(**data)

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")

    def replace(self, **flags) -> TrainConfig:
        """A copy with the flags that were given (not None) applied."""
        return dataclasses.replace(self, **{k: v for k, v in flags.items() if v is not None})

    def settle(self, *, teacher: bool, groups: bool) -> TrainConfig:
        """Fill in the settings left unset whose default depends on the run (``SETTLED``): whether a teacher is
        given (``--teacher`` or an online one) and whether groups are the data (else a corpus alone). In place;
        returns self."""
        defaults = {"lr": 2e-5 if groups else 3e-4, "epochs": 3 if groups else 2,
                    "distill_weight": 1.0 if teacher and groups else 0.0,
                    "embed_distill_weight": 1.0 if teacher and not groups else 0.0,
                    # a regression onto a frozen teacher's vectors: attention run fused on CPU, the step 1.7x faster
                    "attention_dropout": None if groups else 0.0}
        for key, value in defaults.items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        return self

    def sparse_queries(self) -> str:
        """The sparse query side: as given, else LightRetriever's token counts for SPLADE, the encoder for lexical."""
        return self.sparse_query or ("encoder" if "lexical" in self.heads.split(",") else "tokens")

    def encoder_overrides(self) -> dict:
        """The encoder settings given (what the saved model records; dtype and device say how to run it)."""
        return {k: getattr(self, k) for k in SETTING_FLAGS if getattr(self, k) is not None}

    def ds_stage(self) -> int | None:
        if self.deepspeed:
            return int(json.loads(Path(self.deepspeed).read_text()).get("zero_optimization", {}).get("stage", 0))
        return self.zero_stage

    def check(self, needs_model: bool = True) -> None:
        """Refuse bad settings (UsageError, exit 2) before any data is read or model loaded; ``needs_model``: the
        encoder comes from ``model`` (not from an instance the caller trains). ``Trainer.build`` calls this, once. No GradCache × ZeRO 0-3 × LoRA combination is refused:
        each is supported and tested on 2 processes against one plain process (tests/test_train.py::test_zero_matrix,
        in the slow suite): GradCache's per-chunk backwards tell DeepSpeed which one ends the step, the case that
        breaks in peers (tevatron#206, ST#3173)."""
        if needs_model and not self.model:
            raise UsageError("a model is required (--model)")
        if self.batch_size < 1 or self.train_group_size < 1 or self.chunk_size < 1:
            raise UsageError("--train-batch-size, --train-group-size and --chunk-size must be at least 1")
        if self.temperature <= 0:
            raise UsageError("--temperature must be positive")
        if self.attention_dropout is not None and not 0 <= self.attention_dropout < 1:
            raise UsageError(f"--attention-dropout must be in [0, 1), got {self.attention_dropout}")
        if self.grad_cache not in ("auto", "on", "off"):
            raise UsageError(f"--grad-cache must be auto, on or off, got {self.grad_cache!r}")
        if self.max_memory is not None and self.max_memory <= 0:
            raise UsageError("--max-memory must be positive")
        if self.save_minutes < 0:
            raise UsageError("--save-minutes must be 0 (off) or positive")
        if self.zero_stage is not None and self.deepspeed:
            raise UsageError("give --zero-stage or --deepspeed, not both")
        if self.zero_stage not in (None, 0, 1, 2, 3):
            raise UsageError("--zero-stage must be 0, 1, 2 or 3")
        if self.query_encoder not in QUERY_ENCODERS:
            raise UsageError(f"--query-encoder must be one of {', '.join(QUERY_ENCODERS)}, got {self.query_encoder!r}")
        heads = parse_train_heads(self.heads)
        if not any(parse_floats(self.ensemble_weights, 3, "--ensemble-weights")):
            raise UsageError("--ensemble-weights: at least one weight must be positive")
        parse_floats(self.head_loss_weights, 3, "--head-loss-weights")
        if self.distill_loss not in DISTILL_LOSSES:
            raise UsageError(f"--distill-loss must be one of {', '.join(DISTILL_LOSSES)}, got {self.distill_loss!r}")
        if self.calibrate_teacher and not self.distill_weight:
            raise UsageError("--calibrate-teacher scales the teacher's scores: it needs --distill-weight")
        if self.contrastive_weight < 0 or (self.contrastive_weight == 0 and not self.distill_weight
                                           and not self.embed_distill_weight):
            raise UsageError("--contrastive-weight must be >= 0, and above 0 unless --distill-weight or "
                             "--embed-distill-weight is")
        if min(self.distill_weight or 0, self.embed_distill_weight or 0, self.token_distill_weight or 0,
               self.layer_distill_weight or 0) < 0:
            raise UsageError("--distill-weight, --embed-distill-weight, --token-distill-weight and "
                             "--layer-distill-weight must not be negative")
        if self.embed_distill_loss not in EMBED_DISTILL_LOSSES:
            raise UsageError(f"--embed-distill-loss must be one of {', '.join(EMBED_DISTILL_LOSSES)}, "
                             f"got {self.embed_distill_loss!r}")
        if self.guard_shards < 0 or self.guard_shards == 1:
            raise UsageError(f"--guard-shards must be 0 (off) or at least 2, got {self.guard_shards}")
        if self.guard_shards:
            parse_alphas(self.guard_alphas)
        if self.guard_deliver not in GUARD_DELIVERS:
            raise UsageError(f"--guard-deliver must be one of {', '.join(GUARD_DELIVERS)}, got {self.guard_deliver!r}")
        for flag, value in (("--guard-keep", self.guard_keep), ("--guard-veto", self.guard_veto),
                            ("--guard-pool-runs", self.guard_pool_runs), ("--guard-base-index", self.guard_base_index),
                            ("--guard-pool-index", self.guard_pool_index),
                            ("--guard-known-items", self.guard_known_items),
                            ("--guard-deliver", "" if self.guard_deliver == "pick" else self.guard_deliver)):
            if value and not self.guard_shards:
                raise UsageError(f"{flag} only applies with --guard-shards")
        if self.colbert_dim < 1:
            raise UsageError("--colbert-dim must be positive")
        if "colbert" in heads and self.query_encoder == "token-lookup":
            raise UsageError("--heads …,colbert with --query-encoder token-lookup: the token-lookup query side has no "
                             "token vectors for MaxSim; train one or the other")
        if self.sparse_query is not None and self.sparse_query not in SPARSE_QUERIES:
            raise UsageError(f"--sparse-query must be one of {', '.join(SPARSE_QUERIES)}, got {self.sparse_query!r}")
        if self.sparse_top_k < 0 or self.flops_weight < 0 or self.flops_warmup < 0:
            raise UsageError("--sparse-top-k, --flops-weight and --flops-warmup must not be negative")
        if self.dtype not in (None, "fp32", "bf16"):
            raise UsageError("training runs in fp32 or bf16 mixed precision (--dtype bf16); fp16 needs loss scaling, not offered")


# Settings a resume may change: where and how often it reports and saves, never what it computes.
# per-invocation and bookkeeping settings, and the memory plan's inputs and outcome: plain or GradCache with any chunk
# computes the same loss and gradient, so a resume on a busier (or bigger) machine may plan differently (with dropout
# on, its masks follow the chunks' shapes: a resume on another plan draws other masks, as another seed would)
RESUME_MAY_CHANGE = frozenset({"resume", "overwrite", "save_steps", "save_minutes", "save_total_limit", "logging_steps",
                               "device", "lora_check_steps", "grad_cache", "chunk_size", "max_memory", "plan"})


def resume_conflicts(saved: dict, cfg: TrainConfig, *, groups: bool = True) -> list[str]:
    """The settings of ``cfg`` that differ from a checkpoint's train_config.json, as 'key (checkpoint X, now Y)'.
    ``groups``: whether this run trains on groups (a setting added since the checkpoint takes the default such a
    run settles on)."""
    # both sides as they apply: a setting left unset (None) takes the default the run settles on
    now = dataclasses.asdict(dataclasses.replace(cfg).settle(teacher=cfg.teacher is not None, groups=groups))
    then = {**dataclasses.asdict(TrainConfig()), **saved}  # a field added since the checkpoint: its default
    then.update({k: v for k, v in dataclasses.asdict(TrainConfig().settle(teacher=then["teacher"] is not None,
                                                                          groups=groups)).items()
                 if k in SETTLED and then.get(k) is None})
    # the sparse query side as it applies (a checkpoint from before its default became per-kind names it)
    now["sparse_query"] = cfg.sparse_queries()
    then["sparse_query"] = TrainConfig(heads=then["heads"], sparse_query=then["sparse_query"]).sparse_queries()
    return [f"{k} (checkpoint {then.get(k)!r}, now {now.get(k)!r})" for k in sorted(set(now) | set(then))
            if k not in RESUME_MAY_CHANGE and then.get(k) != now.get(k)]
