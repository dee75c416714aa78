"""The dense head's store: the doc vectors in a faiss index (inner product), any faiss factory string.

``Flat`` is exact search; ``HNSW32`` a graph (Malkov & Yashunin 2016, arXiv:1603.09320); ``IVF1024,PQ32`` an inverted
file with product quantization (Jégou et al. 2011), trained on a seeded sample of the corpus vectors. When the faiss
index cannot give the exact vectors back (IVF, PQ, SQ…) the store keeps them beside it (``vectors.npy``): updates and
merges rebuild from exact vectors, never from codes.

Changing or removing docs rebuilds the faiss index from the vectors (HNSW has no ``remove_ids``, faiss#3339;
``remove_ids`` is a full scan anyway, faiss#1021), keeping an IVF's trained quantizer. Rows are positions in the
owning index's doc order; the store knows no doc ids.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from retrctl.indexes import base, store

log = logging.getLogger("retrctl.index")
logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # which SIMD build loaded is not news for stderr

INDEX_TYPE = base.Flag("index_type", "faiss factory string, inner product: Flat, HNSW32, IVF1024,PQ32, …", default="Flat")
SEARCH_FLAGS = (
    base.Flag("ef_search", "HNSW: candidates explored per query (default: the index's).", int, low=1),
    base.Flag("nprobe", "IVF: inverted lists probed per query (default: the index's).", int, low=1),
)


class FaissStore:
    """Vectors [N, dim] row-aligned with the owning index's docs; ``width`` is what each encoded row gives it."""

    knobs = ("ef_search", "nprobe")  # the search settings ``search`` reads off the index

    def __init__(self, dim: int | None, index_type: str = "Flat", *, train_size: int = 262144, seed: int = 0):
        self.dim, self.index_type, self.train_size, self.seed = dim, index_type, train_size, seed
        self.index = self.new_faiss() if dim else None
        self._vectors: list[np.ndarray] | None = None if self.lossless() else []
        self._pending: list[np.ndarray] = []  # vectors waiting for an IVF to be trained

    @property
    def width(self) -> int | None:
        return self.dim

    def new_faiss(self):
        import faiss

        try:
            return faiss.index_factory(self.dim, self.index_type, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as e:
            raise ValueError(f"bad faiss index type {self.index_type!r}: {str(e).strip().splitlines()[-1]}") from None

    def lossless(self) -> bool:
        """Can the faiss index give the exact vectors back (so no vectors.npy is needed)?"""
        import faiss

        return self.index is None or isinstance(self.index, (faiss.IndexFlat, faiss.IndexHNSWFlat))

    # ------------------------------------------------------------ rows

    def vectors(self, n: int) -> np.ndarray:
        """All ``n`` vectors, in row order (a copy)."""
        if n == 0:
            return np.zeros((0, self.dim or 0), dtype=np.float32)
        if self._vectors is not None:
            stored = np.concatenate(self._vectors) if len(self._vectors) != 1 else self._vectors[0]
            self._vectors = [stored]
            return stored.copy()
        done = self.index.reconstruct_n(0, self.index.ntotal) if self.index.ntotal else np.zeros((0, self.dim), np.float32)
        return np.concatenate([done, *self._pending]) if self._pending else done

    def vectors_at(self, rows: np.ndarray, n: int) -> np.ndarray:
        """The stored vectors of the given row positions (exact: an IVF/PQ index keeps them beside its codes)."""
        if not len(rows):
            return np.zeros((0, self.dim), np.float32)
        if self._vectors is None and not self._pending:
            return self.index.reconstruct_batch(np.asarray(rows, np.int64))
        if self._vectors is not None and len(self._vectors) == 1:
            return self._vectors[0][rows]
        return self.vectors(n)[rows]  # joins the appended chunks (and any vectors waiting for an IVF) first

    def append(self, vecs: np.ndarray) -> None:
        vecs = np.ascontiguousarray(vecs)
        if self._vectors is not None:
            self._vectors.append(vecs)
        if self.index.is_trained and not self._pending:
            self.index.add(vecs)
        else:
            self._pending.append(vecs)

    def finish(self) -> None:
        """Train an IVF/PQ index on a seeded sample of the waiting vectors, then add them."""
        if not self._pending:
            return
        x = np.concatenate(self._pending)
        self._pending = []
        if not self.index.is_trained:
            rng = np.random.default_rng(self.seed)
            sample = x if len(x) <= self.train_size else x[np.sort(rng.choice(len(x), self.train_size, replace=False))]
            log.info("training %s on %d vectors", self.index_type, len(sample))
            try:
                self.index.train(sample)
            except RuntimeError as e:
                raise ValueError(f"{self.index_type} could not be trained on {len(sample)} vectors "
                                 f"({str(e).strip().splitlines()[-1]}): use fewer lists/centroids or Flat") from None
        self.index.add(x)

    def rebuild(self, vecs: np.ndarray) -> None:
        """Replace the faiss contents by ``vecs`` (an IVF keeps its trained quantizer)."""
        self.index.reset()
        self._pending = []
        if self._vectors is not None:
            self._vectors = [vecs]
        if len(vecs):
            if self.index.is_trained:
                self.index.add(vecs)
            else:
                self._pending = [vecs]
                self.finish()

    def apply(self, replaced: dict[int, np.ndarray], removed: list[int], n: int) -> None:
        """Replace rows by position, drop ``removed``, and rebuild the faiss index from what is left."""
        vecs = self.vectors(n)
        for pos, v in replaced.items():
            vecs[pos] = v
        keep = np.ones(len(vecs), dtype=bool)
        keep[removed] = False
        log.info("rebuilding %s from %d vectors (%d changed, %d removed)", self.index_type, int(keep.sum()), len(replaced), len(removed))
        self.rebuild(np.ascontiguousarray(vecs[keep]))

    @classmethod
    def joined(cls, stores: list[FaissStore], counts: list[int]) -> FaissStore:
        """One store of several stores' vectors, in order (an IVF is trained again on the union)."""
        first = stores[0]
        out = cls(first.dim, first.index_type, train_size=first.train_size, seed=first.seed)
        vecs = np.concatenate([s.vectors(n) for s, n in zip(stores, counts, strict=True)]) if stores else np.zeros((0, first.dim), np.float32)
        out.rebuild(vecs)
        return out

    # ------------------------------------------------------------ search

    def _set_search_params(self, k: int, ef_search: int, nprobe: int) -> None:
        import faiss

        if isinstance(self.index, faiss.IndexHNSW):
            self.index.hnsw.efSearch = max(ef_search, k)
        ivf = faiss.try_extract_index_ivf(self.index)
        if ivf is not None:
            ivf.nprobe = min(nprobe, ivf.nlist)

    def search(self, qvecs: np.ndarray, k: int, key: np.ndarray, docids: list[str], *, ef_search: int,
               nprobe: int) -> tuple[np.ndarray, list[list[str]]]:
        """Top min(k, N) docs per query vector: (scores [nq, k], docids), best first, ties by ``key`` (each row's
        rank in docid order); an approximate index may find fewer (their scores are -inf)."""
        self.finish()
        qvecs = np.ascontiguousarray(qvecs, dtype=np.float32)
        n = len(key)
        k = min(k, n)
        if k <= 0 or len(qvecs) == 0:
            return np.zeros((len(qvecs), max(k, 0)), np.float32), [[] for _ in range(len(qvecs))]
        # fetch a margin so equal scores at the cut can be ordered by docid; widen while a tie crosses it
        fetch = min(n, k + max(8, k // 8))
        self._set_search_params(fetch, ef_search, nprobe)
        scores, rows = self.index.search(qvecs, fetch)
        out_s = np.empty((len(qvecs), k), np.float32)
        out_r = np.empty((len(qvecs), k), np.int64)
        for q in range(len(qvecs)):
            s, r, f = scores[q], rows[q], fetch
            while f < n and r[-1] >= 0 and s[-1] == s[k - 1]:
                f = min(n, f * 2)
                self._set_search_params(f, ef_search, nprobe)
                s2, r2 = self.index.search(qvecs[q : q + 1], f)
                s, r = s2[0], r2[0]
            valid = r >= 0
            s, r = s[valid], r[valid]
            order = np.lexsort((key[r], -s))[:k]
            m = len(order)
            out_s[q, :m], out_r[q, :m] = s[order], r[order]
            if m < k:  # approximate indexes may return fewer than k
                out_s[q, m:], out_r[q, m:] = -np.inf, -1
        return out_s, [[docids[i] for i in row if i >= 0] for row in out_r]

    def dot(self, qvec: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
        """The query vector's inner product with the stored vectors of ``rows`` (what search ranks by)."""
        return self.vectors_at(rows, n) @ qvec

    # ------------------------------------------------------------ files

    def files(self) -> dict:
        return {"faiss": "index.faiss", "vectors": None if self.lossless() else "vectors.npy"}

    def write(self, directory: Path, n: int) -> None:
        import faiss

        self.finish()
        faiss.write_index(self.index, str(directory / "index.faiss"))
        if not self.lossless():
            np.save(directory / "vectors.npy", self.vectors(n))

    @classmethod
    def read(cls, directory: Path, files: dict, n_docs: int, index_type: str, **settings) -> FaissStore:
        """A version's faiss index (and exact vectors, where it keeps them), checked against the doc count."""
        import faiss

        out = cls(None, index_type, **settings)
        with base.reading(directory / files["faiss"]):
            out.index = faiss.read_index(str(directory / files["faiss"]))
        out.dim = out.index.d
        if files.get("vectors"):
            with base.reading(directory / files["vectors"]):
                out._vectors = [np.load(directory / files["vectors"])]
            if len(out._vectors[0]) != n_docs:
                raise store.damaged(directory / files["vectors"], f"{len(out._vectors[0])} vectors for {n_docs} ids")
        else:
            out._vectors = None
        if out.index.ntotal != n_docs:
            raise store.damaged(directory / files["faiss"], f"{out.index.ntotal} vectors but {base.DOCIDS} has {n_docs} ids")
        return out
