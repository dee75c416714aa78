"""What every index built by an encoder shares: doc ids and content-hash sync, chunked encoding with checkpoints a
killed run resumes from, versioned saves, merges; the rows themselves live in one store per head.

``EncodedIndex`` owns ``stores``, a dict head → store, in the order of the encoded row: each chunk of docs is encoded
once into one float32 array, [the first store's columns | the next's | …] (a store's ``width`` columns; ``None``:
the rest), checkpointed as one file, and handed out column by column, so the heads of one doc are added, replaced
and removed together and cannot drift apart. A store (``faiss_store.FaissStore``, ``sparse.SparseRowStore``,
``multivector.TokenStore``) knows rows by position only:

- ``width``, ``knobs`` (the search settings it reads off the index); ``append(rows)``; ``apply(replaced: position →
  row, removed: positions, n)``; ``finish()`` (work left before a search or a write: an IVF's training);
- ``write(directory, n)``, a classmethod ``read``, and ``joined(stores, counts)`` for merges;
- a store a search ranks by (``searched``) also has ``vectors(n)``, ``vectors_at(rows, n)``, ``search(queries, k,
  key, docids, **knobs)`` and ``dot(query, rows, n)``; a head's own scoring (``TokenStore.maxsim``) is its own.

A store with ``reads_text`` (``bm25_store.BM25Store``) takes no columns: it is fed each chunk's texts, turned into
its own rows (``rows(texts)``, one per doc) beside the encoded ones, and added, replaced and removed with them; those
rows are cheap and deterministic, so they are made again when a resumed chunk's encoded rows come from a checkpoint.

A backend subclass chooses the stores (``new_stores``), encodes a chunk of texts into rows (``_doc_rows``) and
queries into what its searched store takes (``_encode_queries``), and lays out its manifest and files.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from retrctl import distributed, records
from retrctl.errors import UsageError
from retrctl.indexes import base, store

# the encoder settings a manifest records, and those that change the doc vectors (overriding them at search time
# mismatches the index): declared once, in retrctl/models/config.py
from retrctl.models.config import PASSAGE_KEYS
from retrctl.models.config import SETTINGS as ENCODER_KEYS

log = logging.getLogger("retrctl.index")

# the encoder methods a Ray worker runs (retrctl/distributed.py); every other attribute is read off the local encoder
ENCODE_METHODS = ("encode", "encode_heads", "encode_sparse", "encode_colbert")

CHECKPOINT_EVERY = base.Flag("checkpoint_every", "Dense: save encoded vectors every N docs under IDX.partial, so a "
                             "killed run resumes from there.", int, low=1, default=4096)


class EncodedIndex(base.Index):
    """Docs encoded by ``encoder`` into ``stores``; ``searched`` names the store a one-head search ranks by."""

    needs_encoder = True
    searched = "dense"

    def __init__(self, encoder, batch_size: int = 32, chunk_size: int = 4096):
        super().__init__()
        self.encoder, self.batch_size, self.chunk_size = encoder, batch_size, chunk_size
        self.encoder_desc = describe(encoder) if encoder is not None else None
        self.workdir: Path | None = None
        self.encoded = 0
        self._last_queries: dict[str, np.ndarray] = {}  # query text -> its encoding, of the last search
        self.stores: dict = {}
        self.pool: distributed.WorkerPool | None = None

    def new_stores(self) -> dict:
        """Empty stores, head → store, in the encoded row's order."""
        raise NotImplementedError

    def _doc_rows(self, texts: list[str]) -> np.ndarray:
        """One float32 row per text: the stores' columns side by side."""
        raise NotImplementedError

    def _encode_queries(self, queries: list[dict]) -> np.ndarray:
        """The queries as the ``searched`` store takes them."""
        raise NotImplementedError

    # ------------------------------------------------------------ what the stages ask

    @classmethod
    def encoder_for(cls, model: str | None, manifest: dict | None, **settings):
        if model is None:
            return encoder_from_manifest(manifest, **settings)
        from retrctl.models.runtime import load_encoder  # torch weights, or an exported ONNX graph

        device, dtype = settings.pop("device", None), settings.pop("dtype", None)
        return load_encoder(model, device=device, dtype=dtype, **settings)

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

    # ------------------------------------------------------------ rows

    def _clear(self) -> None:
        super()._clear()
        self._invalidate()
        self.stores = self.new_stores()

    def _split(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """A chunk's rows → each store's columns (the stores that read text take none)."""
        columns = {name: st for name, st in self.stores.items() if not getattr(st, "reads_text", False)}
        if len(columns) == 1:
            return {name: rows for name in columns}
        rest = rows.shape[1] - sum(st.width or 0 for st in columns.values())  # the one store of width None
        out, at = {}, 0
        for name, st in columns.items():
            width = rest if st.width is None else st.width
            out[name] = rows[:, at : at + width]
            at += width
        return out

    def _text_rows(self, chunk: list[tuple[dict, str, int | None]]) -> dict[str, list]:
        """The rows of the stores that read text, one per doc of the chunk: {store: [row, …]}."""
        readers = [name for name, st in self.stores.items() if getattr(st, "reads_text", False)]
        if not readers:
            return {}
        texts = [records.passage_text(d) for d, _, _ in chunk]
        return {name: self.stores[name].rows(texts) for name in readers}

    def _append_vectors(self, rows: np.ndarray, text_rows: dict[str, list] | None = None) -> None:
        """Append encoded rows and the text stores' rows (docs already appended to the ids) to every store."""
        for name, part in self._split(rows).items():
            self.stores[name].append(part)
        for name, part in (text_rows or {}).items():
            self.stores[name].append(part)

    def _finish(self) -> None:
        for st in self.stores.values():
            st.finish()

    def vectors(self) -> np.ndarray:
        """The searched store's rows, aligned with ``docids`` (a copy)."""
        return self.stores[self.searched].vectors(len(self))

    def get_vectors(self, docids: Iterable[str]) -> np.ndarray:
        """The searched store's rows of the given docs (KeyError for an unknown id)."""
        return self.vectors_at(np.array([self._pos[d] for d in docids], np.int64))

    def vectors_at(self, rows: np.ndarray) -> np.ndarray:
        return self.stores[self.searched].vectors_at(rows, len(self))

    # ------------------------------------------------------------ encoding with checkpoints

    @contextlib.contextmanager
    def on_workers(self, pool: distributed.WorkerPool | None) -> Iterator[EncodedIndex]:
        """Inside the block the encoder's forward passes (docs and queries) run on ``pool``'s workers, which hold
        copies of this index's encoder; checkpoints, ids and stores stay here. ``None``: nothing changes."""
        if pool is None:
            yield self
            return
        local = self.encoder
        self.encoder, self.pool = distributed.RemoteProxy(pool, local, ENCODE_METHODS), pool
        try:
            yield self
        finally:
            self.encoder, self.pool = local, None

    def _encoded(self, numbered: tuple[int, list]) -> tuple[list, np.ndarray]:
        n, chunk = numbered
        return chunk, self._encode(chunk, n)

    def _encode(self, chunk: list[tuple[dict, str, int | None]], n: int) -> np.ndarray:
        ids = [d["docid"] for d, _, _ in chunk]
        hashes = [h for _, h, _ in chunk]
        ckpt = self.workdir / f"{n:06d}" if self.workdir is not None else None
        if ckpt is not None and ckpt.with_suffix(".json").exists():
            saved = json.loads(ckpt.with_suffix(".json").read_text())
            if saved == {"docids": ids, "hashes": hashes}:
                return np.load(ckpt.with_suffix(".npy"))
        vecs = self._doc_rows([records.passage_text(d) for d, _, _ in chunk])
        bad = ~np.isfinite(vecs).all(axis=1)
        if bad.any():  # a broken forward gives NaN embeddings that search would rank silently (tevatron#103)
            raise ValueError(f"the encoder returned NaN/inf vectors for {int(bad.sum())} docs, e.g. {ids[int(np.argmax(bad))]!r}")
        self.encoded += len(chunk)
        if ckpt is not None:
            self.workdir.mkdir(parents=True, exist_ok=True)
            np.save(ckpt.with_suffix(".npy"), vecs)
            # the JSON is written last: its presence marks the chunk complete
            with records.atomic_path(ckpt.with_suffix(".json")) as tmp:
                Path(tmp).write_text(json.dumps({"docids": ids, "hashes": hashes}))
        return vecs

    # ------------------------------------------------------------ updates

    def sync(self, docs: Iterable[dict], delete: bool = True) -> dict:
        if self.encoder is None:
            raise ValueError(f"this {type(self).__name__} has no encoder: load it with an encoder to add docs")
        stats, seen = base.new_stats(), set()
        replaced: dict[int, tuple[str, np.ndarray, dict]] = {}
        # chunks are encoded in order here, or several at once on Ray workers and taken back in order
        chunks = enumerate(records.batched(self._classify(docs, seen, stats), self.chunk_size))
        for chunk, vecs in distributed.ordered(self.pool, self._encoded, chunks):
            text_rows = self._text_rows(chunk)
            new = [i for i, (_, _, pos) in enumerate(chunk) if pos is None]
            for i, (_, h, pos) in enumerate(chunk):
                if pos is not None:
                    replaced[pos] = (h, vecs[i], {name: rows[i] for name, rows in text_rows.items()})
            if new:
                self._invalidate()
                self._append_ids([chunk[i][0]["docid"] for i in new], [chunk[i][1] for i in new])
                self._append_vectors(np.ascontiguousarray(vecs[new]),
                                     {name: [rows[i] for i in new] for name, rows in text_rows.items()})
        removed = self._missing_rows(seen) if delete else []
        stats["removed"] = len(removed)
        self._apply(replaced, removed)
        return stats

    def remove(self, docids: Iterable[str]) -> int:
        rows = sorted({self._pos[d] for d in docids if d in self._pos})
        self._apply({}, rows)
        return len(rows)

    def _apply(self, replaced: dict[int, tuple[str, np.ndarray, dict]], removed: list[int]) -> None:
        """Replace changed docs' rows in place and drop removed docs, in the ids and in every store."""
        if not replaced and not removed:
            self._finish()
            return
        n = len(self)
        parts = {pos: {**{name: cols[0] for name, cols in self._split(row[None]).items()}, **text}
                 for pos, (_, row, text) in replaced.items()}
        for pos, (h, _, _) in replaced.items():
            self._hash[pos] = h
        keep = np.ones(n, dtype=bool)
        keep[removed] = False
        self._keep_rows(keep)
        self._invalidate()
        for name, st in self.stores.items():
            st.apply({pos: p[name] for pos, p in parts.items()}, removed, n)

    # ------------------------------------------------------------ search

    def search_knob_values(self, st) -> dict:
        return {name: getattr(self, name) for name in st.knobs}

    def search_store(self, name: str, queries, k: int):
        """Top min(k, len) docs per query (as the store ``name`` takes them) of that store, ties by docid: (scores
        [nq, k], docids) best first, or the store's own hit lists (a store that reads text)."""
        st = self.stores[name]
        return st.search(queries, k, self.order_key(), self.docids, **self.search_knob_values(st))

    def search_vectors(self, qvecs: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """Top min(k, len) docs per encoded query of the searched store: (scores [nq, k], docids)."""
        return self.search_store(self.searched, qvecs, k)

    def search(self, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        qvecs = self._encode_queries(queries)
        # kept until the next search: scoring this chunk's positives (mine) costs no second forward pass
        self._last_queries = {q["query_text"]: v for q, v in zip(queries, qvecs, strict=True)}
        return base.as_run(queries, self.search_vectors(qvecs, k))

    def score(self, query: dict, docids: Iterable[str]) -> dict[str, float]:
        """The encoded query's score with each given doc's stored row (what search ranks by)."""
        docids = [d for d in docids if d in self._pos]
        if not docids:
            return {}
        qvec = self._last_queries.get(query["query_text"])
        if qvec is None:
            qvec = self._encode_queries([query])[0]
        rows = np.array([self._pos[d] for d in docids], np.int64)
        return dict(zip(docids, self.stores[self.searched].dot(qvec, rows, len(self)).tolist(), strict=True))

    # ------------------------------------------------------------ files

    def save(self, directory: str | Path, keep: int = base.KEEP) -> None:
        """Publish this index as a new version of ``directory`` (see retrctl.indexes.store)."""
        self._finish()
        with store.new_version(directory, keep) as tmp:
            self.write_files(tmp)

    def _read_meta(self, manifest: dict) -> None:
        self.encoder_desc = manifest["encoder"]
        self.meta = {k: manifest[k] for k in ("source", "shard") if k in manifest}

    def _joined_stores(self, parts: list[EncodedIndex]) -> None:
        """This (empty) index holds the docs of ``parts``, in order: ids, hashes and every store."""
        self._set_ids([d for p in parts for d in p.docids], [h for p in parts for h in p._hash])
        counts = [len(p) for p in parts]
        self.stores = {name: type(st).joined([p.stores[name] for p in parts], counts) for name, st in self.stores.items()}


def encoder_from_manifest(manifest: dict, *, device: str | None = None, warn: Path | None = None,
                          query_encoder: str = "full", **overrides):
    """The encoder a manifest describes (its model and ENCODER_KEYS), loaded; the one place that maps a manifest to
    ``Encoder.load``. ``overrides`` (flags the user set: pooling, query_prompt, dtype, …; None = not set) win over
    the manifest. With ``warn`` (the index being opened to search) overriding a setting the doc vectors were made
    with is warned about; an update passes none, as it rebuilds when such a setting changes. ``query_encoder``
    (search only): ``auto`` encodes queries by token lookup when the model ships a table (models/lookup.py: no
    transformer loaded), ``full`` with the full model, ``token-lookup`` insists."""
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


def manifest_model(model: str) -> str:
    """A model as a manifest records it: a shipped name (or a name that is no path here) as it is, a local path
    absolute."""
    from retrctl.models import SHIPPED

    return model if model in SHIPPED or not Path(model).exists() else str(Path(model).resolve())


def describe(encoder) -> dict:
    """The encoder's description for a manifest, a local model path made absolute, and ``weights``: a hash of the
    weights it was loaded from (``weights_of``), so that an update sees a model trained again under the same path."""
    desc = dict(encoder.describe())
    desc["model"] = manifest_model(desc.get("model", ""))
    weights = weights_of(encoder)
    if weights is not None:
        desc["weights"] = weights
    return desc


def weights_of(encoder) -> str | None:
    """``hashing.weights_hex`` of the files ``encoder`` was loaded from (a model dir, a shipped model's, an ONNX
    graph); None when it names none."""
    from retrctl.hashing import weights_hex
    from retrctl.models.loading import resolve

    source = str(getattr(encoder, "source", "") or "")
    if not source:
        return None
    if Path(source).is_file() and Path(source).suffix == ".onnx":
        return weights_hex(source)
    try:
        return weights_hex(resolve(source))
    except (FileNotFoundError, ValueError):
        return None


def other_weights(manifest: dict, encoder) -> str | None:
    """Why the model an index's manifest records does not hold ``encoder``'s weights, or None where it does. The same
    model path: the weights hash the manifest recorded against that of the files ``encoder`` was loaded from
    (``weights_of``; a model trained again in place differs there). Another path (a model saved again elsewhere or in
    another format): the recorded model loaded, tensor for tensor (``same_weights``). The settings the vectors were
    made with are ``passage_differences``'s to compare."""
    desc = manifest.get("encoder") or {}
    held, mine = desc.get("weights"), weights_of(encoder)
    if held is not None and held == mine:
        return None
    if desc.get("model") == manifest_model(str(getattr(encoder, "source", "") or "")):
        return f"its model ({desc.get('model')}) has been saved again with other weights" if held and mine else None
    try:
        theirs = encoder_from_manifest(manifest, device="cpu")
    except (OSError, ValueError, UsageError) as e:
        return f"its model ({desc.get('model')}) does not load: {e}"
    return None if same_weights(theirs, encoder) else f"its model ({desc.get('model')}) has other weights"


def same_weights(a, b) -> bool:
    """Whether two loaded encoders hold the same weights, tensor for tensor (torch modules only: an ONNX graph or a
    token-lookup table is never taken for another's). Models saved under other paths, or in other file formats,
    compare by what they compute with, not by their files."""
    import torch

    if not (isinstance(a, torch.nn.Module) and isinstance(b, torch.nn.Module)):
        return False
    mine, theirs = a.state_dict(), b.state_dict()
    return mine.keys() == theirs.keys() and all(
        mine[k].shape == theirs[k].shape and mine[k].dtype == theirs[k].dtype and torch.equal(mine[k], theirs[k])
        for k in mine)


def same_encoder(a: dict | None, b: dict | None) -> bool:
    """Whether two shards' encoders agree: every setting, the model by name (paths differ across machines), and its
    weights where both shards recorded them (a shard indexed before the weights were hashed has none)."""
    keys = [{**(d or {}), "model": Path(str((d or {}).get("model", ""))).name} for d in (a, b)]
    if not all(k.get("weights") for k in keys):
        for k in keys:
            k.pop("weights", None)
    return keys[0] == keys[1]
