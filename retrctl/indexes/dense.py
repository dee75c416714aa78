"""Dense index: encoder vectors in a faiss index (inner product), any faiss factory string.

``DenseIndex(encoder, index_type="Flat")`` — ``Flat`` is exact search; ``HNSW32`` a graph (Malkov &
Yashunin 2016, arXiv:1603.09320); ``IVF1024,PQ32`` an inverted file with product quantization (Jégou et al.
2011), trained on a seeded sample of the corpus vectors. The metric is always inner product, i.e. the
model's own similarity: cosine when the encoder normalizes (recorded as ``normalized`` in the manifest),
dot product otherwise.

Files: ``index.json`` (settings = the constructor's arguments, the encoder's description — pooling,
prompts, max lengths, normalize —, dim, metric, doc count), ``index.faiss`` (faiss's own format),
``docids.parquet`` (docid + content hash per row), and ``vectors.npy`` when the faiss index cannot give the
exact vectors back (IVF, PQ, SQ…): updates and merges rebuild from exact vectors, never from codes.

Updates: adding docs appends to the faiss index; changing or removing docs rebuilds it from the vectors
(HNSW has no ``remove_ids``, faiss#3339; ``remove_ids`` is a full scan anyway, faiss#1021), keeping an
IVF's trained quantizer. Encoding runs in chunks; with a ``workdir`` each chunk is saved there and reused
when a killed run is restarted on the same docs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from retrctl import records
from retrctl.errors import UsageError
from retrctl.indexes import base, store

# the encoder settings a manifest records, and those that change the doc vectors (overriding them at search time
# mismatches the index): declared once, in retrctl/models/config.py
from retrctl.models.config import INDEX_HEADS, PASSAGE_KEYS
from retrctl.models.config import SETTINGS as ENCODER_KEYS

log = logging.getLogger("retrctl.index")
logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # which SIMD build loaded is not news for stderr

CHECKPOINT_EVERY = base.Flag("checkpoint_every", "Dense: save encoded vectors every N docs under IDX.partial, so a "
                             "killed run resumes from there.", int, low=1, default=4096)
SPARSE_TOP_K = base.Flag("sparse_top_k", "Sparse: terms kept per doc [default: the model's sparse head's].", int, low=1)
INDEX_FLAGS = (
    base.Flag("index_type", "faiss factory string, inner product: Flat, HNSW32, IVF1024,PQ32, …", default="Flat"),
    CHECKPOINT_EVERY,
    base.Flag("heads", "Dense: the model's heads to index, each a sub-index built in the same pass, from dense, sparse "
              "(= lexical), colbert; dense required (e.g. dense,colbert). [default: every head the model has]"),
    SPARSE_TOP_K,
)
SEARCH_FLAGS = (
    base.Flag("ef_search", "HNSW: candidates explored per query (default: the index's).", int, low=1),
    base.Flag("nprobe", "IVF: inverted lists probed per query (default: the index's).", int, low=1),
)


class DenseIndex(base.Index):
    name = "dense"
    summary = "faiss"
    needs_encoder = True
    flags = ("index_type", "batch_size", "checkpoint_every", "heads", "sparse_top_k")
    search_knobs = ("batch_size", "ef_search", "nprobe")
    index_flags = INDEX_FLAGS
    multi_head: type | None = None  # indexes/heads.py's HeadsIndex registers itself: the vectors + the other heads

    def __init__(self, encoder, index_type: str = "Flat", batch_size: int = 32, *, chunk_size: int = 4096,
                 ef_search: int = 128, nprobe: int = 32, train_size: int = 262144, seed: int = 0):
        super().__init__()
        self.encoder = encoder
        self.index_type, self.batch_size, self.chunk_size = index_type, batch_size, chunk_size
        self.ef_search, self.nprobe, self.train_size, self.seed = ef_search, nprobe, train_size, seed
        self.dim = encoder.dim if encoder is not None else None
        self.normalized = bool(encoder.config.normalize) if encoder is not None else None
        self.encoder_desc = _describe(encoder) if encoder is not None else None
        if self.normalized is False and index_type != "Flat":
            log.warning("the encoder does not normalize: %s searches raw inner products, where graph/IVF recall is "
                        "usually lower than on unit vectors", index_type)
        self.workdir: Path | None = None
        self.encoded = 0
        self._last_queries: dict[str, np.ndarray] = {}  # query text -> vector, of the last search
        self._clear()

    def config(self) -> dict:
        return {"index_type": self.index_type, "batch_size": self.batch_size, "chunk_size": self.chunk_size,
                "ef_search": self.ef_search, "nprobe": self.nprobe, "train_size": self.train_size, "seed": self.seed}

    # ------------------------------------------------------------ what the stages ask

    @classmethod
    def create(cls, encoder=None, *, index_type: str = "Flat", batch_size: int = 32, checkpoint_every: int = 4096,
               heads: str | None = None, sparse_top_k: int | None = None) -> DenseIndex:
        """``heads``: None = every head the model has; with a sparse or colbert head, the ``multi_head`` class builds it."""
        if heads is None and all(getattr(encoder, h, None) is None for h in INDEX_HEADS[1:]) or heads == "dense":
            return cls(encoder, index_type=index_type, batch_size=batch_size, chunk_size=checkpoint_every)
        return cls.multi_head.for_heads(encoder, heads, index_type=index_type, batch_size=batch_size,
                                    chunk_size=checkpoint_every, top_k=sparse_top_k)

    @classmethod
    def encoder_for(cls, model: str | None, manifest: dict | None, **settings):
        if model is None:
            return encoder_from_manifest(manifest, **settings)
        from retrctl.models.runtime import load_encoder  # torch weights, or an exported ONNX graph

        device, dtype = settings.pop("device", None), settings.pop("dtype", None)
        return load_encoder(model, device=device, dtype=dtype, **settings)

    @classmethod
    def content_settings(cls, manifest: dict) -> dict:
        """The faiss structure and every encoder setting (the model included): what the vectors depend on."""
        settings = manifest.get("settings", {})
        return {"index_type": settings.get("index_type"), "heads": settings.get("heads") or ["dense"],
                "sparse_top_k": settings.get("top_k"), **base.encoder_content(manifest)}

    @classmethod
    def run_tag(cls, manifest: dict) -> str:
        model = str(manifest.get("encoder", {}).get("model", "dense")).rstrip("/").rsplit("/", 1)[-1]
        return f"{model}-{manifest.get('settings', {}).get('index_type', 'Flat')}"

    def describe(self) -> str:
        c = self.encoder.config if self.encoder is not None else None
        how = f" (pooling {c.pooling}, query prompt {c.query_prompt!r})" if c is not None else ""
        return f"{len(self)} docs, {self.index_type}, encoder {(self.encoder_desc or {}).get('model')}{how}"

    def prepare_update(self, workdir: Path, *, batch_size: int | None = None, checkpoint_every: int | None = None,
                       **_other) -> None:
        self.batch_size = batch_size or self.batch_size
        self.chunk_size = checkpoint_every or self.chunk_size
        self.workdir = workdir

    def report_update(self, stats: dict, workdir: Path) -> None:
        self.encoder.report_truncation({"passage": self.encoded})
        if self.encoded != stats["added"] + stats["updated"]:
            log.info("encoded %d docs; %d came from the checkpoints in %s", self.encoded,
                     stats["added"] + stats["updated"] - self.encoded, workdir)

    # ------------------------------------------------------------ faiss plumbing

    def _clear(self) -> None:
        super()._clear()
        self._invalidate()
        self.index = self._new_faiss() if self.dim else None
        self._vectors: list[np.ndarray] | None = None if self._lossless() else []
        self._pending: list[np.ndarray] = []  # vectors waiting for an IVF to be trained

    def _new_faiss(self):
        import faiss

        try:
            return faiss.index_factory(self.dim, self.index_type, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as e:
            raise ValueError(f"bad faiss index type {self.index_type!r}: {str(e).strip().splitlines()[-1]}") from None

    def _lossless(self) -> bool:
        """Can the faiss index give the exact vectors back (so no vectors.npy is needed)?"""
        import faiss

        return self.index is None or isinstance(self.index, (faiss.IndexFlat, faiss.IndexHNSWFlat))

    def vectors(self) -> np.ndarray:
        """All vectors, row-aligned with ``docids`` (a copy)."""
        if len(self) == 0:
            return np.zeros((0, self.dim or 0), dtype=np.float32)
        if self._vectors is not None:
            stored = np.concatenate(self._vectors) if len(self._vectors) != 1 else self._vectors[0]
            self._vectors = [stored]
            return stored.copy()
        done = self.index.reconstruct_n(0, self.index.ntotal) if self.index.ntotal else np.zeros((0, self.dim), np.float32)
        return np.concatenate([done, *self._pending]) if self._pending else done

    def get_vectors(self, docids: Iterable[str]) -> np.ndarray:
        """Vectors of the given docs (KeyError for an unknown id)."""
        return self.vectors_at(np.array([self._pos[d] for d in docids], np.int64))

    def vectors_at(self, rows: np.ndarray) -> np.ndarray:
        """The stored vectors of the given row positions (exact: an IVF/PQ index keeps them beside its codes)."""
        if not len(rows):
            return np.zeros((0, self.dim), np.float32)
        if self._vectors is None and not self._pending:
            return self.index.reconstruct_batch(np.asarray(rows, np.int64))
        if self._vectors is not None and len(self._vectors) == 1:
            return self._vectors[0][rows]
        return self.vectors()[rows]  # joins the appended chunks (and any vectors waiting for an IVF) first

    def _append_vectors(self, vecs: np.ndarray) -> None:
        if self._vectors is not None:
            self._vectors.append(vecs)
        if self.index.is_trained and not self._pending:
            self.index.add(vecs)
        else:
            self._pending.append(vecs)

    def _train_pending(self) -> None:
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

    def _rebuild(self, vecs: np.ndarray) -> None:
        """Replace the faiss contents by ``vecs`` (an IVF keeps its trained quantizer)."""
        self._invalidate()
        self.index.reset()
        self._pending = []
        if self._vectors is not None:
            self._vectors = [vecs]
        if len(vecs):
            if self.index.is_trained:
                self.index.add(vecs)
            else:
                self._pending = [vecs]
                self._train_pending()

    # ------------------------------------------------------------ encoding with checkpoints

    def _encode(self, chunk: list[tuple[dict, str, int | None]], n: int) -> np.ndarray:
        ids = [d["docid"] for d, _, _ in chunk]
        hashes = [h for _, h, _ in chunk]
        ckpt = self.workdir / f"{n:06d}" if self.workdir is not None else None
        if ckpt is not None and ckpt.with_suffix(".json").exists():
            saved = json.loads(ckpt.with_suffix(".json").read_text())
            if saved == {"docids": ids, "hashes": hashes}:
                return np.load(ckpt.with_suffix(".npy"))
        vecs = self._doc_vectors([records.passage_text(d) for d, _, _ in chunk])
        bad = ~np.isfinite(vecs).all(axis=1)
        if bad.any():  # a broken forward gives NaN embeddings that search would rank silently (tevatron#103)
            raise ValueError(f"the encoder returned NaN/inf vectors for {int(bad.sum())} docs, e.g. {ids[int(np.argmax(bad))]!r}")
        self.encoded += len(chunk)
        if ckpt is not None:
            self.workdir.mkdir(parents=True, exist_ok=True)
            np.save(ckpt.with_suffix(".npy"), vecs)
            # the JSON is written last: its presence marks the chunk complete
            tmp = ckpt.with_suffix(".json.tmp")
            tmp.write_text(json.dumps({"docids": ids, "hashes": hashes}))
            tmp.replace(ckpt.with_suffix(".json"))
        return vecs

    def _doc_vectors(self, texts: list[str]) -> np.ndarray:
        """The rows stored for ``texts`` (a subclass stores another representation through the same plumbing)."""
        return self.encoder.encode(texts, kind="passage", batch_size=self.batch_size)

    # ------------------------------------------------------------ updates

    def sync(self, docs: Iterable[dict], delete: bool = True) -> dict:
        if self.encoder is None:
            raise ValueError("this DenseIndex has no encoder: load it with an encoder to add docs")
        stats, seen = base.new_stats(), set()
        replaced: dict[int, tuple[str, np.ndarray]] = {}
        for n, chunk in enumerate(records.batched(self._classify(docs, seen, stats), self.chunk_size)):
            vecs = self._encode(chunk, n)
            new = [i for i, (_, _, pos) in enumerate(chunk) if pos is None]
            for i, (_, h, pos) in enumerate(chunk):
                if pos is not None:
                    replaced[pos] = (h, vecs[i])
            if new:
                self._invalidate()
                self._append_ids([chunk[i][0]["docid"] for i in new], [chunk[i][1] for i in new])
                self._append_vectors(np.ascontiguousarray(vecs[new]))
        removed = self._missing_rows(seen) if delete else []
        stats["removed"] = len(removed)
        self._apply(replaced, removed)
        return stats

    def remove(self, docids: Iterable[str]) -> int:
        rows = sorted({self._pos[d] for d in docids if d in self._pos})
        self._apply({}, rows)
        return len(rows)

    def _apply(self, replaced: dict, removed: list[int]) -> None:
        if not replaced and not removed:
            self._train_pending()
            return
        vecs = self.vectors()
        for pos, (h, v) in replaced.items():
            vecs[pos] = v
            self._hash[pos] = h
        keep = np.ones(len(vecs), dtype=bool)
        keep[removed] = False
        self._keep_rows(keep)
        log.info("rebuilding %s from %d vectors (%d changed, %d removed)", self.index_type, int(keep.sum()), len(replaced), len(removed))
        self._rebuild(np.ascontiguousarray(vecs[keep]))

    # ------------------------------------------------------------ search

    def _set_search_params(self, k: int) -> None:
        import faiss

        if isinstance(self.index, faiss.IndexHNSW):
            self.index.hnsw.efSearch = max(self.ef_search, k)
        ivf = faiss.try_extract_index_ivf(self.index)
        if ivf is not None:
            ivf.nprobe = min(self.nprobe, ivf.nlist)

    def search_vectors(self, qvecs: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """Top min(k, len) rows per query vector: (scores [nq, k], docids), best first, ties by docid."""
        self._train_pending()
        qvecs = np.ascontiguousarray(qvecs, dtype=np.float32)
        n = len(self)
        k = min(k, n)
        if k <= 0 or len(qvecs) == 0:
            return np.zeros((len(qvecs), max(k, 0)), np.float32), [[] for _ in range(len(qvecs))]
        key = self._order_key()
        # fetch a margin so equal scores at the cut can be ordered by docid; widen while a tie crosses it
        fetch = min(n, k + max(8, k // 8))
        self._set_search_params(fetch)
        scores, rows = self.index.search(qvecs, fetch)
        out_s = np.empty((len(qvecs), k), np.float32)
        out_r = np.empty((len(qvecs), k), np.int64)
        for q in range(len(qvecs)):
            s, r, f = scores[q], rows[q], fetch
            while f < n and r[-1] >= 0 and s[-1] == s[k - 1]:
                f = min(n, f * 2)
                self._set_search_params(f)
                s2, r2 = self.index.search(qvecs[q : q + 1], f)
                s, r = s2[0], r2[0]
            valid = r >= 0
            s, r = s[valid], r[valid]
            order = np.lexsort((key[r], -s))[:k]
            m = len(order)
            out_s[q, :m], out_r[q, :m] = s[order], r[order]
            if m < k:  # approximate indexes may return fewer than k
                out_s[q, m:], out_r[q, m:] = -np.inf, -1
        docids = [[self.docids[i] for i in row if i >= 0] for row in out_r]
        return out_s, docids

    def search(self, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        qvecs = self._encode_queries(queries)
        # kept until the next search: scoring this chunk's positives (mine) costs no second forward pass
        self._last_queries = {q["query_text"]: v for q, v in zip(queries, qvecs, strict=True)}
        scores, docids = self.search_vectors(qvecs, k)
        return {q["query_id"]: [(d, float(s)) for d, s in zip(ids, row, strict=False)] for q, ids, row in zip(queries, docids, scores, strict=True)}

    def score(self, query: dict, docids: Iterable[str]) -> dict[str, float]:
        """The query vector's inner product with each given doc's stored vector (what search ranks by)."""
        docids = [d for d in docids if d in self._pos]
        if not docids:
            return {}
        qvec = self._last_queries.get(query["query_text"])
        if qvec is None:
            qvec = self._encode_queries([query])[0]
        return dict(zip(docids, self._dot(qvec, docids).tolist(), strict=True))

    def _dot(self, qvec: np.ndarray, docids: list[str]) -> np.ndarray:
        return self.get_vectors(docids) @ qvec

    def _encode_queries(self, queries: list[dict]) -> np.ndarray:
        if self.encoder is None:
            raise ValueError("this DenseIndex has no encoder to encode queries")
        return self.encoder.encode([q["query_text"] for q in queries], kind="query", batch_size=self.batch_size)

    # ------------------------------------------------------------ files

    def manifest(self) -> dict:
        return {
            "backend": self.name,
            "settings": self.config(),
            "encoder": self.encoder_desc,
            "dim": self.dim,
            "metric": "inner_product",
            "normalized": self.normalized,
            "doc_count": len(self),
            "files": {"faiss": "index.faiss", "docids": base.DOCIDS, "vectors": None if self._lossless() else "vectors.npy"},
            **self.meta,
        }

    def save(self, directory: str | Path, keep: int = base.KEEP) -> None:
        """Publish this index as a new version of ``directory`` (see retrctl.indexes.store)."""
        self._train_pending()
        with store.new_version(directory, keep) as tmp:
            self.write_files(tmp)

    def write_files(self, directory: Path) -> None:
        """Write the complete index files into the empty ``directory`` (one version)."""
        import faiss

        self._train_pending()
        manifest = self.manifest()
        faiss.write_index(self.index, str(directory / "index.faiss"))
        if manifest["files"]["vectors"]:
            np.save(directory / "vectors.npy", self.vectors())
        base.write_docids(directory, self.docids, self._hash)
        base.write_manifest(directory, manifest)

    @classmethod
    def load(cls, directory: str | Path, encoder=None, device: str | None = None, query_encoder: str = "full",
             **overrides) -> DenseIndex:
        """Open a saved index; the encoder is re-loaded from the manifest's description when not given.
        ``query_encoder``: ``auto`` encodes queries by token lookup when the model ships a table
        (models/lookup.py: no transformer loaded), ``full`` with the full model, ``token-lookup`` insists.

        ``overrides`` (pooling, query_prompt, query_max_len, dtype, …) go to ``Encoder.load``; overriding
        a setting the doc vectors were made with is allowed but warned about.
        """
        import faiss

        version = store.resolved(directory)
        if cls is DenseIndex and set(version.manifest.get("settings", {}).get("heads") or ()) - {"dense"}:
            return cls.multi_head.load(version, encoder=encoder, device=device, query_encoder=query_encoder, **overrides)
        directory, manifest = version.path, version.manifest
        desc = manifest["encoder"]
        if encoder is None:
            encoder = encoder_from_manifest(manifest, device=device, warn=directory, query_encoder=query_encoder, **overrides)
        else:
            mine = _describe(encoder)
            diff = {k for k in PASSAGE_KEYS if mine.get(k) != desc.get(k)}
            if mine["dim"] != desc["dim"]:
                raise ValueError(f"encoder dim {mine['dim']} != index dim {desc['dim']} ({directory})")
            if diff:
                log.warning("encoder differs from the one index %s was built with in %s", directory, ", ".join(sorted(diff)))
        idx = cls(encoder, **manifest["settings"])
        idx.encoder_desc = desc
        idx.normalized = manifest.get("normalized")
        idx.meta = {k: manifest[k] for k in ("source", "shard") if k in manifest}
        files = manifest["files"]
        with base.reading(directory / files["faiss"]):
            idx.index = faiss.read_index(str(directory / files["faiss"]))
        docids, hashes = base.read_docids(directory)
        idx._set_ids(docids, hashes)
        if files.get("vectors"):
            with base.reading(directory / files["vectors"]):
                idx._vectors = [np.load(directory / files["vectors"])]
            if len(idx._vectors[0]) != len(docids):
                raise store.damaged(directory / files["vectors"], f"{len(idx._vectors[0])} vectors for {len(docids)} ids")
        else:
            idx._vectors = None
        if idx.index.ntotal != len(docids):
            raise store.damaged(directory / files["faiss"], f"{idx.index.ntotal} vectors but {base.DOCIDS} has {len(docids)} ids")
        idx.version = version
        return idx

    @classmethod
    def from_vectors(cls, vectors: np.ndarray, docids: list[str], index_type: str = "Flat", *, encoder=None,
                     hashes: list[str] | None = None, **kw) -> DenseIndex:
        """An index over vectors computed elsewhere (benchmarks, precomputed embeddings)."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        idx = cls(encoder, index_type, **kw)
        if encoder is None:
            idx.dim = vectors.shape[1]
            idx.index = idx._new_faiss()
            idx._vectors = None if idx._lossless() else []
        idx._set_ids(list(docids), hashes or [""] * len(docids))
        idx._rebuild(vectors)
        return idx

    @classmethod
    def merge(cls, parts: list[DenseIndex]) -> DenseIndex:
        first = parts[0]
        for p in parts[1:]:
            if p.config()["index_type"] != first.index_type or _same_encoder(p.encoder_desc) != _same_encoder(first.encoder_desc):
                raise ValueError("cannot merge indexes built with different encoders or index types")
        out = cls(first.encoder, **first.config())
        out.encoder_desc = first.encoder_desc
        docids, hashes = [], []
        for p in parts:
            docids += p.docids
            hashes += p._hash
        out._set_ids(docids, hashes)
        vecs = np.concatenate([p.vectors() for p in parts]) if parts else np.zeros((0, first.dim), np.float32)
        out.index = out._new_faiss()
        out._vectors = None if out._lossless() else []
        out._rebuild(vecs)
        return out


