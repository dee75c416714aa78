"""Retrievers for the stages that need candidates rather than a run file: mine (hard negatives) and qgen
(the consistency filter). One `--retriever` vocabulary for both: `bm25`, `hybrid` (with `--model`), an index
dir, a run file, or a model (shipped name, dir, GGUF).

Every retriever has ``search(queries, k) -> {query_id: [(docid, score), ...]}``; ``IndexRetriever`` also has
``score(query_id, docids)`` for positives outside the top-k (mine's margin reference). Dense corpus vectors for
a model retriever are cached under `<cache>/mine/<model>-<key>` as a Flat DenseIndex kept in sync by content
hash, so a sweep of mining settings encodes the corpus once and an edited corpus re-encodes only changed docs
(ST#3338). `hybrid` fuses dense and BM25 top-k lists with reciprocal rank fusion (Cormack et al. 2009, k=60).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections import Counter
from pathlib import Path

import click

from retrctl import records
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
    """Any retrctl index. Positives outside the top-k are scored exactly: dense = query vector . doc vector,
    BM25 = bm25s's score of that doc for the query (0 when no query term matches, which search leaves out)."""

    def __init__(self, index):
        self.index = index
        self.dense = hasattr(index, "search_vectors") and getattr(index, "encoder", None) is not None
        self.bm25 = getattr(index, "name", "") == "bm25"
        self._chunk: dict[str, object] = {}  # this chunk's query vectors (dense) or texts (bm25)
        self._rows: dict[str, int] | None = None

    def search(self, queries: list[dict], k: int) -> dict:
        if not self.dense:
            self._chunk = {q["query_id"]: q["query_text"] for q in queries}
            return self.index.search(queries, k)
        qv = self.index.encoder.encode([q["query_text"] for q in queries], kind="query", batch_size=self.index.batch_size)
        self._chunk = {q["query_id"]: v for q, v in zip(queries, qv, strict=True)}
        scores, ids = self.index.search_vectors(qv, k)
        return {q["query_id"]: [(d, float(s)) for d, s in zip(row_ids, row, strict=False)]
                for q, row_ids, row in zip(queries, ids, scores, strict=True)}

    def score(self, qid: str, docids: list[str]) -> dict[str, float]:
        if qid not in self._chunk or not (self.dense or self.bm25):
            return {}
        if self._rows is None or len(self._rows) != len(self.index.docids):
            self._rows = {d: i for i, d in enumerate(self.index.docids)}
        docids = [d for d in docids if d in self._rows]
        if not docids:
            return {}
        if self.dense:
            return dict(zip(docids, (self.index.get_vectors(docids) @ self._chunk[qid]).tolist(), strict=True))
        tok = self.index.tokenizer
        ids = [i for i in next(iter(tok.streaming_tokenize([self._chunk[qid]], update_vocab=False))) if i != tok.word_to_id.get("")]
        if not ids or self.index.retriever is None:
            return dict.fromkeys(docids, 0.0)
        scores = self.index.retriever.get_scores_from_ids(ids)
        return {d: float(scores[self._rows[d]]) for d in docids}


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
                **overrides):
    """A Flat (exact) DenseIndex of the corpus; with ``cache`` it lives under cache_dir()/mine and is synced."""
    from retrctl.indexes import store
    from retrctl.indexes.dense import DenseIndex
    from retrctl.models import Encoder, cache_dir

    device, dtype = overrides.pop("device", None), overrides.pop("dtype", None)
    enc = Encoder.load(model, device=device, dtype=dtype, **overrides)
    stream = ({"docid": d, **doc} for d, doc in docs.items())
    if not cache or corpus_path in (None, "-"):
        idx = DenseIndex(enc, "Flat", batch_size)
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
        changes = idx.sync(stream, delete=True)
        if changes["added"] or changes["updated"] or changes["removed"] or not (where / "index.json").exists():
            idx.meta = {"source": ident}
            idx.save(where)
            store.gc(where, keep=1)  # every reader of the cache holds _locked: no one is reading an old version
        shutil.rmtree(idx.workdir, ignore_errors=True)
    log.info("corpus vectors: %d encoded, %d reused, %d dropped (cache %s)", idx.encoded, changes["unchanged"], changes["removed"], where)
    return idx


def check_spec(spec: str | None, model: str | None = None) -> str:
    """The --retriever spec (or --model), refused before any work when it names nothing usable."""
    from retrctl.models import SHIPPED

    spec = spec or model
    if spec is None:
        raise click.UsageError("give --retriever (bm25, hybrid, a model, an index dir or a run file) or --model")
    if spec == "hybrid" and not model:
        raise click.UsageError("--retriever hybrid needs --model (the dense half)")
    if spec not in ("bm25", "hybrid") and spec not in SHIPPED and not Path(spec).exists():
        raise click.UsageError(f"--retriever {spec!r}: not bm25/hybrid, a shipped model ({', '.join(SHIPPED)}), or an existing path")
    return spec


def open_retriever(spec: str | None, *, model: str | None, docs: dict, corpus_path: str | None, batch_size: int = 64,
                   cache: bool = True, **overrides):
    """--retriever: 'bm25', 'hybrid' (with --model), an index dir, a run file, or a model (shipped name, dir, GGUF)."""
    spec = check_spec(spec, model)
    stream = ({"docid": d, **doc} for d, doc in docs.items())
    if spec in ("bm25", "hybrid"):
        from retrctl.indexes.bm25 import BM25Index

        bm25 = BM25Index()
        bm25.build(stream)
        if spec == "bm25":
            return IndexRetriever(bm25)
        dense = dense_index(model, docs, corpus_path, batch_size, cache, **overrides)
        log.info("hybrid retriever: %s + BM25 top-k lists fused by reciprocal rank fusion (k=%d); scores are RRF scores", model, RRF_K)
        return HybridRetriever(IndexRetriever(dense), IndexRetriever(bm25))
    path = Path(spec)
    if path.is_dir() and (path / "index.json").exists():
        from retrctl.indexes import open_index

        return IndexRetriever(open_index(path))
    if path.is_file() and path.suffix != ".gguf":
        return RunRetriever(records.read_run(path))
    return IndexRetriever(dense_index(spec, docs, corpus_path, batch_size, cache, **overrides))
