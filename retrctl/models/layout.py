"""What training passes around: each text's raw outputs as named parts side by side in one tensor.

GradCache caches, splits and re-forwards one tensor per text, so a training forward returns every trained head's
raw output concatenated on the last dimension. A ``HeadLayout`` is the one place that knows the order and the size
of those parts on one side (query or passage): it joins the parts the encoder computes (``Encoder.forward`` with a
layout) and splits them again. A ``TrainingLayout`` holds both sides, built from the encoder and what a run trains;
its widths size GradCache's cache (``memory.cached_outputs``), and its ``split`` turns a step's two tensors into
``StepOutputs``, the parts by name that every loss of the step reads (``train/losses.py``): one split a step.

The parts, in order:

- ``dense``: the side's head output before ``finish`` (pooled, neither truncated nor normalized), hidden size wide;
- ``lookup`` (query side): LightRetriever's token-lookup query vector (``models/lookup.py``), hidden size wide;
- ``sparse``: the sparse head's term weights, vocabulary wide (absent on the query side when queries are token
  counts);
- ``colbert``: the colbert head's unit token vectors, a fixed [side's cap × dim] block (zero rows for padding and
  special tokens) so chunks of any length concatenate;
- ``projected``: the dense output mapped to a teacher's width by a learned projection (embedding distillation from
  a teacher of another width; the projection is dropped at save), teacher width wide;
- ``tokens``: the backbone's final hidden state of each token, a fixed [side's cap × hidden size] block (the text's
  tokens first, in order, then zero rows) for token-level distillation from a teacher (``token_block``);
- ``layers``: the backbone's hidden state of each token after each block but the last, a fixed [side's cap × blocks
  × hidden size] block laid out as ``tokens``, for layer-wise distillation from a teacher.

A new part (a teacher's vector, an extra projection) is one more entry in ``TrainingLayout.of`` plus where it is
computed (``Encoder.training_parts``, or by the caller into ``join``'s dict); the losses read it by name from
``StepOutputs``, so no other part moves.

``TrainedEncoder`` is the trainer's view of an ``Encoder`` with its layout: calling it with ``raw=True`` gives the
layout's parts side by side. The ``Encoder`` itself carries no training state.
"""

from __future__ import annotations

import dataclasses
import math

import torch


