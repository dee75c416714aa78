"""The sparse head's store (``SparseRowStore``) and the sparse backend (``SparseIndex``): a model's SPLADE head
(models/sparse.py) over the corpus, searched exactly as a scipy CSR matrix.

Each doc keeps the ``top_k`` largest of its term weights. Rows are stored fixed-width (ELLPACK: ``terms.npy``
int32 [N, k] and ``weights.npy`` float32 [N, k], zero-padded), with the pair packed side by side as one float32 row
[terms | weights] in memory (term ids < 2^24 are exact in float32): one encoded row per doc, so the store rides on
``EncodedIndex``'s content-hash updates, checkpointed encoding, versions and merges, alone (``--method sparse``) or
beside the dense head's vectors (indexes/heads/sparse.py). Search builds the CSR matrix once per opened index and scores every doc:
``Q @ Dᵀ``, ties by docid, the same order as every other backend.

Queries: the head's ``query`` mode — LightRetriever's token counts (no model runs for a query) or the head itself
(symmetric SPLADE). ``--sparse-top-k`` at index time keeps fewer terms per doc than the head's default.

Large corpora: ``search --sparse-search seismic`` (the default ``auto`` picks it from 100,000 docs) searches with
Seismic (Bruch et al., SIGIR 2024; pyseismic-lsr, the ``sparse`` extra): clustered, summarised inverted lists,
approximate. An index of ``SEISMIC_FROM`` docs or more builds it when it is written and saves it beside the rows
(``sparse.index.seismic``, in the same atomic version), so a search process loads it instead of building it;
a smaller index builds it in memory when first searched with ``--sparse-search seismic``. Its candidates are rescored
exactly from the CSR rows, so scores and tie order are the exact path's and only recall can differ
(bench/sparse_index.py reports it against exact). ``--query-cut`` (query terms kept, largest first) and
``--heap-factor`` trade recall for speed as in Seismic's guidelines.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np

from retrctl import records
from retrctl.errors import UsageError
from retrctl.indexes import base, store
from retrctl.indexes.encoded import (
    CHECKPOINT_EVERY,
    EncodedIndex,
    describe,
    encoder_from_manifest,
    same_encoder,
)
from retrctl.models.config import SPARSE_TOP_K_HELP
from retrctl.process import stdout_to_stderr  # Seismic's Rust core prints its build log on descriptor 1

log = logging.getLogger("retrctl.index")
QUERY_CHUNK = 64  # queries scored at once: [chunk, N] dense scores
SEISMIC_FROM = 100_000  # --sparse-search auto: exact below this many docs (a [64, N] score block is cheap), Seismic above
SEARCHES = ("auto", "exact", "seismic")


def pack(terms: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return np.concatenate([terms.astype(np.float32), weights.astype(np.float32)], axis=1)


def unpack(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    k = rows.shape[1] // 2
    return rows[:, :k].astype(np.int32), rows[:, k:]


def exact_search(docs, qrows: np.ndarray, k: int, key: np.ndarray, docids: list[str]) -> tuple[np.ndarray, list[list[str]]]:
    """Top min(k, N) docs of CSR ``docs`` [N, vocab] for packed query rows: (scores [nq, k], docids), best first,
    ties by docid (``key``)."""
    from retrctl.models.sparse import to_csr

    n, k = docs.shape[0], min(k, docs.shape[0])
    if k <= 0 or len(qrows) == 0:
        return np.zeros((len(qrows), max(k, 0)), np.float32), [[] for _ in range(len(qrows))]
    docs_t = docs.T.tocsr()
    out_s = np.empty((len(qrows), k), np.float32)
    rows = np.empty((len(qrows), k), np.int64)
    for start in range(0, len(qrows), QUERY_CHUNK):
        q = to_csr(*unpack(qrows[start : start + QUERY_CHUNK]), docs.shape[1])
        scores = (q @ docs_t).toarray() if n else np.zeros((q.shape[0], 0), np.float32)
        for i, row in enumerate(scores):
            top = base.top_k(row, key, k)
            out_s[start + i], rows[start + i] = row[top], top
    return out_s, [[docids[i] for i in r] for r in rows]


def seismic_index(docs):
    """A Seismic index over CSR ``docs`` [N, vocab]; documents are named by row position."""
    try:
        import seismic
    except ImportError:
        raise UsageError("--sparse-search seismic needs pyseismic-lsr: pip install 'retrctl[sparse]'") from None
    docs = docs.tocsr()
    docs.sort_indices()
    dataset = seismic.SeismicDataset()
    dataset.add_documents_by_id([str(i) for i in range(docs.shape[0])], docs.indices.astype(np.int64),
                                docs.data.astype(np.float32), docs.indptr.astype(np.int64))
    t = time.perf_counter()
    with stdout_to_stderr():
        built = seismic.SeismicIndex.build_from_dataset(dataset)
    log.info("seismic: indexed %d docs in %.1f s", docs.shape[0], time.perf_counter() - t)
    return built


def seismic_search(built, docs, qrows: np.ndarray, k: int, key: np.ndarray, docids: list[str], *, query_cut: int,
                   heap_factor: float) -> tuple[np.ndarray, list[list[str]]]:
    """``exact_search``'s answer from Seismic's candidates (top min(k, N)), each rescored exactly from ``docs``."""
    import seismic

    from retrctl.models.sparse import to_csr

    k = min(k, docs.shape[0])
    out_s = np.zeros((len(qrows), k), np.float32)
    out_ids: list[list[str]] = []
    if k <= 0 or len(qrows) == 0:
        return out_s, [[] for _ in range(len(qrows))]
    string = seismic.get_seismic_string()
    terms, weights = unpack(qrows)
    comps = [np.array([str(t) for t, w in zip(ts, ws, strict=True) if w > 0], dtype=string) for ts, ws in zip(terms, weights, strict=True)]
    vals = [ws[ws > 0].astype(np.float32) for ws in weights]
    found: dict[int, set[int]] = {i: set() for i in range(len(qrows))}
    asked = [i for i in range(len(qrows)) if len(comps[i])]  # a query with no term matches nothing
    if asked:  # results come back in the order the threads finish: each hit names its query
        for hits in built.batch_search(np.array([str(i) for i in asked], dtype=string), [comps[i] for i in asked],
                                       [vals[i] for i in asked], k, query_cut, heap_factor):
            for qid, _, d in hits:
                found[int(qid)].add(int(d))
    q = to_csr(terms, weights, docs.shape[1])
    for i in range(len(qrows)):
        cand = np.array(sorted(found[i]), dtype=np.int64)
        scores = (docs[cand] @ q[i].T).toarray()[:, 0] if len(cand) else np.zeros(0, np.float32)
        top = base.top_k(scores, key[cand], k) if len(cand) else cand
        out_s[i, : len(top)] = scores[top]
        out_ids.append([docids[j] for j in cand[top]])
    return out_s, out_ids


SEISMIC_FILE = "sparse.index.seismic"  # what SeismicIndex.save("<dir>/sparse") writes

SPARSE_TOP_K = base.Flag("sparse_top_k", f"{SPARSE_TOP_K_HELP} [default: the model's sparse head's]", int, low=1)
NO_SPARSE = "--{flag}: this {backend} index holds no sparse head"
KNOBS = {"sparse_search": "auto", "query_cut": 20, "heap_factor": 0.9}  # a token-count query has ~20 terms, all weight 1
SEARCH_FLAGS = (
    base.Flag("sparse_search", "Sparse head: exact (scipy CSR) or seismic (approximate inverted index, candidates "
              "rescored exactly). [default: auto = seismic from 100,000 docs]", SEARCHES, refused=NO_SPARSE),
    base.Flag("query_cut", "Seismic: the query's largest terms searched. [default: 20]", int, low=1, refused=NO_SPARSE),
    base.Flag("heap_factor", "Seismic: block-skipping threshold; lower is faster, less exact. [default: 0.9]", float,
              low=0, high=1, low_open=True, refused=NO_SPARSE),
)


class SparseRowStore:
    """The sparse head's store: each doc's top-k (term, weight) pairs as one packed float32 row, row-aligned with the
    owning index's docs; the CSR matrix built from them once per change; exact or Seismic search."""

    knobs = tuple(KNOBS)  # the search settings ``search`` reads off the index

    def __init__(self, top_k: int | None, vocab: int | None):
        self.top_k, self.vocab = top_k, vocab
        self._rows: list[np.ndarray] = []
        self.files: dict = {}  # the Seismic index the last write saved beside the rows, if any
        self._seismic = None  # (the CSR matrix it was built from, the Seismic index)
        self._changed()

    @property
    def width(self) -> int:
        return 2 * self.top_k

    def _changed(self) -> None:
        """The stored rows changed in memory: the CSR matrix and a loaded version's Seismic index no longer hold."""
        self._csr, self._seismic_saved = None, None

    def vectors(self, n: int | None = None) -> np.ndarray:
        """All packed rows (a copy)."""
        if not self._rows:
            return np.zeros((0, 2 * (self.top_k or 0)), np.float32)
        stored = np.concatenate(self._rows) if len(self._rows) != 1 else self._rows[0]
        self._rows = [stored]
        return stored.copy()

    def vectors_at(self, rows: np.ndarray, n: int | None = None) -> np.ndarray:
        return self.vectors()[rows]

    def append(self, rows: np.ndarray) -> None:
        self._rows.append(rows)
        self._changed()

    def finish(self) -> None:
        """Nothing waits: rows are searchable once appended."""

    def apply(self, replaced: dict[int, np.ndarray], removed: list[int], n: int | None = None) -> None:
        rows = self.vectors()
        for pos, row in replaced.items():
            rows[pos] = row
        keep = np.ones(len(rows), dtype=bool)
        keep[removed] = False
        self._rows = [np.ascontiguousarray(rows[keep])]
        self._changed()

    @classmethod
    def joined(cls, stores: list[SparseRowStore], counts: list[int]) -> SparseRowStore:
        out = cls(stores[0].top_k, stores[0].vocab)
        out._rows = [np.concatenate([s.vectors() for s in stores])]
        return out

    def matrix(self):
        """The docs as a scipy CSR matrix [N, vocab] (built once per change)."""
        from retrctl.models.sparse import to_csr

        if self._csr is None:
            self._csr = to_csr(*unpack(self.vectors()), self.vocab)
        return self._csr

    # ------------------------------------------------------------ search

    def search(self, qrows: np.ndarray, k: int, key: np.ndarray, docids: list[str], *, sparse_search: str = "auto",
               query_cut: int = 20, heap_factor: float = 0.9) -> tuple[np.ndarray, list[list[str]]]:
        """Top min(k, N) docs per packed query row: (scores [nq, k], docids), best first, ties by ``key``; exact,
        or Seismic's candidates rescored exactly (``sparse_search`` auto picks Seismic from ``SEISMIC_FROM`` docs)."""
        docs = self.matrix()
        if sparse_search not in SEARCHES:
            raise UsageError(f"--sparse-search {sparse_search}: choose one of {', '.join(SEARCHES)}")
        use = sparse_search if sparse_search != "auto" else ("seismic" if docs.shape[0] >= SEISMIC_FROM else "exact")
        if use == "exact" or docs.shape[0] == 0:
            return exact_search(docs, qrows, k, key, docids)
        if self._seismic is None or self._seismic[0] is not docs:
            self._seismic = (docs, self._load_seismic() or seismic_index(docs))
        return seismic_search(self._seismic[1], docs, qrows, k, key, docids, query_cut=query_cut, heap_factor=heap_factor)

    def dot(self, qrow: np.ndarray, rows: np.ndarray, n: int | None = None) -> np.ndarray:
        """The packed query row's dot product with the docs at ``rows`` (what search ranks by)."""
        from retrctl.models.sparse import to_csr

        q = to_csr(*unpack(qrow[None]), self.vocab)
        return (self.matrix()[rows] @ q.T).toarray()[:, 0]

    def _load_seismic(self):
        path = self._seismic_saved
        if path is None:
            return None
        import seismic

        with base.reading(path), stdout_to_stderr():
            built = seismic.SeismicIndex.load(str(path))
        log.info("seismic: loaded %s", path)
        return built

    # ------------------------------------------------------------ files

    def nonzeros(self) -> int:
        return int(self.matrix().nnz) if sum(len(r) for r in self._rows) else 0

    def write(self, directory: Path, n: int | None = None) -> None:
        """``terms.npy``/``weights.npy``, and the Seismic index of a large corpus (named in ``files``), so a search
        process loads it instead of building it."""
        terms, weights = unpack(self.vectors())
        np.save(directory / "terms.npy", terms)
        np.save(directory / "weights.npy", weights)
        docs = self.matrix()
        self.files = {}
        if docs.shape[0] < SEISMIC_FROM:
            return
        if self._seismic is None or self._seismic[0] is not docs:
            self._seismic = (docs, seismic_index(docs))
        with stdout_to_stderr():
            self._seismic[1].save(str(directory / SEISMIC_FILE.removesuffix(".index.seismic")))
        self.files = {"seismic": SEISMIC_FILE}

    @classmethod
    def read(cls, directory: Path, files: dict, n_docs: int, top_k: int, vocab: int) -> SparseRowStore:
        """A version's rows (``files``: its terms and weights, and the Seismic index it saved, read only when searched),
        checked against the doc count."""
        arrays = []
        for name in ("terms", "weights"):
            path = directory / files[name]
            with base.reading(path):
                arrays.append(np.load(path))
            if arrays[-1].shape != (n_docs, top_k):
                raise store.damaged(path, f"shape {arrays[-1].shape} for {n_docs} ids")
        out = cls(top_k, vocab)
        out._rows = [pack(*arrays)]
        out._seismic_saved = directory / files["seismic"] if "seismic" in files else None
        return out


