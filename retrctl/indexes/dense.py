"""Dense index: encoder vectors in a faiss store (indexes/faiss_store.py), composed with the other heads it holds.

``DenseIndex(encoder, index_type="Flat")`` searches by inner product, i.e. the model's own similarity: cosine when the
encoder normalizes (recorded as ``normalized`` in the manifest), dot product otherwise. The index is a composition of
heads taken from the registry (indexes/heads/: ``HEADS``): by default every head the model has, or those ``--heads``
names. Each head makes its rows (the encoded ones from one pass of the model, ``Encoder.encode_heads``), keeps them
in its store, writes its files and manifest section, reopens itself and is searched; this module only iterates
them. Holding another head than the vectors' makes it a ``HeadsIndex``, whose search is indexes/heads/search.py's
(fusion or BGE-M3's re-scoring over the heads). Updates, checkpointed encoding, versions and merges are
``EncodedIndex``'s.

Files: ``index.json`` (settings = the constructor's arguments — the held heads in ``heads`` and their own keys —,
the encoder's description — pooling, prompts, max lengths, normalize —, dim, metric, doc count, and a section per
other head), ``index.faiss`` (faiss's own format), ``docids.parquet`` (docid + content hash per row), ``vectors.npy``
when the faiss index cannot give the exact vectors back (IVF, PQ, SQ…), and the other heads' files, which their
sections name. ``search_defaults``: the fusion flags `index` was given (``--fusion``, ``--norm``, ``--weights`` per
head, …), a search's own defaults.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from retrctl import fusion
from retrctl.errors import RecordError, UsageError
from retrctl.indexes import base, store
from retrctl.indexes import heads as index_heads
from retrctl.indexes.encoded import (
    CHECKPOINT_EVERY,
    EncodedIndex,
    describe,
    encoder_from_manifest,
    same_encoder,
)
from retrctl.indexes.faiss_store import INDEX_TYPE, FaissStore
from retrctl.indexes.faiss_store import SEARCH_FLAGS as FAISS_FLAGS
from retrctl.indexes.heads import HEADS, declared
from retrctl.indexes.heads import search as multi_head
from retrctl.models.config import PASSAGE_KEYS, passage_differences
from retrctl.models.config import SETTINGS as ENCODER_KEYS  # the encoder settings a manifest records

log = logging.getLogger("retrctl.index")

__all__ = ["ENCODER_KEYS", "PASSAGE_KEYS", "DenseIndex", "HeadsIndex", "encoder_from_manifest"]


class DenseIndex(EncodedIndex):
    """The dense head's vectors, and the stores of the other heads it holds (``held``: head name → its
    ``heads.Head``, in the order of the encoded row); ``built`` names them."""

    name = "dense"
    summary = "faiss"
    # the registered heads' flags follow the index's own (read at each access: a head registered later brings its own)
    flags = declared(("index_type", "batch_size", "checkpoint_every", "heads"), lambda h: [f.name for f in h.index_flags])
    search_knobs = ("batch_size", "ef_search", "nprobe")
    index_flags = declared((INDEX_TYPE, CHECKPOINT_EVERY, index_heads.HEADS_TO_INDEX), lambda h: h.index_flags)
    search_flags = declared((*FAISS_FLAGS, *multi_head.SEARCH_FLAGS), lambda h: h.search_flags)

    def __init__(self, encoder, index_type: str = "Flat", batch_size: int = 32, *, chunk_size: int = 4096,
                 ef_search: int = 128, nprobe: int = 32, train_size: int = 262144, seed: int = 0,
                 heads: list[str] | tuple[str, ...] = ("dense",), **head_settings):
        """``head_settings``: the heads' own keys of the settings (``Head.settings``)."""
        self.index_type, self.ef_search, self.nprobe, self.train_size, self.seed = index_type, ef_search, nprobe, train_size, seed
        unknown = [h for h in heads if h not in HEADS]
        if unknown:
            raise ValueError(f"index heads {','.join(unknown)}: no such head is registered ({', '.join(HEADS)})")
        self.held = {h: HEADS[h](encoder, head_settings) for h in heads}  # the heads stored
        self.heads = list(heads)  # the heads searched (a search knob)
        self.dim = encoder.dim if encoder is not None else None
        self.normalized = bool(encoder.config.normalize) if encoder is not None else None
        self.search_defaults: dict = {}
        self.query_desc: dict | None = None  # a query tower recorded by `index --query-model`: it encodes the queries
        self._query_side, self._query_load = None, {}
        if self.normalized is False and index_type != "Flat":
            log.warning("the encoder does not normalize: %s searches raw inner products, where graph/IVF recall is "
                        "usually lower than on unit vectors", index_type)
        super().__init__(encoder, batch_size, chunk_size)
        self._clear()

    @property
    def built(self) -> list[str]:
        return list(self.held)

    def new_stores(self) -> dict:
        return {name: head.new_store(self) for name, head in self.held.items()}

    def config(self) -> dict:
        out = {"index_type": self.index_type, "batch_size": self.batch_size, "chunk_size": self.chunk_size,
               "ef_search": self.ef_search, "nprobe": self.nprobe, "train_size": self.train_size, "seed": self.seed}
        if self.built != [self.searched]:
            out["heads"] = self.built
            for name, head in HEADS.items():
                out.update(self.held[name].settings() if name in self.held else head.unset)
        return out

    # ------------------------------------------------------------ what the stages ask

    @classmethod
    def create(cls, encoder=None, *, index_type: str = "Flat", batch_size: int = 32, checkpoint_every: int = 4096,
               heads: str | None = None, **head_options) -> DenseIndex:
        """``heads``: None = every head the model has; with another head among them, a ``HeadsIndex``
        (``head_options``: the heads' own `index` flags, ``Head.index_flags``)."""
        unknown = sorted(set(head_options) - set(cls.flags))
        if unknown:
            raise TypeError(f"create() got an unexpected keyword argument {unknown[0]!r}")
        settings = {"index_type": index_type, "batch_size": batch_size, "chunk_size": checkpoint_every}
        chosen = index_heads.to_index(encoder, heads, cls.searched)
        if chosen == [cls.searched]:
            return DenseIndex(encoder, **settings)
        head_settings = {k: v for h in chosen for k, v in HEADS[h].settings_from(head_options).items()}
        return HeadsIndex(encoder, heads=chosen, **head_settings, **settings)

    @classmethod
    def update_options(cls, manifest: dict, options: dict) -> dict:
        """Without ``--heads``, an index holding a head no model encodes keeps its heads (the model's default set
        lacks it); each head keeps what its ``update_options`` says (the bm25 head its tokens)."""
        settings = manifest.get("settings", {})
        heads = settings.get("heads") or []
        if options.get("heads") is None and any(h in HEADS and not HEADS[h].encoded for h in heads):
            options = {**options, "heads": ",".join(heads)}
        for head in HEADS.values():
            options = head.update_options(settings, options)
        return options

    @classmethod
    def content_settings(cls, manifest: dict) -> dict:
        """The faiss structure and every encoder setting (the model included): what the stored rows depend on."""
        settings = manifest.get("settings", {})
        heads = {k: v for head in HEADS.values() for k, v in head.content(settings).items()}
        return {"index_type": settings.get("index_type"), "heads": settings.get("heads") or [cls.searched], **heads,
                **base.encoder_content(manifest)}

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
        return self.stores[self.searched].index

    def _doc_rows(self, texts: list[str]) -> np.ndarray:
        """The encoded heads' columns from one pass of the model (the other heads' stores read the texts
        themselves: ``EncodedIndex._text_rows``)."""
        encoded = [head for head in self.held.values() if head.encoded]
        if len(encoded) == 1:
            return encoded[0].alone(self.encoder, texts, self.batch_size)
        out = self.encoder.encode_heads(texts, "passage", self.batch_size, heads=tuple(h.name for h in encoded))
        return np.concatenate([head.columns(out) for head in encoded], axis=1)

    def record_query_model(self, encoder) -> None:
        """Encode queries with ``encoder`` (a query tower trained against these vectors: train --passage-index),
        the docs still with the index's model; recorded in the manifest, so every search uses it."""
        others = [name for name, head in self.held.items() if head.encoded and name != self.searched]
        if others:
            raise UsageError(f"--query-model: this index holds the model's {','.join(self.built)} heads, whose query "
                             f"sides the query model does not have; it applies to an index whose one model head is "
                             f"{self.searched}")
        desc = describe(encoder)
        if desc["dim"] != self.dim or bool(encoder.config.normalize) != bool(self.normalized):
            raise UsageError(f"--query-model {desc['model']}: {desc['dim']}-dim vectors (normalized: "
                             f"{bool(encoder.config.normalize)}), the index's are {self.dim}-dim (normalized: "
                             f"{bool(self.normalized)})")
        self.query_desc, self._query_side = desc, encoder

    def drop_query_model(self) -> None:
        """Encode queries with the index's own model again (a recorded query tower forgotten)."""
        self.query_desc, self._query_side = None, None

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
        faiss_files = self.stores[self.searched].files()
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
        for name, head in self.held.items():
            section = head.section(self.stores[name])
            if section is not None:
                out[name] = section
        if self.search_defaults:
            out["search_defaults"] = self.search_defaults
        if self.query_desc is not None:
            out["query_model"] = self.query_desc
        return out

    def write_files(self, directory: Path) -> None:
        """Write the complete index files into the empty ``directory`` (one version): each head's store's, the doc
        ids, and the manifest last (a store's write may add files its section names)."""
        self._finish()
        for name, head in self.held.items():
            head.write(self.stores[name], directory, len(self))
        manifest = self.manifest()
        base.write_docids(directory, self.docids, self._hash)
        base.write_manifest(directory, manifest)
        if len(self.held) > 1:
            sizes = index_heads.bytes_per_doc(directory, manifest)
            log.info("index size per doc: %s", ", ".join(f"{h} {b:.0f} bytes" for h, b in sizes.items()))

    @classmethod
    def load(cls, directory: str | Path, encoder=None, device: str | None = None, query_encoder: str = "full",
             with_encoder: bool = True, **overrides) -> DenseIndex:
        """Open a saved index, a ``HeadsIndex`` when its manifest holds other heads; the encoder is re-loaded from
        the manifest's description when not given (``query_encoder``: see ``encoded.encoder_from_manifest``), or
        not at all with ``with_encoder=False`` (the stored vectors and ids only: nothing can be encoded or searched
        by text).

        ``overrides`` (pooling, query_prompt, query_max_len, dtype, …) go to ``Encoder.load``; overriding
        a setting the doc vectors were made with is allowed but warned about.
        """
        version = store.resolved(directory)
        directory, manifest = version.path, version.manifest
        desc = manifest["encoder"]
        if encoder is None and with_encoder:
            encoder = encoder_from_manifest(manifest, device=device, warn=directory, query_encoder=query_encoder, **overrides)
        elif encoder is not None:
            mine = describe(encoder)
            diff = passage_differences(mine, desc)
            if mine["dim"] != desc["dim"]:
                raise ValueError(f"encoder dim {mine['dim']} != index dim {desc['dim']} ({directory})")
            if diff:
                log.warning("encoder differs from the one index %s was built with in %s", directory, ", ".join(sorted(diff)))
        settings = manifest["settings"]
        unknown = [h for h in settings.get("heads") or () if h not in HEADS]
        if unknown:
            raise RecordError(Path(directory) / store.MANIFEST, field="settings.heads",
                              message=f"{', '.join(unknown)}: not a head this retrctl has ({', '.join(HEADS)})")
        kind = HeadsIndex if set(settings.get("heads") or ()) - {cls.searched} else DenseIndex
        idx = kind(encoder, **settings)
        idx._read_meta(manifest)
        idx.normalized = manifest.get("normalized")
        if encoder is None:  # with_encoder=False: the manifest's
            idx.dim = desc["dim"]
        docids, hashes = base.read_docids(directory)
        idx.stores = {name: head.read(idx, directory, manifest, len(docids)) for name, head in idx.held.items()}
        idx._set_ids(docids, hashes)
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
        idx.stores[idx.searched].rebuild(vectors)
        return idx

    @classmethod
    def merge(cls, parts: list[DenseIndex]) -> DenseIndex:
        first = parts[0]
        if any(p.built != first.built for p in parts):
            raise ValueError("cannot merge indexes of different heads")
        for name, head in first.held.items():
            other = next((p.held[name] for p in parts if p.held[name].merge_key() != head.merge_key()), None)
            if other is not None:
                raise ValueError(f"cannot merge indexes whose {name} heads differ ({head.merge_key()} vs "
                                 f"{other.merge_key()})")
        for p in parts[1:]:
            if p.config()["index_type"] != first.index_type or not same_encoder(p.encoder_desc, first.encoder_desc):
                raise ValueError("cannot merge indexes built with different encoders or index types")
        if any(p.query_desc != first.query_desc for p in parts):
            raise ValueError("cannot merge indexes whose queries are encoded by different query models (index --query-model)")
        out = type(first)(first.encoder, **first.config())
        out.encoder_desc = first.encoder_desc
        out.held = dict(first.held)  # the heads' descriptions, read from the first part's manifest
        out._joined_stores(parts)
        out.record_search_defaults(first.search_defaults)
        out.query_desc, out._query_side, out._query_load = first.query_desc, first._query_side, first._query_load
        return out


