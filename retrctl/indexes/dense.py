"""Dense index: encoder vectors in a faiss store (indexes/faiss_store.py), beside the model's other heads' stores.

``DenseIndex(encoder, index_type="Flat")`` searches by inner product, i.e. the model's own similarity: cosine when the
encoder normalizes (recorded as ``normalized`` in the manifest), dot product otherwise. A model with a sparse and/or
colbert head is indexed with every head by default (``create``'s ``heads``): the index then holds a
``sparse.SparseRowStore`` and a ``multivector.TokenStore`` beside the vectors, fed from one pass of the model
(``Encoder.encode_heads``), and is a ``HeadsIndex``, whose search is indexes/heads.py's (fusion or BGE-M3's
re-scoring over the stores). ``--heads dense,bm25`` adds the corpus's BM25 (``bm25_store.BM25Store``, the same store
as the bm25 backend, fed the texts of the chunks the model encodes), so the delivered hybrid is one index.
Updates, checkpointed encoding, versions and merges are ``EncodedIndex``'s.

Files: ``index.json`` (settings = the constructor's arguments, the encoder's description — pooling, prompts, max
lengths, normalize —, dim, metric, doc count, and a ``sparse``/``colbert`` section per other head), ``index.faiss``
(faiss's own format), ``docids.parquet`` (docid + content hash per row), ``vectors.npy`` when the faiss index cannot
give the exact vectors back (IVF, PQ, SQ…), and the other heads' files (``terms.npy``/``weights.npy``,
``colbert.tokens.npy``/``colbert.offsets.npy``, ``bm25/``). ``search_defaults``: the fusion flags `index` was given
(``--fusion``, ``--norm``, ``--weights`` per head, …), a search's own defaults.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from retrctl import fusion
from retrctl.errors import UsageError
from retrctl.indexes import base, store
from retrctl.indexes import heads as multi_head
from retrctl.indexes.bm25 import INDEX_FLAGS as BM25_FLAGS
from retrctl.indexes.bm25 import bm25_settings
from retrctl.indexes.bm25_store import FILES as BM25_FILES
from retrctl.indexes.bm25_store import BM25Store
from retrctl.indexes.encoded import (
    CHECKPOINT_EVERY,
    EncodedIndex,
    describe,
    encoder_from_manifest,
    same_encoder,
)
from retrctl.indexes.faiss_store import INDEX_TYPE, FaissStore
from retrctl.indexes.faiss_store import SEARCH_FLAGS as FAISS_FLAGS
from retrctl.indexes.multivector import TokenStore, to_lanes
from retrctl.indexes.sparse import SEARCH_FLAGS as SPARSE_FLAGS
from retrctl.indexes.sparse import SPARSE_TOP_K, SparseRowStore, pack
from retrctl.models.config import MODEL_HEADS, PASSAGE_KEYS
from retrctl.models.config import SETTINGS as ENCODER_KEYS  # the encoder settings a manifest records

log = logging.getLogger("retrctl.index")
BM25_DIR = "bm25"  # the bm25 head's files, in a folder of their own within a version

__all__ = ["ENCODER_KEYS", "PASSAGE_KEYS", "DenseIndex", "HeadsIndex", "encoder_from_manifest"]


class DenseIndex(EncodedIndex):
    name = "dense"
    summary = "faiss"
    flags = ("index_type", "batch_size", "checkpoint_every", "heads", "sparse_top_k", "k1", "b", "stopwords", "bm25_method")
    search_knobs = ("batch_size", "ef_search", "nprobe")
    index_flags = (INDEX_TYPE, CHECKPOINT_EVERY, multi_head.HEADS_TO_INDEX, SPARSE_TOP_K, *BM25_FLAGS)
    search_flags = (*FAISS_FLAGS, *multi_head.SEARCH_FLAGS, *SPARSE_FLAGS)  # a HeadsIndex takes the other heads' knobs

    def __init__(self, encoder, index_type: str = "Flat", batch_size: int = 32, *, chunk_size: int = 4096,
                 ef_search: int = 128, nprobe: int = 32, train_size: int = 262144, seed: int = 0,
                 heads: list[str] | tuple[str, ...] = ("dense",), top_k: int | None = None, bm25: dict | None = None):
        self.index_type, self.ef_search, self.nprobe, self.train_size, self.seed = index_type, ef_search, nprobe, train_size, seed
        self.built = list(heads)  # the heads stored; ``heads`` (a search knob) are the ones searched
        self.heads = list(heads)
        self.dim = encoder.dim if encoder is not None else None
        self.normalized = bool(encoder.config.normalize) if encoder is not None else None
        self.sparse_desc, self.top_k = None, top_k if "sparse" in self.built else None
        sp = getattr(encoder, "sparse", None)
        if sp is not None and "sparse" in self.built:
            sp.top_k = self.top_k = multi_head.index_top_k(sp, top_k)
            self.sparse_desc = {"vocab": sp.vocab, "special_ids": sp.special_ids, "query": sp.query, "top_k": sp.top_k}
        cb = getattr(encoder, "colbert", None)
        self.colbert_dim = cb.out_dim if cb is not None and "colbert" in self.built else None
        self.bm25 = BM25Store(**(bm25 or {})).settings() if "bm25" in self.built else None  # the BM25 variant
        self.search_defaults: dict = {}
        self.query_desc: dict | None = None  # a query tower recorded by `index --query-model`: it encodes the queries
        self._query_side, self._query_load = None, {}
        if self.normalized is False and index_type != "Flat":
            log.warning("the encoder does not normalize: %s searches raw inner products, where graph/IVF recall is "
                        "usually lower than on unit vectors", index_type)
        super().__init__(encoder, batch_size, chunk_size)
        self._clear()

    def new_stores(self) -> dict:
        stores = {"dense": FaissStore(self.dim, self.index_type, train_size=self.train_size, seed=self.seed)}
        if "sparse" in self.built:
            stores["sparse"] = SparseRowStore(self.top_k, (self.sparse_desc or {}).get("vocab"))
        if "colbert" in self.built:
            stores["colbert"] = TokenStore(self.colbert_dim or 0)
        if "bm25" in self.built:
            stores["bm25"] = BM25Store(**self.bm25)
        return stores

    def config(self) -> dict:
        out = {"index_type": self.index_type, "batch_size": self.batch_size, "chunk_size": self.chunk_size,
               "ef_search": self.ef_search, "nprobe": self.nprobe, "train_size": self.train_size, "seed": self.seed}
        if self.built != ["dense"]:
            out.update(heads=self.built, top_k=self.top_k)
        if self.bm25 is not None:
            out["bm25"] = self.bm25
        return out

    # ------------------------------------------------------------ what the stages ask

    @classmethod
    def create(cls, encoder=None, *, index_type: str = "Flat", batch_size: int = 32, checkpoint_every: int = 4096,
               heads: str | None = None, sparse_top_k: int | None = None, k1: float = 0.9, b: float = 0.4,
               stopwords: str | None = "en", bm25_method: str = "lucene") -> DenseIndex:
        """``heads``: None = every head the model has; with a sparse, colbert or bm25 head among them, a
        ``HeadsIndex`` (``k1``, ``b``, ``stopwords``, ``bm25_method``: the bm25 head's variant)."""
        settings = {"index_type": index_type, "batch_size": batch_size, "chunk_size": checkpoint_every}
        if heads is None and all(getattr(encoder, h, None) is None for h in MODEL_HEADS[1:]) or heads == "dense":
            return cls(encoder, **settings)
        chosen = _heads_to_index(encoder, heads)
        if chosen == ["dense"]:
            return DenseIndex(encoder, **settings)
        bm25 = bm25_settings(k1, b, stopwords, bm25_method) if "bm25" in chosen else None
        return HeadsIndex(encoder, heads=chosen, top_k=sparse_top_k, bm25=bm25, **settings)

    @classmethod
    def update_options(cls, manifest: dict, options: dict) -> dict:
        """Without ``--heads``, an index holding the bm25 head keeps its heads (the model's default set lacks it)."""
        heads = manifest.get("settings", {}).get("heads") or []
        if options.get("heads") is None and "bm25" in heads:
            return {**options, "heads": ",".join(heads)}
        return options

    @classmethod
    def content_settings(cls, manifest: dict) -> dict:
        """The faiss structure and every encoder setting (the model included): what the stored rows depend on."""
        settings = manifest.get("settings", {})
        return {"index_type": settings.get("index_type"), "heads": settings.get("heads") or ["dense"],
                "sparse_top_k": settings.get("top_k"), "bm25": settings.get("bm25"), **base.encoder_content(manifest)}

    @classmethod
    def run_tag(cls, manifest: dict) -> str:
        model = str(manifest.get("encoder", {}).get("model", "dense")).rstrip("/").rsplit("/", 1)[-1]
        return f"{model}-{manifest.get('settings', {}).get('index_type', 'Flat')}"

    def describe(self) -> str:
        c = self.encoder.config if self.encoder is not None else None
        how = f" (pooling {c.pooling}, query prompt {c.query_prompt!r})" if c is not None else ""
        query = f", queries by {self.query_desc['model']}" if self.query_desc else ""
        return f"{len(self)} docs, {self.index_type}, encoder {(self.encoder_desc or {}).get('model')}{how}{query}"

    # ------------------------------------------------------------ the stores

    @property
    def index(self):
        """The faiss index behind the vectors."""
        return self.stores["dense"].index

    def sparse_rows(self) -> np.ndarray:
        return self.stores["sparse"].vectors()

    def matrix(self):
        return self.stores["sparse"].matrix()

    @property
    def _tokens(self) -> TokenStore:
        return self.stores["colbert"]

    @property
    def _seismic_saved(self):
        return self.stores["sparse"]._seismic_saved

    def _doc_rows(self, texts: list[str]) -> np.ndarray:
        """The model's heads' columns (the bm25 head reads the texts itself: ``EncodedIndex._text_rows``)."""
        model_heads = [h for h in self.built if h in MODEL_HEADS]
        if model_heads == ["dense"]:
            return self.encoder.encode(texts, kind="passage", batch_size=self.batch_size)
        out = self.encoder.encode_heads(texts, "passage", self.batch_size, heads=tuple(model_heads))
        parts = [out["dense"]]
        if "sparse" in self.built:
            parts.append(pack(*out["sparse"]))
        if "colbert" in self.built:
            parts.append(to_lanes(out["colbert"], self.colbert_dim))
        return np.concatenate(parts, axis=1)

    def record_query_model(self, encoder) -> None:
        """Encode queries with ``encoder`` (a query tower trained against these vectors: train --passage-index),
        the docs still with the index's model; recorded in the manifest, so every search uses it."""
        if set(self.built) - {"dense", "bm25"}:
            raise UsageError(f"--query-model: this index holds the model's {','.join(self.built)} heads, whose query "
                             "sides the query model does not have; it applies to a dense (and bm25) index")
        desc = describe(encoder)
        if desc["dim"] != self.dim or bool(encoder.config.normalize) != bool(self.normalized):
            raise UsageError(f"--query-model {desc['model']}: {desc['dim']}-dim vectors (normalized: "
                             f"{bool(encoder.config.normalize)}), the index's are {self.dim}-dim (normalized: "
                             f"{bool(self.normalized)})")
        self.query_desc, self._query_side = desc, encoder

    def _query_encoder(self):
        """The recorded query tower (loaded on first use), else the index's model."""
        if self.query_desc is not None and self._query_side is None:
            self._query_side = encoder_from_manifest({"encoder": self.query_desc}, **self._query_load)
        return self._query_side or self.encoder

    def _encode_queries(self, queries: list[dict]) -> np.ndarray:
        if self.encoder is None and self.query_desc is None:
            raise ValueError("this DenseIndex has no encoder to encode queries")
        return self._query_encoder().encode([q["query_text"] for q in queries], kind="query", batch_size=self.batch_size)

    # ------------------------------------------------------------ files

    def manifest(self) -> dict:
        faiss_files = self.stores["dense"].files()
        out = {
            "backend": self.name,
            "settings": self.config(),
            "encoder": self.encoder_desc,
            "dim": self.dim,
            "metric": "inner_product",
            "normalized": self.normalized,
            "doc_count": len(self),
            "files": {"faiss": faiss_files["faiss"], "docids": base.DOCIDS, "vectors": faiss_files["vectors"]},
            **self.meta,
        }
        if "sparse" in self.built:
            sp = self.stores["sparse"]
            out["sparse"] = {**self.sparse_desc, "nonzeros": sp.nonzeros(),
                             "files": {"terms": "terms.npy", "weights": "weights.npy", **sp.files}}
        if "colbert" in self.built:
            out["colbert"] = self.stores["colbert"].manifest()
        if "bm25" in self.built:
            out["bm25"] = {**self.stores["bm25"].manifest(), "files": {k: f"{BM25_DIR}/{v}" for k, v in BM25_FILES.items()}}
        if self.search_defaults:
            out["search_defaults"] = self.search_defaults
        if self.query_desc is not None:
            out["query_model"] = self.query_desc
        return out

    def write_files(self, directory: Path) -> None:
        """Write the complete index files into the empty ``directory`` (one version): each store's, the doc ids,
        and the manifest last."""
        self._finish()
        for name in ("sparse", "colbert"):
            if name in self.stores:
                self.stores[name].write(directory, len(self))
        if "bm25" in self.stores:
            self.stores["bm25"].write(directory / BM25_DIR, len(self))
        manifest = self.manifest()
        self.stores["dense"].write(directory, len(self))
        base.write_docids(directory, self.docids, self._hash)
        base.write_manifest(directory, manifest)
        if self.built != ["dense"]:
            sizes = multi_head.bytes_per_doc(directory, json.loads((directory / base.MANIFEST).read_text()))
            log.info("index size per doc: %s", ", ".join(f"{h} {b:.0f} bytes" for h, b in sizes.items()))

    @classmethod
    def load(cls, directory: str | Path, encoder=None, device: str | None = None, query_encoder: str = "full",
             **overrides) -> DenseIndex:
        """Open a saved index, a ``HeadsIndex`` when its manifest holds other heads; the encoder is re-loaded from
        the manifest's description when not given (``query_encoder``: see ``encoded.encoder_from_manifest``).

        ``overrides`` (pooling, query_prompt, query_max_len, dtype, …) go to ``Encoder.load``; overriding
        a setting the doc vectors were made with is allowed but warned about.
        """
        version = store.resolved(directory)
        directory, manifest = version.path, version.manifest
        desc = manifest["encoder"]
        if encoder is None:
            encoder = encoder_from_manifest(manifest, device=device, warn=directory, query_encoder=query_encoder, **overrides)
        else:
            mine = describe(encoder)
            diff = {k for k in PASSAGE_KEYS if mine.get(k) != desc.get(k)}
            if mine["dim"] != desc["dim"]:
                raise ValueError(f"encoder dim {mine['dim']} != index dim {desc['dim']} ({directory})")
            if diff:
                log.warning("encoder differs from the one index %s was built with in %s", directory, ", ".join(sorted(diff)))
        settings = manifest["settings"]
        kind = HeadsIndex if set(settings.get("heads") or ()) - {"dense"} else DenseIndex
        idx = kind(encoder, **settings)
        idx._read_meta(manifest)
        idx.normalized = manifest.get("normalized")
        docids, hashes = base.read_docids(directory)
        stores = {"dense": FaissStore.read(directory, manifest["files"], len(docids), idx.index_type,
                                           train_size=idx.train_size, seed=idx.seed)}
        idx._set_ids(docids, hashes)
        if "sparse" in idx.built:
            idx.sparse_desc = {k: v for k, v in manifest["sparse"].items() if k not in ("files", "nonzeros")}
            stores["sparse"] = SparseRowStore.read(directory, manifest["sparse"]["files"], len(idx), idx.top_k,
                                                   idx.sparse_desc["vocab"])
        if "colbert" in idx.built:
            stores["colbert"] = TokenStore.read(directory, manifest["colbert"], len(idx))
            idx.colbert_dim = stores["colbert"].dim
        if "bm25" in idx.built:
            stores["bm25"] = BM25Store.read(directory / BM25_DIR, idx.bm25, len(idx))
        idx.stores = stores
        idx.version = version
        idx.record_search_defaults(manifest.get("search_defaults") or {})
        idx.query_desc, idx._query_load = manifest.get("query_model"), {"device": device, **overrides}
        return idx

    @classmethod
    def from_vectors(cls, vectors: np.ndarray, docids: list[str], index_type: str = "Flat", *, encoder=None,
                     hashes: list[str] | None = None, **kw) -> DenseIndex:
        """An index over vectors computed elsewhere (benchmarks, precomputed embeddings)."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        idx = cls(encoder, index_type, **kw)
        if encoder is None:
            idx.dim = vectors.shape[1]
            idx.stores = idx.new_stores()
        idx._set_ids(list(docids), hashes or [""] * len(docids))
        idx.stores["dense"].rebuild(vectors)
        return idx

    @classmethod
    def merge(cls, parts: list[DenseIndex]) -> DenseIndex:
        first = parts[0]
        if any(p.built != first.built or p.colbert_dim != first.colbert_dim for p in parts):
            raise ValueError("cannot merge indexes of different heads or colbert dims")
        if any(p.top_k != first.top_k for p in parts):
            raise ValueError("cannot merge indexes that keep different numbers of sparse terms")
        if any(p.bm25 != first.bm25 for p in parts):
            raise ValueError("cannot merge indexes whose bm25 heads have different settings")
        for p in parts[1:]:
            if p.config()["index_type"] != first.index_type or same_encoder(p.encoder_desc) != same_encoder(first.encoder_desc):
                raise ValueError("cannot merge indexes built with different encoders or index types")
        if any(p.query_desc != first.query_desc for p in parts):
            raise ValueError("cannot merge indexes whose queries are encoded by different query models (index --query-model)")
        out = type(first)(first.encoder, **first.config())
        out.encoder_desc = first.encoder_desc
        out.sparse_desc, out.colbert_dim = first.sparse_desc, first.colbert_dim
        out._joined_stores(parts)
        out.record_search_defaults(first.search_defaults)
        out.query_desc, out._query_side, out._query_load = first.query_desc, first._query_side, first._query_load
        return out


def stored_vectors(directory: str | Path) -> tuple[dict, list[str], np.ndarray]:
    """(manifest, doc ids, vectors) of a dense index's current version, read without loading its encoder: the
    rows a search ranks by, exact (faiss gives back a flat index's vectors; other types keep vectors.npy).
    ``UsageError`` for an index of another backend."""
    version = store.resolved(directory)
    manifest = version.manifest
    if manifest.get("backend") != DenseIndex.name:
        raise UsageError(f"{directory}: a {manifest.get('backend')} index; the passage vectors come from a dense index")
    docids, _ = base.read_docids(version.path)
    settings = manifest["settings"]
    st = FaissStore.read(version.path, manifest["files"], len(docids), settings.get("index_type", "Flat"),
                         train_size=settings.get("train_size", 262144), seed=settings.get("seed", 0))
    return manifest, docids, st.vectors(len(docids))


class HeadsIndex(DenseIndex):
    """A dense index holding the model's other heads too: the same stores and plumbing, searched over the heads
    ``heads`` names (indexes/heads.py: their lists fused, or candidates re-scored with colbert)."""

    search_knobs = (*DenseIndex.search_knobs, "heads", "fusion", "norm", "weights", "rrf_k", "depth", "candidates",
                    "sparse_search", "query_cut", "heap_factor")
    fusion, norm, weights, rrf_k, depth = fusion.METHOD, fusion.NORM, None, fusion.RRF_K, 100
    candidates = None  # with colbert: heads whose top --depth are re-scored, or "all"
    sparse_search, query_cut, heap_factor = "auto", 20, 0.9  # a token-count query has ~20 terms, all weight 1
    _last_parts: dict[str, dict] = {}  # query text -> its encoded heads, of the last hybrid search

    def describe(self) -> str:
        parts = []
        if self.sparse_desc:
            parts.append(f"sparse top-{self.top_k}, queries by {self.sparse_desc['query']}")
        if self.colbert_dim:
            parts.append(f"colbert dim {self.colbert_dim}, {len(self._tokens.arrays()[0])} tokens")
        if self.bm25 is not None:
            parts.append(self.stores["bm25"].variant())
        if self.search_defaults:
            parts.append("search defaults " + ", ".join(f"{k} {v}" for k, v in self.search_defaults.items()))
        sizes = multi_head.bytes_per_doc(self.version.path, self.version.manifest) if self.version is not None else {}
        size = f"; bytes per doc: {', '.join(f'{h} {b:.0f}' for h, b in sizes.items())}" if sizes else ""
        return f"{super().describe()}; heads {','.join(self.built)} ({'; '.join(parts)}){size}"

    def record_search_defaults(self, defaults: dict) -> None:
        """Keep `index`'s fusion flags (the recorded ones updated by those given) as this index's search defaults:
        set now, written in the manifest; ``weights`` are kept per head, so a search of some heads takes theirs."""
        self.search_defaults = multi_head.search_defaults(self, {**self.search_defaults, **defaults})
        for name, value in self.search_defaults.items():
            setattr(self, name, value)

    def search(self, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        return multi_head.search(self, queries, k)

    def score(self, query: dict, docids) -> dict[str, float]:
        return multi_head.score(self, query, docids)

    def dense_search(self, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        """The dense head's own search (one of the lists heads.search fuses)."""
        return super().search(queries, k)

    def dense_score(self, query: dict, docids) -> dict[str, float]:
        return super().score(query, docids)


def _heads_to_index(encoder, value) -> list[str]:
    """``--heads`` checked against the model: each head it names exists, dense among them."""
    chosen = multi_head.parse_heads(value, encoder)
    if "colbert" in chosen and "bm25" in chosen:
        raise UsageError(f"--heads {','.join(chosen)}: a search with colbert re-scores by raw scores, which BM25's "
                         "scale does not share; index bm25 beside dense and sparse (or search a bm25 index and fuse)")
    for head in chosen:
        if head not in ("dense", "bm25") and getattr(encoder, head, None) is None:
            raise UsageError(f"--heads {','.join(chosen)}: {getattr(encoder, 'source', 'the model')} has no {head} "
                             f"head (train one with --heads {multi_head.TRAIN_HINT[head]})")
    if "dense" not in chosen:
        raise UsageError(f"--heads {','.join(chosen)}: an index holds the dense head too (--heads dense,{','.join(chosen)})"
                         + ("; the sparse head alone is --method sparse" if chosen == ["sparse"] else ""))
    return chosen