class SparseIndex(EncodedIndex):
    name = "sparse"
    summary = "learned sparse: the model's SPLADE head, exact scipy CSR"
    flags = ("batch_size", "checkpoint_every", "sparse_top_k")
    search_knobs = ("batch_size", "sparse_search", "query_cut", "heap_factor")
    index_flags = (CHECKPOINT_EVERY, SPARSE_TOP_K)
    search_flags = SEARCH_FLAGS
    searched = "sparse"
    sparse_search, query_cut, heap_factor = KNOBS.values()

    def __init__(self, encoder, batch_size: int = 32, *, chunk_size: int = 4096, top_k: int | None = None):
        if encoder is not None and getattr(encoder, "sparse", None) is None:
            raise UsageError(f"{getattr(encoder, 'source', 'the model')} has no sparse head: train one with "
                             "`retrctl train --heads dense,sparse` (an ONNX export carries the dense head only)")
        self.top_k = top_k or (encoder.sparse.top_k if encoder is not None else None)
        if encoder is not None:
            if not self.top_k:
                raise UsageError("a sparse index keeps each doc's top-k terms: give --sparse-top-k N")
            encoder.sparse.top_k = self.top_k
        self.vocab = encoder.sparse.vocab if encoder is not None else None
        super().__init__(encoder, batch_size, chunk_size)
        self._clear()

    def new_stores(self) -> dict:
        return {"sparse": SparseRowStore(self.top_k, self.vocab)}

    def config(self) -> dict:
        return {"batch_size": self.batch_size, "chunk_size": self.chunk_size, "top_k": self.top_k}

    @classmethod
    def create(cls, encoder=None, *, batch_size: int = 32, checkpoint_every: int = 4096, sparse_top_k: int | None = None):
        return cls(encoder, batch_size=batch_size, chunk_size=checkpoint_every, top_k=sparse_top_k)

    @classmethod
    def content_settings(cls, manifest: dict) -> dict:
        return {"top_k": manifest.get("settings", {}).get("top_k"), **base.encoder_content(manifest)}

    @classmethod
    def run_tag(cls, manifest: dict) -> str:
        return str(manifest.get("encoder", {}).get("model", "sparse")).rstrip("/").rsplit("/", 1)[-1] + "-sparse"

    def describe(self) -> str:
        mode = self.encoder.sparse.query if self.encoder is not None else "?"
        return f"{len(self)} docs, sparse top-{self.top_k} terms, queries by {mode}, encoder {(self.encoder_desc or {}).get('model')}"

    def _doc_rows(self, texts: list[str]) -> np.ndarray:
        return pack(*self.encoder.encode_sparse(texts, "passage", self.batch_size))

    def _encode_queries(self, queries: list[dict]) -> np.ndarray:
        if self.encoder is None:
            raise ValueError("this SparseIndex has no encoder to encode queries")
        return pack(*self.encoder.encode_sparse([q["query_text"] for q in queries], "query", self.batch_size))

    def matrix(self):
        """The docs as a scipy CSR matrix [N, vocab] (built once per change)."""
        return self.stores["sparse"].matrix()

    # ------------------------------------------------------------ files

    def manifest(self) -> dict:
        return {"backend": self.name, "settings": self.config(), "encoder": self.encoder_desc, "vocab": self.vocab,
                "metric": "dot", "doc_count": len(self), "nonzeros": self.stores["sparse"].nonzeros(),
                "files": {"terms": "terms.npy", "weights": "weights.npy", "docids": base.DOCIDS,
                          **self.stores["sparse"].files},
                **self.meta}

    def write_files(self, directory: Path) -> None:
        self.stores["sparse"].write(directory)
        base.write_docids(directory, self.docids, self._hash)
        base.write_manifest(directory, self.manifest())

    @classmethod
    def load(cls, directory, encoder=None, device: str | None = None, query_encoder: str = "full",
             with_encoder: bool = True, **overrides) -> SparseIndex:
        """Open a saved index; the encoder as ``DenseIndex.load`` (``with_encoder=False``: none loaded)."""
        version = store.resolved(directory)
        directory, manifest = version.path, version.manifest
        if encoder is None and with_encoder:
            encoder = encoder_from_manifest(manifest, device=device, warn=directory, **overrides)
        settings = manifest["settings"]
        idx = cls(encoder, settings.get("batch_size", 32), chunk_size=settings.get("chunk_size", 4096), top_k=settings["top_k"])
        idx._read_meta(manifest)
        idx.vocab = manifest["vocab"]
        docids, hashes = base.read_docids(directory)
        idx.stores["sparse"] = SparseRowStore.read(directory, manifest["files"], len(docids), settings["top_k"], idx.vocab)
        idx._set_ids(docids, hashes)
        idx.version = version
        return idx

    def write_json_vectors(self, path: Path, scale: float = 100.0) -> int:
        """The docs as Anserini's JsonVectorCollection (``{"id", "contents", "vector": {token: impact}}`` per line,
        weights × ``scale`` rounded to integer impacts, as Pyserini's SPLADE indexes), so Lucene can serve them;
        returns the lines written. Queries go to Lucene pretokenized: the tokenizer's tokens joined by spaces
        (``--impact --pretokenized``), which scores token counts against the impacts, as this index does."""
        tokens = self.encoder.tokenizer.convert_ids_to_tokens(list(range(self.vocab)))
        terms, weights = unpack(self.vectors())
        with records.open_output(path) as f:
            for docid, t, w in zip(self.docids, terms, weights, strict=True):
                impacts = {tokens[i]: int(round(float(x) * scale)) for i, x in zip(t, w, strict=True) if x > 0}
                f.write(json.dumps({"id": docid, "contents": "", "vector": {k: v for k, v in impacts.items() if v > 0}},
                                   ensure_ascii=False) + "\n")
        return len(self.docids)

    @classmethod
    def merge(cls, parts: list[SparseIndex]) -> SparseIndex:
        first = parts[0]
        for p in parts[1:]:
            if p.top_k != first.top_k or not same_encoder(p.encoder_desc, first.encoder_desc):
                raise ValueError("cannot merge sparse indexes built with different encoders or top-k")
        out = cls(first.encoder, **{k: v for k, v in first.config().items() if k != "top_k"}, top_k=first.top_k)
        out.encoder_desc = first.encoder_desc or (describe(first.encoder) if first.encoder is not None else None)
        out._joined_stores(parts)
        return out
