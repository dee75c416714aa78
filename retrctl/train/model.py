"""The encoder a run trains: loaded (or given), with the run's settings, LoRA and extra heads applied, and the
layout of what one training step computes (models/layout.py)."""

from __future__ import annotations

import torch

from retrctl.models import Encoder, backbone, lookup
from retrctl.models.layout import TrainedEncoder, TrainingLayout
from retrctl.train.config import TrainConfig, parse_train_heads


def build_encoder(cfg: TrainConfig, device: str, *, for_training: bool = True, teacher_dim: int | None = None) -> TrainedEncoder:
    """The encoder ``cfg.model`` names, made ready to train (``prepare``)."""
    torch.manual_seed(cfg.seed)  # LoRA init identical in every process
    return prepare(Encoder.load(cfg.model, device=device, **cfg.encoder_overrides()), cfg, for_training=for_training,
                   teacher_dim=teacher_dim)


def prepare(enc: Encoder, cfg: TrainConfig, *, for_training: bool = True, teacher_dim: int | None = None) -> TrainedEncoder:
    """The flags' encoder settings and ``--attention-dropout`` applied, BERT's unused pooler frozen, gradient
    checkpointing and LoRA set up, the heads ``cfg`` trains attached; with the layout of what a step computes
    (models/layout.py). ``teacher_dim``: the width of a teacher's vectors the student's regress onto (embedding
    distillation); where it differs from the student's hidden size, a learned linear projection
    (``Encoder.distill_projection``) maps the student's dense output to it, as the layout's ``projected`` part
    (never saved: ``Encoder.save`` writes stock modules)."""
    for key, value in cfg.encoder_overrides().items():
        if key == "bidirectional":
            enc.set_bidirectional(value)
        else:
            setattr(enc.config, key, value)  # in place: the sides and the head read this config
    if cfg.attention_dropout is not None:
        backbone.set_attention_dropout(enc.model, cfg.attention_dropout)
    for name, p in enc.model.named_parameters():
        if name.startswith("pooler."):  # BERT's pooler is unused by our pooling; frozen, it gets no None grads
            p.requires_grad_(False)
    if cfg.gradient_checkpointing and for_training:
        enc.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if cfg.lora_r:
            enc.model.enable_input_require_grads()  # open-unlearning#178: else LoRA under checkpointing trains nothing
    if cfg.lora_r:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules="all-linear", exclude_modules=r".*pooler.*", task_type="FEATURE_EXTRACTION")
        enc.model = get_peft_model(enc.model, lora)
    enc.config.temperature = cfg.temperature
    heads = parse_train_heads(cfg.heads)
    kind = "lexical" if "lexical" in heads else "splade" if "sparse" in heads else None
    if kind is not None:
        if enc.sparse is None or enc.sparse.weights != kind:
            enc.add_sparse_head(top_k=cfg.sparse_top_k, query=cfg.sparse_queries(), weights=kind)
        enc.sparse.top_k, enc.sparse.query = cfg.sparse_top_k, cfg.sparse_queries()
    if "colbert" in heads:
        if enc.colbert is None or enc.colbert.out_dim != cfg.colbert_dim:
            enc.add_colbert_head(cfg.colbert_dim)
    projected = 0
    if teacher_dim is not None and teacher_dim != enc.model.config.hidden_size:
        projected = teacher_dim
        if enc.distill_projection is None or enc.distill_projection.out_features != teacher_dim:
            enc.distill_projection = torch.nn.Linear(enc.model.config.hidden_size, teacher_dim).to(enc.device)
    # the saved model ships the table it was trained with
    enc.token_lookup = lookup.TokenLookup(enc) if cfg.query_encoder == "token-lookup" else None
    enc.train(for_training)
    layout = TrainingLayout.of(enc, sparse=kind is not None, colbert="colbert" in heads,
                               lookup=cfg.query_encoder == "token-lookup", projected=projected,
                               tokens=bool(cfg.token_distill_weight),
                               layers=enc.model.config.num_hidden_layers - 1 if cfg.layer_distill_weight else 0)
    return TrainedEncoder(enc, layout)