def stored_vectors(directory: str | Path | store.Version) -> tuple[dict, list[str], np.ndarray]:
    """(manifest, doc ids, vectors) of a dense index's current version (or of a version already resolved), read
    without loading its encoder: the rows a search ranks by, exact (faiss gives back a flat index's vectors; other
    types keep vectors.npy). ``UsageError`` for an index of another backend."""
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
    """A dense index holding other heads too: the same stores and plumbing, searched over the heads ``heads``
    names (indexes/heads/search.py: their lists fused, or candidates re-scored by s_rank)."""

    search_knobs = declared((*DenseIndex.search_knobs, "heads", *multi_head.FUSION_KNOBS, "candidates", "remove_query"),
                            lambda h: h.knobs)
    fusion, norm, weights, rrf_k, depth = fusion.METHOD, fusion.NORM, None, fusion.RRF_K, 100
    remove_query = False  # search --remove-query: each head's list drops the query's own doc before fusion
    candidates = None  # with a head that re-scores: heads whose top --depth are re-scored, or "all"

    def __init__(self, encoder, *args, **kw):
        for head in HEADS.values():  # every registered head's search knobs, at their defaults, as `search` reports
            vars(self).update(head.knobs)
        self._last_parts: dict[str, dict] = {}  # query text -> its encoded heads, of the last re-scoring search
        super().__init__(encoder, *args, **kw)

    def describe(self) -> str:
        parts = [d for name, head in self.held.items() if (d := head.describe(self.stores[name])) is not None]
        if self.search_defaults:
            parts.append("search defaults " + ", ".join(f"{k} {v}" for k, v in self.search_defaults.items()))
        sizes = index_heads.bytes_per_doc(self.version.path, self.version.manifest) if self.version is not None else {}
        size = f"; bytes per doc: {', '.join(f'{h} {b:.0f}' for h, b in sizes.items())}" if sizes else ""
        return f"{super().describe()}; heads {','.join(self.built)} ({'; '.join(parts)}){size}"

    def record_search_defaults(self, defaults: dict) -> None:
        """Keep `index`'s fusion flags (the recorded ones updated by those given) as this index's search defaults:
        set now, written in the manifest; ``weights`` are kept per head, so a search of some heads takes theirs."""
        self.search_defaults = multi_head.search_defaults(self, {**self.search_defaults, **defaults})
        for name, value in self.search_defaults.items():
            setattr(self, name, value)

    def search(self, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        run, self._last_parts = multi_head.search(self, queries, k)
        return run

    def score(self, query: dict, docids) -> dict[str, float]:
        return multi_head.score(self, query, docids, self._last_parts.get(query["query_text"], {}))

    def dense_search(self, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        """The dense head's own search (one of the lists a multi-head search fuses)."""
        return super().search(queries, k)

    def dense_score(self, query: dict, docids) -> dict[str, float]:
        return super().score(query, docids)
