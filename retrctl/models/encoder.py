"""The encoder: texts in, vectors out, with a query side and a passage side.

``Encoder.load(name_or_path, **overrides)`` gives a text encoder whose settings (``EncoderConfig``: pooling,
normalize, prompts, max lengths, bidirectional attention, dims) come from, in order: the flags the user set, the
directory's own ``retrctl.json``, its sentence-transformers configs, then defaults. ``Encoder.save(dir)`` writes a
sentence-transformers layout plus ``retrctl.json`` (loading.py), so stock loaders read it with no retrctl code, and
every head's own sub-folders: each head saves and reloads itself (``save`` / ``load``, ``SAVED_HEADS``).

Each side (``enc.sides["query"]``, ``enc.sides["passage"]``) has its own prompt, length cap and head; by default
both share the backbone and one head, and the sides differ only in prompt and length (as today's models do). A
side with its own head (e.g. LightRetriever's token-lookup query encoder) plugs in there. ``forward`` is the one
forward pass, backbone → head, used by ``encode`` and by training (``raw=True``: the head's output before
``finish``; with a ``TrainingLayout``, every trained head's raw output side by side), so training and inference
cannot drift. An ``Encoder`` holds no training state: what a run trains is its layout (models/layout.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import numpy as np
import torch

from retrctl.models import backbone, loading, lookup, skipping
from retrctl.models.colbert import ColbertHead
from retrctl.models.config import DTYPES, EncoderConfig
from retrctl.models.heads import DenseHead, Head
from retrctl.models.layout import HeadLayout, TrainingLayout, token_block
from retrctl.models.sparse import SparseHead
from retrctl.process import stdout_to_stderr

log = logging.getLogger("retrctl.models")

# Every head a model dir may hold, by the Encoder attribute that holds it: each saves itself to and reloads itself
# from its own sub-folders (``save`` / ``load``, models/heads.py). In this order: the dense head's modules lead
# modules.json, and the token-lookup table is built from the dir as saved, so it comes last.
SAVED_HEADS = (("head", DenseHead), ("sparse", SparseHead), ("colbert", ColbertHead), ("token_lookup", lookup.TokenLookup))


class Side:
    """One side of an encoder: its prompt and length cap (read from the shared config) and its head."""

    def __init__(self, enc: Encoder, kind: str, head: Head):
        self.enc, self.kind, self.head = enc, kind, head

    @property
    def prompt(self) -> str:
        return self.enc.config.prompt(self.kind)

    @property
    def max_len(self) -> int:
        return self.enc.config.max_len(self.kind)


class Encoder(torch.nn.Module):
    """A backbone + a head per side: texts in, vectors out."""

    def __init__(self, model, tokenizer, config: EncoderConfig, source: str = "", head: Head | None = None):
        super().__init__()
        self.model, self.tokenizer, self.config, self.source = model, tokenizer, config, source
        self._tok = backbone.Tokenizer(tokenizer)
        self.truncated = self._tok.truncated
        self.head = head or DenseHead(config, tokenizer.cls_token_id, model.config.hidden_size)
        self.sides = {"query": Side(self, "query", self.head), "passage": Side(self, "passage", self.head)}
        self.sparse = None  # a SparseHead (models/sparse.py) beside the dense one, when the model has or trains one
        self.colbert = None  # a ColbertHead (models/colbert.py): BGE-M3's multi-vector head, beside the dense one
        # a Linear from the hidden size to a teacher's width, while a run distils a teacher of another width into
        # this encoder (train/model.py); never saved
        self.distill_projection = None
        # LightRetriever's token-lookup table (a TokenLookup, models/lookup.py) ships with the model: computed from
        # the weights it saves, by ``save`` itself, so no writer has to remember it
        self.token_lookup = None
        self.set_bidirectional(config.bidirectional)

    # -- construction

    @classmethod
    def load(cls, name_or_path, *, device: str | None = None, dtype: str | None = None, inference: bool = False,
             **overrides) -> Encoder:
        """``inference=True`` (index, search, mine): a pruned model's removed sub-layers are skipped, not computed
        (models/skipping.py); such an encoder cannot be saved or trained."""
        from transformers import AutoTokenizer

        root = loading.resolve(name_or_path)
        weights, settings = loading.saved_settings(root)
        settings.update({k: v for k, v in overrides.items() if v is not None})
        tokenizer = AutoTokenizer.from_pretrained(str(weights))
        torch_dtype = getattr(torch, DTYPES[dtype or "fp32"])
        model = loading.load_backbone(weights, torch_dtype)
        if inference and skipping.skip_removed(model):
            log.info("%s: removed sub-layers skipped %s", name_or_path, model.config.retrctl_pruned)
        if "query_max_len" not in settings or "passage_max_len" not in settings:
            # never past the position table: a longer default crashes on the first long text
            positions = getattr(model.config, "max_position_embeddings", None) or 512
            cap = min(getattr(tokenizer, "model_max_length", 512) or 512, positions, 512)
            settings.setdefault("query_max_len", cap)
            settings.setdefault("passage_max_len", cap)
        config = EncoderConfig.from_settings(settings)
        enc = cls(model, tokenizer, config, source=str(name_or_path))
        for attr, kind in SAVED_HEADS:
            setattr(enc, attr, kind.load(root, enc))
        enc.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        enc.eval()
        return enc

    def add_sparse_head(self, top_k: int = 256, query: str = "tokens", weights: str = "splade"):
        """Attach SPLADE's head (models/sparse.py), projecting through the input embeddings (tied LM/MLM head), or
        BGE-M3's lexical head (``weights="lexical"``: one learned weight per token, no projection)."""
        if weights == "splade" and getattr(self.model.config, "tie_word_embeddings", True) is False:
            raise ValueError(f"{self.source}: its LM head is not tied to the input embeddings; the sparse head "
                             "projects through the input embeddings only")
        self.sparse = SparseHead(self.config, self.model.get_input_embeddings(), self.special_ids(), top_k=top_k,
                                 query=query, weights=weights).to(self.device)
        return self.sparse

    def add_colbert_head(self, dim: int = 128):
        """Attach BGE-M3's multi-vector head (models/colbert.py)."""
        self.colbert = ColbertHead(self.config, self.model.config.hidden_size, self.special_ids(), dim).to(self.device)
        return self.colbert

    def special_ids(self) -> list[int]:
        """Token ids that carry no term weight or token vector (CLS/SEP, BOS/EOS, padding)."""
        tok = self.tokenizer
        return [*tok.all_special_ids, tok.bos_token_id, tok.eos_token_id, tok.pad_token_id]

    def set_bidirectional(self, on: bool) -> None:
        """Bidirectional attention for decoders (DRAMA, LLM2Vec): transformers reads config.is_causal."""
        self.config.bidirectional = bool(on)
        backbone.set_bidirectional(self.model.config, bool(on), self.source)

    @property
    def device(self):
        return next(self.model.parameters()).device

    @property
    def dim(self) -> int:
        return self.head.dim(self.model.config.hidden_size)

    # -- tokenization

    def tokenize(self, texts: list[str], kind: str = "passage", width: int | None = None,
                 counter: backbone.Tokenizer | None = None) -> backbone.Tokens:
        """Token ids, cut to the side's max length (counted), EOS appended for eos pooling, padded on the
        tokenizer's side (to the longest text, or to ``width`` when that is longer). ``counter``: another
        ``backbone.Tokenizer`` of this tokenizer that counts the cuts instead (reads that are not this encoder's)."""
        side = self.sides[kind]
        return (counter or self._tok)(texts, kind, side.prompt, side.max_len, self.config.pooling == "eos", width,
                                      self.config.mcls)

    # -- forward / encode

    def forward(self, batch: dict, kind: str | None = None, raw: bool = False, layout: TrainingLayout | None = None):
        """One forward pass, backbone → the side's head, with gradients. ``kind`` defaults to the side the batch
        was tokenized for (passage for a plain dict). ``raw``: the head's output as the training loss takes it
        (DenseHead: pooled, not yet truncated or normalized); else as ``encode`` returns it. ``layout``
        (training): every part the side's layout names (models/layout.py), side by side in one tensor."""
        kind = kind or getattr(batch, "kind", "passage")
        head = self.sides[kind].head
        batch = {k: v.to(self.device) for k, v in batch.items()}
        side = layout.side(kind) if layout is not None else None
        states = backbone.every_hidden_state(self.model, batch) if side is not None and "layers" in side else None
        hidden = states[-1] if states is not None else backbone.hidden_states(self.model, batch)
        out = head(hidden, batch["attention_mask"], batch["input_ids"])
        if side is not None:
            return side.join(self.training_parts(side, out, hidden, batch, states))
        return out if raw else head.finish(out)

    def training_parts(self, layout: HeadLayout, dense: torch.Tensor, hidden: torch.Tensor, batch: dict,
                       states: tuple[torch.Tensor, ...] | None = None) -> dict:
        """The raw output of each head ``layout`` names, in its order (the token-lookup part runs the backbone
        again, masked: models/lookup.py), from the side's ``dense`` output and the backbone's ``hidden`` states
        (``states``: every block's, for the ``layers`` part)."""
        mask, ids = batch["attention_mask"], batch["input_ids"]
        parts = {}
        for part in layout.parts:
            if part.name == "dense":
                parts["dense"] = dense
            elif part.name == "lookup":
                parts["lookup"] = lookup.lookup_forward(self, batch)
            elif part.name == "sparse":
                parts["sparse"] = self.sparse(hidden, mask, ids)
            elif part.name == "colbert":
                parts["colbert"] = self.colbert.block(self.colbert(hidden, mask, ids), part.shape[0])
            elif part.name == "projected":
                parts["projected"] = self.distill_projection(dense)
            elif part.name == "tokens":
                parts["tokens"] = token_block(hidden, mask, part.shape[0])
            elif part.name == "layers":  # after each block but the last, side by side per token
                parts["layers"] = token_block(torch.cat(states[1 : part.shape[1] + 1], -1), mask, part.shape[0])
            else:
                raise ValueError(f"the encoder computes no training part {part.name!r}")
        return parts

    def encode_sparse(self, texts: list[str], kind: str = "passage", batch_size: int = 32) -> tuple[np.ndarray, np.ndarray]:
        """Sparse rows (term ids [N, k] int32, weights [N, k] float32, zero-padded) from the sparse head; queries
        in its ``tokens`` mode are token counts and run no model."""
        from retrctl.models import sparse

        if self.sparse is None:
            raise ValueError(f"{self.source} has no sparse head (train one with --heads dense,sparse)")
        if kind == "query" and self.sparse.query == "tokens":
            return sparse.token_counts(self.tokenizer, texts, self.config.query_max_len, self.sparse.special_ids)
        return self.encode_heads(texts, kind, batch_size, heads=("sparse",))["sparse"]

    def encode_colbert(self, texts: list[str], kind: str = "passage", batch_size: int = 32) -> list[np.ndarray]:
        """Each text's token vectors [n_i, colbert dim] (float32, unit rows; padding and special tokens dropped)."""
        if self.colbert is None:
            raise ValueError(f"{self.source} has no colbert head (train one with --heads dense,lexical,colbert)")
        return self.encode_heads(texts, kind, batch_size, heads=("colbert",))["colbert"]

    def encode_heads(self, texts: list[str], kind: str = "passage", batch_size: int = 32,
                     heads=("dense", "sparse", "colbert")) -> dict:
        """Every head asked for (and present) from one backbone pass per batch (a multi-head index encodes its
        corpus once): {"dense": [N, dim], "sparse": (terms [N, k], weights [N, k]), "colbert": N arrays [n_i, d]}."""
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        want = {h for h in heads if h == "dense" or getattr(self, h, None) is not None}
        out: dict = {}
        if "dense" in want:
            out["dense"] = np.empty((len(texts), self.dim), np.float32)
        if "sparse" in want:
            k = self.sparse.top_k or self.sparse.vocab
            out["sparse"] = (np.zeros((len(texts), k), np.int32), np.zeros((len(texts), k), np.float32))
        if "colbert" in want:
            out["colbert"] = [None] * len(texts)
        batch_size = self.fit_batch(kind, batch_size)
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                batch = self.tokenize([texts[i] for i in idx], kind)
                batch = {key: v.to(self.device) for key, v in batch.items()}
                hidden = backbone.hidden_states(self.model, batch)
                if "dense" in out:
                    head = self.sides[kind].head
                    out["dense"][idx] = head.finish(head(hidden, batch["attention_mask"], batch["input_ids"])).cpu().numpy()
                if "sparse" in out:
                    t, w = self.sparse.keep_top(self.sparse(hidden, batch["attention_mask"], batch["input_ids"]))
                    out["sparse"][0][idx], out["sparse"][1][idx] = t, w
                if "colbert" in out:
                    keep = self.colbert.token_mask(batch["input_ids"], batch["attention_mask"]).cpu().numpy()
                    vecs = self.colbert(hidden, batch["attention_mask"], batch["input_ids"]).cpu().numpy()
                    for row, i in enumerate(idx):
                        out["colbert"][i] = vecs[row][keep[row]]
        return out

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

    def similarity(self, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """Scores of encoded queries against encoded passages (the query side's head decides)."""
        return self.sides["query"].head.similarity(q, p)

    def fit_batch(self, kind: str, requested: int) -> int:
        """The largest batch up to ``requested`` whose texts at the max length fit in the memory free now
        (memory.py): a decoder at 512 tokens must not be OOM-killed (on CPU that is a SIGKILL)."""
        from retrctl import memory

        width = memory.within_positions(self.model.config, self.config.max_len(kind))
        per_text = memory.inference_per_text(self.model.config, width, next(self.model.parameters()).element_size())
        return memory.fit_batch(per_text, requested, str(self.device), what=f"encode ({self.source})", fixed=self.weight_bytes())

    def weight_bytes(self) -> int:
        """Bytes of the weights: a safetensors load maps them lazily, so they may not be resident yet."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def report_truncation(self, total: dict | None = None) -> None:
        """One stderr line per kind whose inputs were cut (silent truncation is a peer bug, ST#4060)."""
        for kind, n in self.truncated.items():
            if n:
                of = f" of {total[kind]}" if total and kind in total else ""
                log.warning("%d%s %s texts were cut at %d tokens", n, of, kind, self.config.max_len(kind))

    # -- saving

    def save(self, out: str | os.PathLike) -> None:
        """sentence-transformers layout + retrctl.json, readable by stock loaders, and each head's own sub-folders
        (written by the head's ``save``; ``load`` reads them back)."""
        if skipping.has_skipped(self.model):
            raise ValueError(f"{self.source}: loaded for inference with its removed sub-layers skipped; "
                             "load it with inference=False to save it")
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        with stdout_to_stderr():
            self.model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        *heads, table = (getattr(self, attr) for attr, _ in SAVED_HEADS)
        loading.write_st_dir(out, self.config, [head.save(out) for head in heads if head is not None])
        if table is not None:  # the token lookup, last: its table is built from the dir as written so far
            table.save(out)

    def describe(self) -> dict:
        """Settings recorded in index manifests and run headers."""
        desc = {"model": self.source, **dataclasses.asdict(self.config), "dim": self.dim}
        if self.sparse is not None:
            desc["sparse"] = self.sparse.settings()
        if self.colbert is not None:
            desc["colbert"] = {"dim": self.colbert.out_dim}
        return desc
