"""The Index interface every backend implements; `search`, `mine` and `index` use only this.

One index *version* is a directory holding ``index.json`` (the manifest: format version, backend, its
settings, doc count, encoder description for dense backends) and the backend's files; doc ids and per-doc
content hashes are stored as Parquet, vectors as arrays, never pickles. An index directory holds immutable
versions under ``versions/`` and a pointer (its own ``index.json``) naming the current one; see
``retrctl.indexes.store`` for the layout, what is atomic (only the pointer switch, an os.replace), the writer lock
(``records.BusyError``, exit 75) and ``--keep``. ``open_index(dir)`` resolves the pointer once and the backend
reads only that version (``load``); ``save(dir)`` publishes a new version (``write_files`` into a temp version,
rename, switch), so a reader never sees a half-written or mixed index. A flat directory written by earlier
retrctl (files next to index.json, no pointer) opens as one version.

Updates are by content hash (``records.content_hash(title, text)``): ``sync(docs)`` adds new docs,
re-processes changed ones, leaves unchanged ones alone and (with ``delete=True``) drops docs that are no
longer in the stream — the incremental update peers lack (pyserini#1964, faiss#3339).

A missing, truncated or corrupt file of a version is reported as one ``RecordError`` naming the file and the
way out (``--rebuild``), never as a bare library exception.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retrctl import records
from retrctl.errors import UsageError
from retrctl.indexes import store

DOCIDS = "docids.parquet"


@dataclass(frozen=True)
class Flag:
    """A command-line option a backend declares: `retrctl index` passes it to ``create`` (``index_flags``),
    `retrctl search` sets it on the opened index for one run (``search_flags``). The stages read the declarations
    from ``BACKENDS`` and never list them, so a backend brings its own flags; one declaration per name serves every
    backend that names it in ``flags`` or ``search_knobs``.

    ``type``: str, int or float, or a tuple of the allowed values; ``low``/``high`` bound a number (``low_open``:
    excluded); ``parse`` turns the text into the value (ValueError: a bad value); ``default`` is shown by --help
    and passed when the flag is not given. ``refused`` (search): the usage error when the flag is given for an
    index that does not take it, ``{backend}`` standing for its name; None ignores the flag there.
    """

    name: str  # the keyword; the flag is --name with "-" for "_"
    help: str
    type: type | tuple = str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    default: object = None
    parse: Callable[[str], object] | None = None
    refused: str | None = None

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value) -> str | None:
        """What is wrong with ``value`` given through the Python API (the command line checks it in click), or None."""
        if value is None or isinstance(self.type, tuple) or self.type not in (int, float):
            return None
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return f"{self.option} must be {'more than' if self.low_open else 'at least'} {self.low:g}"
        if self.high is not None and value > self.high:
            return f"{self.option} must be at most {self.high:g}"
        return None


class Index:
    """Backends subclass this and register under ``name`` in ``retrctl.indexes.BACKENDS``; the stages ask the
    backend (the attributes and classmethods below) instead of branching on its name.

    Shared bookkeeping: ``docids`` (row order of the backend's storage), the content hash of each row,
    and ``meta`` (free-form provenance the caller wants in the manifest: source corpus, shard).
    """

    name = "base"
    summary = ""  # a few words for `retrctl index --method`'s help (the library behind it)
    needs_encoder = False  # True: built with an encoder (`index` needs --model or an old manifest; encoder flags apply)
    from_corpus = True  # built from a corpus: an `index --method` choice (a fused index is made from indexes)
    flags: tuple[str, ...] = ()  # the `index` options it takes: ``create`` and ``prepare_update`` get these only
    search_knobs: tuple[str, ...] = ()  # attributes `search` may set for one run; they do not change stored content
    index_flags: tuple[Flag, ...] = ()  # declarations of `index` options named in ``flags`` (or another backend's)
    search_flags: tuple[Flag, ...] = ()  # declarations of `search` options named in ``search_knobs``
    refuses: str | None = None  # the usage error for any `search` flag it does not take ({flag}); None: the flag's own
    encoder = None  # the encoder behind the index; None for backends without one
    encoded = 0  # docs this object ran through its encoder (updates report how many were not reused)
    search_defaults: dict = {}  # fusion flags `index` recorded for searches (a multi-head index's; never mutated)

    def __init__(self) -> None:
        self._clear_ids()
        self.meta: dict = {}
        self.version: store.Version | None = None  # the version this index was loaded from

    # ------------------------------------------------------------ what the stages ask a backend

    @classmethod
    def create(cls, encoder=None, **options) -> Index:
        """A new, empty index from `retrctl index`'s options: keyword arguments named in ``flags`` (one left out
        takes the backend's default). ``encoder`` is given exactly when ``needs_encoder``."""
        raise NotImplementedError

    @classmethod
    def encoder_for(cls, model: str | None, manifest: dict | None, **settings):
        """The encoder of a new or updated index: ``model`` (--model) with the encoder ``settings`` (flags the user
        set, device and dtype included), or, without a model, the one ``manifest`` (this backend's) was built with,
        those settings overriding its own. Only for backends that ``needs_encoder``."""
        raise ValueError(f"{cls.name} indexes take no encoder")

    @classmethod
    def update_options(cls, manifest: dict, options: dict) -> dict:
        """`index`'s options (those given) for an update of the index ``manifest`` describes: a backend fills in the
        stored settings an update keeps when their flag is not given."""
        return options

    @classmethod
    def content_settings(cls, manifest: dict) -> dict:
        """What the stored data depends on, from a manifest: an update reuses a version only when these equal
        the requested index's (batch sizes and search-time knobs do not count)."""
        return dict(manifest.get("settings", {}))

    @classmethod
    def run_tag(cls, manifest: dict) -> str:
        """A TREC run tag naming the retriever a manifest describes (spaces are replaced by the caller)."""
        return str(manifest.get("backend", cls.name))

    def describe(self) -> str:
        """One line for logs: size and the settings that matter."""
        return f"{len(self)} docs"

    def prepare_update(self, workdir: Path, **options) -> None:
        """Apply `index`'s options (``flags``) that do not change stored content (batch size, checkpoint
        interval) and the resume directory to an index about to be built or updated."""

    def report_update(self, stats: dict, workdir: Path) -> None:
        """Log what an update did beyond the counts (``stats``): e.g. truncated passages, reused checkpoints."""

    def score(self, query: dict, docids: Iterable[str]) -> dict[str, float]:
        """{docid: score of that doc for ``query``} as ``search`` computes it, for docs outside its top-k (mine's
        margin reference); docs not in the index are left out. A backend that cannot score returns {}."""
        return {}

    @contextlib.contextmanager
    def on_workers(self, pool) -> Iterator[Index]:
        """Inside the block an index with an encoder runs its forward passes on ``pool``'s workers (EncodedIndex);
        an index without one has nothing to hand out (``pool`` is then None)."""
        if pool is not None:
            raise ValueError(f"a {type(self).__name__} runs no model: it has no work for Ray workers")
        yield self

    def record_search_defaults(self, defaults: dict) -> None:
        """Keep the fusion flags given to `index` (``fusion``, ``norm``, ``rrf_k``, ``depth``, ``weights``) as this
        index's search defaults; an index of one head fuses nothing and refuses them."""
        if defaults:
            flag = next(iter(defaults)).replace("_", "-")
            raise UsageError(f"--{flag}: this {self.name} index has one head, so a search fuses nothing (index "
                             "several heads: --heads dense,bm25)")

    def manifest(self) -> dict:
        """The manifest written with the files: backend, settings (``config()``), doc count, backend details."""
        raise NotImplementedError

    # ------------------------------------------------------------ the index itself

    def build(self, docs: Iterable[dict]) -> dict:
        """Index doc records ({docid, title, text}) from a stream, replacing any content."""
        self._clear()
        return self.sync(docs, delete=False)

    def add(self, docs: Iterable[dict]) -> dict:
        """Add or replace docs (by docid); docs whose content hash is unchanged are skipped."""
        return self.sync(docs, delete=False)

    def sync(self, docs: Iterable[dict], delete: bool = True) -> dict:
        """Make the index hold exactly ``docs`` (or, with delete=False, at least them).

        Returns counts {"added", "updated", "unchanged", "removed"}.
        """
        raise NotImplementedError

    def remove(self, docids: Iterable[str]) -> int:
        """Drop docs by id (unknown ids are ignored); returns how many were removed."""
        raise NotImplementedError

    def search(self, queries: list[dict], k: int) -> dict[str, list[tuple[str, float]]]:
        """query records ({query_id, query_text}) -> {query_id: [(docid, score)] best first}.

        Ties are broken by docid ascending so every backend returns the same order for equal scores.
        """
        raise NotImplementedError

    def config(self) -> dict:
        """Exactly the constructor's arguments (saved under "settings" in the manifest)."""
        raise NotImplementedError

    def save(self, directory: str | Path, keep: int = store.KEEP) -> None:
        """Publish as a new version of ``directory``: write_files into a temp version, rename, switch the pointer."""
        raise NotImplementedError

    def write_files(self, directory: Path) -> None:
        """Write the complete index (manifest + backend files) into an empty directory."""
        raise NotImplementedError

    @classmethod
    def load(cls, directory: str | Path | store.Version, **kw) -> Index:
        """Reopen one version from its manifest. ``kw`` are open_index's (encoder=, device=, encoder overrides):
        a backend ignores the ones it has no use for, so callers pass them without asking which backend it is."""
        raise NotImplementedError

    @classmethod
    def merge(cls, parts: list[Index]) -> Index:
        """One index holding the docs of several (e.g. shard indexes built with --shard-id/--shard-num)."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.docids)

    # ------------------------------------------------------------ doc id bookkeeping

    def _clear(self) -> None:
        self._clear_ids()

    def _clear_ids(self) -> None:
        self.docids: list[str] = []
        self._hash: list[str] = []
        self._pos: dict[str, int] = {}

    @property
    def hashes(self) -> dict[str, str]:
        return dict(zip(self.docids, self._hash, strict=True))

    def _set_ids(self, docids: list[str], hashes: list[str]) -> None:
        self.docids, self._hash = list(docids), list(hashes)
        self._pos = {d: i for i, d in enumerate(self.docids)}
        if len(self._pos) != len(self.docids):
            raise ValueError("duplicate docids in index")

    def _append_ids(self, docids: list[str], hashes: list[str]) -> None:
        for d, h in zip(docids, hashes, strict=True):
            self._pos[d] = len(self.docids)
            self.docids.append(d)
            self._hash.append(h)

    def _keep_rows(self, keep: np.ndarray) -> None:
        """Keep only the rows where ``keep`` is True (order preserved)."""
        idx = np.flatnonzero(keep)
        self._set_ids([self.docids[i] for i in idx], [self._hash[i] for i in idx])

    def _classify(self, docs: Iterable[dict], seen: set, stats: dict) -> Iterator[tuple[dict, str, int | None]]:
        """Yield (doc, content hash, old row or None) for docs that need work; count the unchanged ones."""
        for doc in docs:
            docid = doc["docid"]
            if docid in seen:
                raise ValueError(f"duplicate docid {docid!r} in the input")
            seen.add(docid)
            h = records.content_hash(doc.get("title") or "", doc["text"])
            pos = self._pos.get(docid)
            if pos is not None and self._hash[pos] == h:
                stats["unchanged"] += 1
                continue
            stats["updated" if pos is not None else "added"] += 1
            yield doc, h, pos

    def _missing_rows(self, seen: set) -> list[int]:
        return [i for i, d in enumerate(self.docids) if d not in seen]

    def positions(self, docids: Iterable[str]) -> dict[str, int]:
        """{docid: row} of the given docs that the index holds, in the order given."""
        return {d: self._pos[d] for d in docids if d in self._pos}

    def order_key(self) -> np.ndarray:
        """Rank of each row's docid in ascending docid order: the tie-break key."""
        key = getattr(self, "_order_cache", None)
        if key is None or len(key) != len(self.docids):
            order = np.argsort(np.asarray(self.docids, dtype=object), kind="stable")
            key = np.empty(len(order), dtype=np.int64)
            key[order] = np.arange(len(order))
            self._order_cache = key
        return key

    def _invalidate(self) -> None:
        self._order_cache = None


def new_stats() -> dict:
    return {"added": 0, "updated": 0, "unchanged": 0, "removed": 0}


def as_run(queries: list[dict], found) -> dict[str, list[tuple[str, float]]]:
    """A store's answer, (scores [nq, k], docids) best first, as a run: {query_id: [(docid, score)]}."""
    scores, docids = found
    return {q["query_id"]: [(d, float(s)) for d, s in zip(ids, row, strict=False)]
            for q, ids, row in zip(queries, docids, scores, strict=True)}


def top_k(scores: np.ndarray, key: np.ndarray, k: int) -> np.ndarray:
    """Row positions of the k best scores, best first, ties by ``key`` ascending (exact, deterministic)."""
    n = len(scores)
    if k >= n:
        cand = np.arange(n)
    else:
        kth = np.partition(scores, n - k)[n - k]
        cand = np.flatnonzero(scores >= kth)
    order = np.lexsort((key[cand], -scores[cand]))
    return cand[order[:k]]


# ---------------------------------------------------------------- files

# The directory layout (versions, pointer, lock) lives in retrctl.indexes.store; a backend writes one complete
# version with ``write_files(dir)`` and reads one with ``load(dir)``, where dir is resolved once by store.resolve.
FORMAT_VERSION = store.FORMAT_VERSION
MANIFEST = store.MANIFEST
KEEP = store.KEEP
resolve = store.resolve
reading = store.reading


def write_manifest(directory: Path, manifest: dict) -> None:
    manifest = {"format_version": FORMAT_VERSION, **manifest, "versions": records.versions()}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


def encoder_content(manifest: dict) -> dict:
    """The manifest's encoder settings as content keys. None is a setting's default: a manifest older than a setting
    (mcls) lacks it, and must not force a rebuild."""
    return {f"encoder.{k}": v for k, v in (manifest.get("encoder") or {}).items() if v is not None}


def read_manifest(directory: str | Path) -> dict:
    """The manifest of the version ``directory`` currently points to (or of a flat/version dir itself)."""
    return store.resolve(directory).manifest


def write_docids(directory: Path, docids: list[str], hashes: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"docid": pa.array(docids, pa.string()), "hash": pa.array(hashes, pa.string())})
    pq.write_table(table, directory / DOCIDS)


def read_docids(directory: Path) -> tuple[list[str], list[str]]:
    import pyarrow.parquet as pq

    path = Path(directory) / DOCIDS
    with reading(path):  # one file: ParquetFile, not read_table, which imports pyarrow.dataset and pandas (0.7 s)
        table = pq.ParquetFile(path).read()
        return table.column("docid").to_pylist(), table.column("hash").to_pylist()
