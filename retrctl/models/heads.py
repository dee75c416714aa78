"""Heads: what turns a backbone's hidden states into the representation that is indexed and scored.

A ``Head`` says which ``EncoderConfig`` keys it reads (``keys``), computes its output with gradients from the hidden
states, the attention mask and the token ids (``forward``: the form the training loss takes), turns that into what ``encode``
returns (``finish``), scores finished query outputs against finished passage outputs (``similarity``), and saves
itself to and reloads itself from its own sub-folders of a model dir (``save`` / ``load``), as sentence-transformers'
modules do, without breaking stock sentence-transformers loading. Every head of an ``Encoder`` (this dense one, the
sparse and colbert heads beside it, and the token-lookup table) has that one pair, which ``Encoder.save`` and
``Encoder.load`` call alike. Training and encoding both run ``backbone → head.forward`` (``Encoder.forward``),
so the two cannot drift.

``DenseHead``: a pooled vector (cls/mean/eos/last), optionally truncated to its first
``dims`` (Matryoshka) and L2-normalized. Pooling finds the first/last real token from the attention mask, so it is
right under left and right padding (ST#3208); with ``mcls`` set, the mean of the CLS tokens the tokenizer inserted
(BGE-M3's MCLS). Its sub-folders are sentence-transformers' own ``1_Pooling`` and
``2_Normalize``; its settings are the encoder's own (``EncoderConfig``, saved in ``retrctl.json``), which
``loading.saved_settings`` reads before the backbone loads (from a stock dir's Pooling and Normalize folders too).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from retrctl.models.config import EncoderConfig


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


def real_tokens(input_ids, attention_mask, special_ids: list[int]):
    """[B, T] bool: positions holding a text token, i.e. neither padding nor a special token (CLS/SEP, BOS/EOS)."""
    keep = attention_mask.bool()
    if input_ids is not None and special_ids:
        keep &= ~torch.isin(input_ids, torch.tensor(special_ids, device=input_ids.device))
    return keep


class Head(torch.nn.Module):
    """The interface every head implements (see the module docstring)."""

    name: str = ""
    keys: tuple[str, ...] = ()  # the EncoderConfig keys this head reads

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config  # shared with the encoder: a changed setting applies at once

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def finish(self, output: torch.Tensor) -> torch.Tensor:
        """The training output as ``encode`` returns it."""
        return output

    def similarity(self, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """[Q, P] scores of finished query outputs against finished passage outputs."""
        raise NotImplementedError

    def dim(self, hidden_size: int) -> int:
        raise NotImplementedError

    def save(self, out: Path) -> dict:
        """Write the head's settings and weights into its own sub-folders of the model dir ``out``; returns what the
        dir's sentence-transformers configs say of it (``modules``: its modules.json entries, ``config``: its keys of
        config_sentence_transformers.json), {} for a head that stock loaders do not read."""
        raise NotImplementedError

    @classmethod
    def load(cls, root: Path, enc) -> Head | None:
        """The head the model dir ``root`` holds, rebuilt from its own sub-folders and attached to the encoder
        ``enc``; None when ``root`` holds none."""
        raise NotImplementedError


class DenseHead(Head):
    """A pooled vector per text (+ Matryoshka truncation, + L2 normalization)."""

    name = "dense"
    keys = ("pooling", "normalize", "dims", "mcls")

    def __init__(self, config: EncoderConfig, cls_id: int | None = None, hidden_size: int | None = None):
        super().__init__(config)
        self.cls_id = cls_id
        self.hidden_size = hidden_size  # the backbone's, which 1_Pooling records as its input width

    def forward(self, hidden_states, attention_mask, input_ids=None):
        """Pooled float32 vectors, neither truncated nor normalized: the loss does both (per Matryoshka dim). With
        ``mcls`` (BGE-M3's MCLS, the tokenizer inserted the CLS tokens): the mean of every CLS token's state."""
        if self.config.mcls and input_ids is not None:
            cls = (input_ids == self.cls_id) & attention_mask.bool()
            return pool(hidden_states, cls.to(attention_mask.dtype), "mean").float()
        return pool(hidden_states, attention_mask, self.config.pooling).float()

    def finish(self, output):
        if self.config.dims:
            output = output[:, : self.config.dims]
        if self.config.normalize:
            output = torch.nn.functional.normalize(output, dim=-1)
        return output

    def similarity(self, q, p):
        return q @ p.T  # cosine when normalized, as recorded in config_sentence_transformers.json

    def dim(self, hidden_size: int) -> int:
        return self.config.dims or hidden_size

    def save(self, out: Path) -> dict:
        c = self.config
        modules = [{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        if c.normalize:
            modules.append({"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
            (out / "2_Normalize").mkdir(exist_ok=True)
        (out / "1_Pooling").mkdir(exist_ok=True)
        pooling = {
            "word_embedding_dimension": self.hidden_size,
            "pooling_mode_cls_token": c.pooling == "cls",
            "pooling_mode_mean_tokens": c.pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_lasttoken": c.pooling in ("eos", "last"),
        }
        (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
        st = {"similarity_fn_name": "cosine" if c.normalize else "dot"}
        if c.dims:
            st["truncate_dim"] = c.dims
        return {"modules": modules, "config": st}

    @classmethod
    def load(cls, root: Path, enc) -> DenseHead:
        """The head ``enc`` was built with: its settings are the encoder's config, read from ``root`` already."""
        return enc.head


HEADS = {DenseHead.name: DenseHead}