def encoder_from_manifest(manifest: dict, *, device: str | None = None, warn: Path | None = None,
                          query_encoder: str = "full", **overrides):
    """The encoder a dense manifest describes (its model and ENCODER_KEYS), loaded; the one place that maps a
    manifest to ``Encoder.load``. ``overrides`` (flags the user set: pooling, query_prompt, dtype, …; None = not
    set) win over the manifest. With ``warn`` (the index being opened to search) overriding a setting the doc
    vectors were made with is warned about; an update passes none, as it rebuilds when such a setting changes.
    ``query_encoder`` (search only): see ``DenseIndex.load``."""
    from retrctl.models import lookup
    from retrctl.models.runtime import load_encoder  # torch weights, or an exported ONNX graph

    desc = manifest["encoder"]
    settings = {k: desc[k] for k in ENCODER_KEYS if k in desc}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    dtype = overrides.pop("dtype", None)
    if warn is not None:
        for k, v in overrides.items():
            if k in PASSAGE_KEYS and v != settings.get(k):
                log.warning("index %s was built with %s=%r; overriding it with %r mismatches the doc vectors", warn, k, settings.get(k), v)
    settings.update(overrides)
    if query_encoder == "token-lookup" or (query_encoder == "auto" and lookup.has_table(desc["model"])):
        if not lookup.has_table(desc["model"]):
            raise UsageError(f"--query-encoder token-lookup: {desc['model']} has no token-lookup table (train it with "
                             "--query-encoder token-lookup, or search with --query-encoder full)")
        log.info("queries by token lookup (%s/%s): no transformer loaded", desc["model"], lookup.TABLE_DIR)
        return lookup.TokenLookupEncoder.load(desc["model"], **settings)
    return load_encoder(desc["model"], device=device, dtype=dtype, **settings)


def _describe(encoder) -> dict:
    from retrctl.models import SHIPPED

    desc = dict(encoder.describe())
    model = desc.get("model", "")
    if model not in SHIPPED and Path(model).exists():
        desc["model"] = str(Path(model).resolve())
    return desc


def _same_encoder(desc: dict) -> dict:
    """What must agree between shards: every setting, and the model by name (paths differ across machines)."""
    return {**desc, "model": Path(str(desc.get("model", ""))).name}
