"""BGE-M3's multi-vector (colbert) sub-index: each doc's token vectors, compact, and MaxSim over them.

Stored in a version as ``colbert.tokens.npy``, float16 [total tokens, dim] (the head's unit rows; padding and special
tokens were dropped by the head), and ``colbert.offsets.npy``, int64 [N+1]: doc i's tokens are rows
``offsets[i]:offsets[i+1]`` (a doc may have none). fp16 halves float32's 4 bytes per value; unit rows lose ~1e-3 per
MaxSim score, which is computed in float32 (as ``models/colbert.py``'s ``maxsim_numpy``, the reference).

What PLAID-style compression would add (ColBERTv2, Santhanam et al. 2022, arXiv:2112.01488; PLAID, arXiv:2205.09707):
each token as the id of its nearest of ~√T k-means centroids plus its residual quantised to 1–2 bits per dimension —
ColBERTv2 reports 6–10x smaller than fp16 vectors — and candidate generation by the centroids nearest to the query's
tokens, so MaxSim need not see every doc. Neither is built here: candidates come from the other heads (or every doc).

Inside an index build the tokens ride in the encoded chunk rows (``to_lanes``): [n_tokens | the doc's fp16 values
paired into float32 lanes, zero-padded to the chunk's longest doc], the last columns of the row, so checkpointing,
updates and merges are ``EncodedIndex``'s (indexes/encoded.py) and this store takes what the other heads leave. A float32 lane is non-finite only if its high half is an fp16 inf/NaN, so finite tokens
never trip ``_encode``'s NaN check; a doc whose tokens are not finite gets NaN for its count, so the check names it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from retrctl.indexes import base, store

BLOCK_TOKENS = 1 << 16  # doc tokens scored at once: [query tokens, BLOCK_TOKENS] float32
FILES = {"tokens": "colbert.tokens.npy", "offsets": "colbert.offsets.npy"}


def to_lanes(docs: list[np.ndarray], dim: int) -> np.ndarray:
    """Each doc's token vectors [n_i, dim] → one float32 row [n_i | fp16 pairs as lanes], zero-padded to the longest."""
    counts = np.array([len(d) for d in docs], np.int64)
    width = -(-int(counts.max(initial=0)) * dim // 2)  # float32 lanes for the longest doc's fp16 values
    halves = np.zeros((len(docs), 2 * width), np.float16)
    with np.errstate(over="ignore"):  # a value past fp16's range becomes inf, caught just below
        for i, d in enumerate(docs):
            halves[i, : d.size] = d.ravel()
    n = counts.astype(np.float32)
    n[~np.isfinite(halves).all(axis=1)] = np.nan  # overflow to fp16 inf included
    return np.concatenate([n[:, None], halves.view(np.float32)], axis=1)


def from_lanes(rows: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``to_lanes``'s rows → (tokens float16 [sum n_i, dim], counts int64 [N])."""
    counts = rows[:, 0].astype(np.int64)
    halves = np.ascontiguousarray(rows[:, 1:]).view(np.float16)
    real = np.arange(halves.shape[1]) < (counts * dim)[:, None]
    return halves[real].reshape(-1, dim), counts


class TokenStore:
    """The colbert head's store: the docs' token vectors in row order, appended chunk by chunk, consolidated into one
    flat array + offsets. Its columns of an encoded row are the rest of the row (``width`` None)."""

    width = None
    knobs = ()

    def __init__(self, dim: int):
        self.dim = dim
        self._parts: list[tuple[np.ndarray, np.ndarray]] = []  # (tokens [T, dim] float16, counts [n] int64)

    def append(self, rows: np.ndarray) -> None:
        """Docs given as ``to_lanes`` rows."""
        self._parts.append(from_lanes(rows, self.dim))

    def finish(self) -> None:
        """Nothing waits: tokens are scored once appended."""

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens float16 [T, dim], offsets int64 [N+1]) of every doc."""
        if len(self._parts) != 1:
            tokens = [t for t, _ in self._parts] or [np.zeros((0, self.dim), np.float16)]
            counts = [c for _, c in self._parts] or [np.zeros(0, np.int64)]
            self._parts = [(np.concatenate(tokens), np.concatenate(counts))]
        tokens, counts = self._parts[0]
        return tokens, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def apply(self, replaced: dict[int, np.ndarray], removed: list[int], n: int | None = None) -> None:
        """Replace docs by position (``replaced``: position → its ``to_lanes`` row) and drop ``removed``."""
        tokens, offsets = self.arrays()
        docs = np.split(tokens, offsets[1:-1]) if len(offsets) > 1 else []
        for pos, row in replaced.items():
            docs[pos] = from_lanes(row[None], self.dim)[0]
        gone = set(removed)
        kept = [d for i, d in enumerate(docs) if i not in gone]
        self._parts = [(np.concatenate(kept) if kept else np.zeros((0, self.dim), np.float16),
                        np.array([len(d) for d in kept], np.int64))]

    @classmethod
    def joined(cls, stores: list[TokenStore], counts: list[int] | None = None) -> TokenStore:
        out = cls(stores[0].dim)
        out._parts = [part for s in stores for part in s._parts]
        return out

    # ------------------------------------------------------------ scoring

    def maxsim(self, q: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """MaxSim of one query's tokens [Tq, dim] with the docs at ``rows``: the mean over the query's tokens of each
        one's best dot product with the doc's tokens; 0 for a doc or a query without tokens. Docs go in blocks of
        about ``BLOCK_TOKENS`` tokens, so ``rows`` may be the whole corpus."""
        tokens, offsets = self.arrays()
        rows = np.asarray(rows, np.int64)
        out = np.zeros(len(rows), np.float32)
        counts = offsets[rows + 1] - offsets[rows]
        has = np.flatnonzero(counts > 0)
        if not len(q) or not len(has):
            return out
        q = q.astype(np.float32)
        ends = np.cumsum(counts[has])
        start = 0
        while start < len(has):
            before = ends[start] - counts[has[start]]
            stop = max(start + 1, int(np.searchsorted(ends, before + BLOCK_TOKENS, side="right")))
            block = has[start:stop]
            n = counts[block]
            first = np.cumsum(n) - n  # each doc's first column in the block
            take = np.repeat(offsets[rows[block]] - first, n) + np.arange(int(n.sum()))
            sims = q @ tokens[take].astype(np.float32).T  # [Tq, block tokens]
            out[block] = np.maximum.reduceat(sims, first, axis=1).mean(axis=0)
            start = stop
        return out

    # ------------------------------------------------------------ files

    def manifest(self) -> dict:
        tokens, _ = self.arrays()
        return {"dim": self.dim, "dtype": "float16", "tokens": len(tokens), "files": dict(FILES)}

    def write(self, directory: Path, n: int | None = None) -> None:
        tokens, offsets = self.arrays()
        np.save(directory / FILES["tokens"], tokens)
        np.save(directory / FILES["offsets"], offsets)

    @classmethod
    def read(cls, directory: Path, section: dict, n_docs: int) -> TokenStore:
        """A version's token store, checked against its manifest ``section`` and doc count."""
        arrays = {}
        for name in ("tokens", "offsets"):
            path = directory / section["files"][name]
            with base.reading(path):
                arrays[name] = np.load(path)
        tokens, offsets = arrays["tokens"], arrays["offsets"]
        if tokens.shape != (section["tokens"], section["dim"]) or tokens.dtype != np.float16:
            raise store.damaged(directory / section["files"]["tokens"], f"{tokens.dtype} {tokens.shape} for "
                                f"{section['tokens']} tokens of dim {section['dim']}")
        if offsets.shape != (n_docs + 1,) or offsets[0] != 0 or offsets[-1] != len(tokens) or (np.diff(offsets) < 0).any():
            raise store.damaged(directory / section["files"]["offsets"], f"offsets {offsets.shape} do not cut "
                                f"{len(tokens)} tokens into {n_docs} docs")
        out = cls(section["dim"])
        out._parts = [(tokens, np.diff(offsets))]
        return out
