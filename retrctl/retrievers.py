"""Retrievers for the stages that need candidates rather than a run file: mine (hard negatives) and qgen
(the consistency filter). One `--retriever` vocabulary for both: `bm25`, `hybrid` (with `--model`), an index
dir, a run file, or a model (shipped name, dir, GGUF).

Every retriever has ``search(queries, k) -> {query_id: [(docid, score), ...]}``; ``IndexRetriever`` also has
``score(query_id, docids)`` for positives outside the top-k (mine's margin reference), computed by the index's
backend (``Index.score``). `bm25` is the name of an index backend that needs no encoder (any such backend in
retrctl.indexes.BACKENDS is a --retriever name), built in memory over the corpus. Dense corpus vectors for a model
retriever are cached under `<cache>/mine/<model>-<key>` as a Flat DenseIndex kept in sync by content hash, so a
sweep of mining settings encodes the corpus once and an edited corpus re-encodes only changed docs (ST#3338).
`hybrid` fuses dense and BM25 top-k lists with reciprocal rank fusion (Cormack et al. 2009, k=60).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections import Counter
from pathlib import Path

from retrctl import distributed, records
from retrctl.errors import UsageError
from retrctl.hashing import stable_hex, weight_files

log = logging.getLogger("retrctl.retrievers")

RRF_K = 60


class RunRetriever:
    """Candidates from an existing run (TREC or JSONL); scores of unretrieved docs are unknown."""

    def __init__(self, run: dict[str, list[tuple[str, float]]]):
        self.run = run

    def search(self, queries: list[dict], k: int) -> dict:
        return {q["query_id"]: sorted(self.run.get(q["query_id"], []), key=lambda c: (-c[1], c[0]))[:k] for q in queries}


class IndexRetriever:
    """Any retrctl index. Positives outside the top-k are scored by its backend (``Index.score``: dense = query
    vector . doc vector, BM25 = the doc's BM25 score, 0 when no query term matches, which search leaves out)."""

    def __init__(self, index):
        self.index = index
        self._chunk: dict[str, dict] = {}  # this chunk's queries, by id

    def search(self, queries: list[dict], k: int) -> dict:
        self._chunk = {q["query_id"]: q for q in queries}
        return self.index.search(queries, k)

    def score(self, qid: str, docids: list[str]) -> dict[str, float]:
        query = self._chunk.get(qid)
        return self.index.score(query, docids) if query is not None and docids else {}


class HybridRetriever:
    """Dense + BM25 fused with reciprocal rank fusion (Cormack et al. 2009): score = sum 1/(60 + rank)."""

    def __init__(self, *parts):
        self.parts = parts

    def search(self, queries: list[dict], k: int) -> dict:
        fused: dict[str, Counter] = {q["query_id"]: Counter() for q in queries}
        for part in self.parts:
            for qid, ranked in part.search(queries, k).items():
                for rank, (d, _) in enumerate(ranked, 1):
                    fused[qid][d] += 1.0 / (RRF_K + rank)
        return {qid: sorted(c.items(), key=lambda x: (-x[1], x[0]))[:k] for qid, c in fused.items()}


def _fingerprint(model) -> dict:
    """What identifies the weights: the resolved dir and its weight files' sizes and mtimes."""
    from retrctl.models import resolve

    root = resolve(model)
    return {"dir": str(root.resolve()), "files": weight_files(root)}


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as f:
        try:
            import fcntl

            fcntl.flock(f, fcntl.LOCK_EX)
        except ImportError:  # no flock (Windows): concurrent miners may re-encode, never corrupt (atomic swap)
            pass
        yield


def dense_index(model, docs: dict[str, dict], corpus_path: str | None, batch_size: int = 64, cache: bool = True,
                workers=None, **overrides):
    """A Flat (exact) DenseIndex of the corpus; with ``cache`` it lives under cache_dir()/mine and is synced.
    ``workers`` (a callable taking the index): puts its encoder on Ray workers before the corpus is encoded."""
    from retrctl.indexes import store
    from retrctl.indexes.dense import DenseIndex
    from retrctl.models import Encoder, cache_dir

    device, dtype = overrides.pop("device", None), overrides.pop("dtype", None)
    enc = Encoder.load(model, device=device, dtype=dtype, inference=True, **overrides)
    stream = ({"docid": d, **doc} for d, doc in docs.items())
    if not cache or corpus_path in (None, "-"):
        idx = DenseIndex(enc, "Flat", batch_size)
        if workers is not None:
            workers(idx)
        idx.build(stream)
        log.info("encoded %d corpus docs (no cache)", idx.encoded)
        return idx
    desc = {k: v for k, v in enc.describe().items() if k != "model"}
    ident = {"encoder": desc, "weights": _fingerprint(model), "dtype": dtype or "fp32",
             "corpus": os.path.realpath(corpus_path)}
    key = stable_hex(json.dumps(ident, sort_keys=True), size=10)
    where = cache_dir() / "mine" / f"{Path(str(model)).name}-{key}"
    with _locked(where):
        if (where / "index.json").exists():
            idx = DenseIndex.load(where, encoder=enc)
            idx.batch_size = batch_size
        else:
            idx = DenseIndex(enc, "Flat", batch_size)
        # encoded chunks are checkpointed, so a killed first run resumes instead of re-encoding
        idx.workdir, idx.chunk_size = where.with_name(where.name + ".work"), 1024
        if workers is not None:
            workers(idx)
        changes = idx.sync(stream, delete=True)
        if changes["added"] or changes["updated"] or changes["removed"] or not (where / "index.json").exists():
            idx.meta = {"source": ident}
            idx.save(where)
            store.gc(where, keep=1)  # every reader of the cache holds _locked: no one is reading an old version
        shutil.rmtree(idx.workdir, ignore_errors=True)
    log.info("corpus vectors: %d encoded, %d reused, %d dropped (cache %s)", idx.encoded, changes["unchanged"], changes["removed"], where)
    return idx


def _lexical() -> list[str]:
    """Index backends that need no encoder: built in memory over the corpus when named as --retriever."""
    from retrctl.indexes import BACKENDS

    return [name for name, backend in BACKENDS.items() if not backend.needs_encoder and backend.from_corpus]


def check_spec(spec: str | None, model: str | None = None) -> str:
    """The --retriever spec (or --model), refused (UsageError) before any work when it names nothing usable."""
    from retrctl.models import SHIPPED

    spec = spec or model
    names = [*_lexical(), "hybrid"]
    if spec is None:
        raise UsageError(f"give --retriever ({', '.join(names)}, a model, an index dir or a run file) or --model")
    if spec == "hybrid" and not model:
        raise UsageError("--retriever hybrid needs --model (the dense half)")
    if spec not in names and spec not in SHIPPED and not Path(spec).exists():
        raise UsageError(f"--retriever {spec!r}: not {'/'.join(names)}, a shipped model ({', '.join(SHIPPED)}), or an existing path")
    return spec


def open_retriever(spec: str | None, *, model: str | None, docs: dict, corpus_path: str | None, batch_size: int = 64,
                   cache: bool = True, ray=None, stack: contextlib.ExitStack | None = None, **overrides):
    """--retriever: 'bm25', 'hybrid' (with --model), an index dir, a run file, or a model (shipped name, dir, GGUF).
    ``ray`` (retrctl.distributed settings): a model's forward passes (corpus and queries) run on Ray workers, held
    open in ``stack`` (the caller closes it once the retriever's last search is done)."""
    spec = check_spec(spec, model)
    if ray is not None and stack is None:
        raise ValueError("open_retriever(ray=...) needs a stack to hold the workers")

    def workers(idx):
        if ray is not None:
            stack.enter_context(idx.on_workers(stack.enter_context(distributed.workers(ray, idx.encoder, "encode"))))

    stream = ({"docid": d, **doc} for d, doc in docs.items())
    if spec in _lexical() or spec == "hybrid":
        from retrctl.indexes import BACKENDS

        lexical = BACKENDS["bm25" if spec == "hybrid" else spec].create()  # the backend's default settings
        lexical.build(stream)
        if spec != "hybrid":
            return IndexRetriever(lexical)
        bm25 = lexical
        dense = dense_index(model, docs, corpus_path, batch_size, cache, workers, **overrides)
        log.info("hybrid retriever: %s + BM25 top-k lists fused by reciprocal rank fusion (k=%d); scores are RRF scores", model, RRF_K)
        return HybridRetriever(IndexRetriever(dense), IndexRetriever(bm25))
    path = Path(spec)
    if path.is_dir() and (path / "index.json").exists():
        from retrctl.indexes import open_index

        idx = open_index(path)
        if idx.needs_encoder:
            workers(idx)
        return IndexRetriever(idx)
    if path.is_file() and path.suffix != ".gguf":
        return RunRetriever(records.read_run(path))
    return IndexRetriever(dense_index(spec, docs, corpus_path, batch_size, cache, workers, **overrides))