@dataclasses.dataclass(frozen=True)
class Part:
    """One named part of a text's training output: ``shape`` per text, (width,) for a vector, (tokens, dim) for a
    token block."""

    name: str
    shape: tuple[int, ...]

    @property
    def width(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class HeadLayout:
    """The parts of one side's training output, in the order they sit side by side."""

    parts: tuple[Part, ...]

    def __post_init__(self):
        names = [p.name for p in self.parts]
        if len(set(names)) != len(names):
            raise ValueError(f"a layout names each part once, got {names}")

    @classmethod
    def of(cls, *parts: tuple[str, int | tuple[int, ...]]) -> HeadLayout:
        """``HeadLayout.of(("dense", 32), ("colbert", (16, 8)))``; parts of size 0 are left out."""
        shaped = [Part(name, size if isinstance(size, tuple) else (size,)) for name, size in parts]
        return cls(tuple(p for p in shaped if p.width))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parts)

    @property
    def width(self) -> int:
        return sum(p.width for p in self.parts)

    @property
    def slices(self) -> dict[str, slice]:
        """Each part's columns in the joined tensor."""
        out, start = {}, 0
        for p in self.parts:
            out[p.name] = slice(start, start + p.width)
            start += p.width
        return out

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def join(self, outputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """[rows, width]: each part's tensor ([rows, *shape], or already flat) put in its place."""
        if set(outputs) != set(self.names):
            raise ValueError(f"the layout has the parts {list(self.names)}, got {sorted(outputs)}")
        flat = []
        for p in self.parts:
            t = outputs[p.name].flatten(1)
            if t.size(1) != p.width:
                raise ValueError(f"part {p.name!r}: expected {p.width} floats per text ({p.shape}), got {t.size(1)}")
            flat.append(t)
        return flat[0] if len(flat) == 1 else torch.cat(flat, dim=-1)

    def split(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each part of ``x`` ([rows, width]) by name, as a view shaped [rows, *shape] (``x`` itself for a layout
        of one vector part)."""
        self._check(x)
        if len(self.parts) == 1 and len(self.parts[0].shape) == 1:
            return {self.parts[0].name: x}
        return {p.name: x[:, s] if len(p.shape) == 1 else x[:, s].view(x.size(0), *p.shape)
                for p, s in zip(self.parts, self.slices.values(), strict=True)}

    def _check(self, x: torch.Tensor) -> None:
        if x.size(-1) != self.width:
            raise ValueError(f"a training output of width {x.size(-1)} does not match the layout {self} ({self.width})")

    def __str__(self) -> str:
        return " | ".join(f"{p.name} {'×'.join(map(str, p.shape))}" for p in self.parts)


@dataclasses.dataclass(frozen=True)
class TrainingLayout:
    """Both sides' layouts: what one training step computes per query and per passage."""

    query: HeadLayout
    passage: HeadLayout

    @classmethod
    def of(cls, enc, *, sparse: bool = False, colbert: bool = False, lookup: bool = False,
           projected: int = 0, tokens: bool = False, layers: int = 0) -> TrainingLayout:
        """The layout of ``enc`` (an ``Encoder``) training its dense head, plus the sparse head, the colbert head
        and LightRetriever's token-lookup query encoder where asked, the dense output projected to a teacher's
        width ``projected`` (0: none), the token states (``tokens``) and those after the first ``layers`` blocks
        (0: none). The sparse part sits on the query side only when the sparse head encodes queries (else queries
        are token counts, computed by the objective)."""
        hidden = enc.model.config.hidden_size
        vocab = enc.sparse.vocab if sparse else 0
        dim = enc.colbert.out_dim if colbert else 0
        query_vocab = vocab if sparse and enc.sparse.query == "encoder" else 0
        return cls(
            query=HeadLayout.of(("dense", hidden), ("lookup", hidden if lookup else 0), ("sparse", query_vocab),
                               ("colbert", (enc.config.query_max_len, dim) if dim else 0), ("projected", projected),
                               ("tokens", (enc.config.query_max_len, hidden) if tokens else 0),
                               ("layers", (enc.config.query_max_len, layers, hidden) if layers else 0)),
            passage=HeadLayout.of(("dense", hidden), ("sparse", vocab),
                                  ("colbert", (enc.config.passage_max_len, dim) if dim else 0), ("projected", projected),
                                  ("tokens", (enc.config.passage_max_len, hidden) if tokens else 0),
                                  ("layers", (enc.config.passage_max_len, layers, hidden) if layers else 0)))

    def side(self, kind: str) -> HeadLayout:
        return self.query if kind == "query" else self.passage

    def __contains__(self, name: str) -> bool:
        return name in self.query or name in self.passage

    def split(self, q: torch.Tensor, p: torch.Tensor) -> StepOutputs:
        """A step's query and passage outputs split into their parts by name, once (the losses read the parts)."""
        return StepOutputs(self.query.split(q), self.passage.split(p))

    @property
    def token_queries(self) -> bool:
        """The sparse head is trained and queries are token counts (LightRetriever), not encoded."""
        return "sparse" in self.passage and "sparse" not in self.query

    @property
    def width(self) -> int:
        """The widest side: the most floats one text's training output takes."""
        return max(self.query.width, self.passage.width)


@dataclasses.dataclass(frozen=True)
class StepOutputs:
    """One training step's outputs as named parts, split once from the tensors GradCache caches: each side's
    parts by name (``query["dense"]``, ``passage["sparse"]``, …), views of the joined tensors (a side of one part:
    the tensor itself), so the gradients of every loss reading a part flow back into its columns."""

    query: dict[str, torch.Tensor]
    passage: dict[str, torch.Tensor]


def token_block(hidden: torch.Tensor, mask: torch.Tensor, cap: int) -> torch.Tensor:
    """[B, T, H] hidden states → [B, cap × H]: each text's tokens (``mask`` 1) first, in order, then zero rows, so
    the block of a text is the same whatever side it was padded on and however wide its batch."""
    keep = mask.bool()
    longest = int(keep.sum(1).max()) if keep.numel() else 0
    if longest > cap:
        raise ValueError(f"a text of {longest} tokens exceeds the token block's {cap}")
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)  # real tokens first, their order kept
    rows = hidden.gather(1, order[:, :, None].expand(-1, -1, hidden.size(2)))
    rows = rows * keep.gather(1, order)[:, :, None].to(rows.dtype)
    width = min(rows.size(1), cap)
    return torch.nn.functional.pad(rows[:, :width], (0, 0, 0, cap - width)).flatten(1)


class TrainedEncoder:
    """An ``Encoder`` with the layout a run trains it with. ``enc(batch, kind, raw=True)`` returns the layout's
    parts side by side; everything else (tokenize, the heads, the weights) is the encoder's own."""

    def __init__(self, encoder, layout: TrainingLayout):
        self.encoder, self.layout = encoder, layout

    def __call__(self, batch: dict, kind: str | None = None, raw: bool = False) -> torch.Tensor:
        return self.encoder(batch, kind, raw=raw, layout=self.layout if raw else None)

    def __getattr__(self, name: str):
        if name in ("encoder", "layout"):  # not yet set (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.encoder, name)

    @property
    def train_sparse(self) -> bool:
        """Whether the run trains the sparse head (the layout has its part)."""
        return "sparse" in self.layout

    @property
    def train_colbert(self) -> bool:
        """Whether the run trains the colbert head."""
        return "colbert" in self.layout
