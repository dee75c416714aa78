"""search: top-k retrieval from an index built by `retrctl index`; writes a run.

Methods: dense retrieval (Karpukhin et al. 2020, arXiv:2004.04906) — queries are encoded with the settings the
index manifest recorded for its encoder (query prompt, pooling, max lengths; FlagEmbedding#402: inference
must use the training-time instructions) and searched with faiss by inner product; or BM25 (bm25s, the variant
recorded in the manifest). The flag vocabulary is Pyserini's (`--hits`, `--batch-size`, `--remove-query`,
`--output-format`), so a BM25 run and a dense run differ only in the index.

| knob                                             | flag                       | default |
|--------------------------------------------------|----------------------------|---------|
| results per query                                | `--hits`                   | 1000    |
| drop the doc whose id is the query's (BEIR ArguAna) | `--remove-query`        | off     |
| query encoder settings (override the manifest)   | `--query-prompt`, `--query-max-len`, `--pooling`, … | the manifest's |
| HNSW search breadth / IVF lists probed           | `--ef-search`, `--nprobe`  | the manifest's (128 / 32) |
| query encoder: LightRetriever token lookup or the full model | `--query-encoder auto|full|token-lookup` | auto: lookup when the model has a table |
| heads searched, and how their lists are fused (an index of a dense + sparse model, or dense + bm25) | `--heads dense,sparse,bm25`, `--fusion linear|rrf`, `--norm`, `--weights`, `--rrf-k`, `--depth` | every head the index holds; what `index` recorded, else linear, min-max, 1 each, 60, each head's top 100 |
| with the colbert head (BGE-M3): candidates re-scored by s_rank = Σ w·raw score | `--heads dense,sparse,colbert`, `--candidates dense,sparse|all`, `--weights`, `--depth` | the other searched heads' top 100 (colbert alone: all docs); 1,0.3,1 |
| sparse search: exact (scipy CSR) or Seismic (approximate; candidates rescored exactly) | `--sparse-search auto|exact|seismic`, `--query-cut`, `--heap-factor` | auto: Seismic from 100,000 docs; 20; 0.9 |
| query batch                                      | `--batch-size`             | the manifest's |
| output                                           | `--output-format trec|jsonl|parquet`, `--run-tag` | by `-o` extension, else TREC |
| doc text in the output (for `rerank` in a pipe)  | `--with-text` (+ `--corpus`) | off   |

A run written to a file gets `<run>.manifest.json` beside it: the index, its BM25 variant or encoder recipe and
library versions, the search settings and the run tag (TREC runs have no header, and BM25 numbers cannot be
re-derived without the variant).

Multi-vector (BGE-M3, Chen et al. 2024, arXiv:2402.03216): when the searched heads include colbert, each query's
candidates (the union of each `--candidates` head's top `--depth`; `all` = every doc, brute force) are re-scored
exactly as s_rank = w_dense·s_dense + w_sparse·s_lex + w_colbert·s_mul — raw scores: the stored vectors' inner
product, the sparse dot product, MaxSim averaged over the query's tokens — with `--weights` in dense,sparse,colbert
order; `--fusion`/`--norm`/`--rrf-k` do not apply. The queries run the model's full encoder. A search without
colbert fuses as above.

Order: score descending, ties by docid ascending, in every backend. BM25 returns only docs that match at least
one query term (Lucene's semantics), so a query can get fewer than `--hits` results. Queries are read and
searched in bounded chunks, and rows are written as each chunk finishes.

`--with-text` adds `query_text`, `title` and `text` to each JSONL row (pyserini#2057: a dense index holds no
text). Texts come from `--corpus`, by default the corpus the index was built from (recorded in its manifest);
the corpus is streamed once per chunk of queries, keeping only the retrieved docs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import click

from retrctl import distributed, records
from retrctl.errors import UsageError
from retrctl.models.config import QUERY_ENCODER_HELP
from retrctl.options import encoder_overrides, flag_option, options
from retrctl.stage import Output, progress, stage

log = logging.getLogger("retrctl.search")


def search(queries: Iterable[dict], index, *, hits: int = 1000, remove_query: bool = False,
           texts: Callable[[set], dict] | None = None) -> Iterator[dict]:
    """Run rows {query_id, doc_id, score, rank} for each query, best first; with ``texts`` (docids -> {docid:
    {title, text}}) rows also carry query_text, title and text."""
    chunk_size = max(16, min(4096, 1_000_000 // max(hits, 1)))  # bounds the results held at once
    k = hits + 1 if remove_query else hits
    # on Ray workers (index.pool) several chunks' queries are encoded at once, the results taken back in order
    chunks = distributed.ordered(getattr(index, "pool", None), lambda chunk: (chunk, index.search(chunk, k)),
                                 records.batched(queries, chunk_size))
    for chunk, results in chunks:
        found = texts({d for q in chunk for d, _ in results[q["query_id"]]}) if texts else None
        for q in chunk:
            qid = q["query_id"]
            ranked = results[qid]
            if remove_query:
                ranked = [(d, s) for d, s in ranked if d != qid]
            for rank, (docid, score) in enumerate(ranked[:hits], 1):
                row = {"query_id": qid, "doc_id": docid, "score": score, "rank": rank}
                if found is not None:
                    doc = found.get(docid, {})
                    row.update(query_text=q["query_text"], title=doc.get("title", ""), text=doc.get("text", ""))
                yield row


def on_workers(ray, idx, rows: Callable[[], Iterator[dict]]) -> Iterator[dict]:
    """``rows()`` with the index's query encoder on Ray workers for as long as the rows are being written
    (``ray``: retrctl.distributed settings; None, or an index without a model, runs here)."""
    if ray is not None and not idx.needs_encoder:
        log.warning("--ray is ignored by a %s index (no model to run)", idx.name)
        ray = None
    if ray is None:
        yield from rows()
        return
    with distributed.workers(ray, idx.encoder, "query encoding") as pool, idx.on_workers(pool):
        yield from rows()


def corpus_lookup(path: str, fmt: str | None = None) -> Callable[[set], dict]:
    """docids -> {docid: {title, text}}, streaming the corpus and keeping only the wanted docs."""

    def lookup(wanted: set) -> dict:
        found = {d["docid"]: {"title": d["title"], "text": d["text"]} for d in records.read(path, "doc", fmt) if d["docid"] in wanted}
        if len(found) < len(wanted):
            log.warning("%d retrieved docs are not in %s: their text is empty", len(wanted) - len(found), path)
        return found

    return lookup


def default_tag(manifest: dict) -> str:
    """A run tag naming the retriever, as the index's backend words it (TREC tags cannot hold spaces)."""
    from retrctl.indexes import BACKENDS
    from retrctl.indexes.base import Index

    return re.sub(r"\s+", "_", BACKENDS.get(manifest.get("backend"), Index).run_tag(manifest))


def provenance(idx, index_dir: str, queries: str, tag: str, rows: int, settings: dict, overrides: dict) -> dict:
    """The run's manifest: which index version, its BM25 variant or encoder recipe, the search
    settings and library versions. Called once the run is written, so the encoder's truncation count is final."""
    if idx.encoder is not None:
        idx.encoder.report_truncation()
    manifest = idx.version.manifest
    return {"stage": "search", "index": str(Path(index_dir).resolve()), "index_version": idx.version.name,
            "queries": queries if queries == "-" else str(Path(queries).resolve()), "run_tag": tag, "rows": rows,
            "settings": {**settings, **{k: getattr(idx, k) for k in idx.search_knobs}},
            "encoder_overrides": overrides or None,
            "index_manifest": {k: manifest.get(k) for k in ("backend", "variant", "settings", "encoder", "doc_count", "source",
                                                           "versions") if k in manifest}}


def backend_options() -> list[click.Option]:
    """The registered backends' `search` flags, read at each parse so a backend registered later brings its own."""
    from retrctl.indexes import declared_flags

    return [flag_option(flag) for flag in declared_flags("search").values()]


def set_knobs(idx, knobs: dict) -> None:
    """Set the search flags given (not None) on the opened index, for this run: those it takes (``search_knobs``);
    one it does not take is the usage error its declaration words (the shared fusion flags: a multi-head index's),
    or ignored where it words none."""
    from retrctl.indexes import declared_flags
    from retrctl.indexes.heads.search import FUSION_KNOBS, ONE_HEAD

    declared = declared_flags("search")
    for name, value in knobs.items():
        if value is None:
            continue
        refused = idx.refuses or (ONE_HEAD if name in FUSION_KNOBS else declared[name].refused if name in declared else None)
        if name in idx.search_knobs:
            setattr(idx, name, value)
        elif refused:
            raise UsageError(refused.format(flag=name.replace("_", "-"), backend=idx.name))


@stage(search, writes="run", more_options=backend_options)
@options("input_format", "batch_size", "corpus", "encoder", "runtime", "fusion", "weights", "ray")
@click.argument("index_dir")
@click.argument("queries", default="-", required=False)
@options("hits")
@click.option("--remove-query", is_flag=True, help="Drop a doc whose id equals the query id (BEIR ArguAna convention).")
@options("run_format", "run_tag")
@click.option("--with-text", is_flag=True, help="Add query_text, title and text to each row (JSONL/Parquet), for rerank in a pipe.")
@click.option("--query-encoder", type=click.Choice(["auto", "full", "token-lookup"]), default="auto", show_default=True,
              help=QUERY_ENCODER_HELP)
def command(index_dir, queries, output, input_format, batch_size, corpus, hits, remove_query, output_format, run_tag,
            with_text, query_encoder, fusion_method, **opts):
    """Search an index (from `retrctl index`) with queries (JSONL/Parquet/BEIR folder, '-' = stdin); write a run."""
    from retrctl.indexes import open_index

    ray = distributed.pop_settings(opts)
    overrides = encoder_overrides(opts)  # what is left in opts: the backends' search flags
    device = overrides.pop("device", "cpu" if ray is not None else None)  # with --ray: the workers' copies run it
    # one version, resolved once: an update publishing meanwhile cannot mix versions into this search
    idx = open_index(index_dir, device=device, query_encoder=query_encoder, **overrides)
    version = idx.version
    manifest = version.manifest
    if not idx.needs_encoder and (overrides or device):
        log.warning("encoder flags are ignored by a %s index", idx.name)
    log.info("%s index %s: %s", idx.name, index_dir, idx.describe())
    set_knobs(idx, {"batch_size": batch_size, "fusion": fusion_method, "remove_query": remove_query or None, **opts})
    fmt = output_format
    if with_text:
        if fmt == "trec":
            raise UsageError("--with-text needs --output-format jsonl or parquet (TREC runs have no text column)")
        fmt = fmt or ("parquet" if records.is_parquet(output) else "jsonl")
        corpus = corpus or manifest.get("source")
        if not corpus or not isinstance(corpus, str):
            raise UsageError("--with-text needs --corpus (the index does not record where its corpus is)")
    recs = progress(records.read(queries, "query", input_format), desc="search", unit="query")
    rows = on_workers(ray, idx, lambda: search(recs, idx, hits=hits, remove_query=remove_query,
                                               texts=corpus_lookup(corpus) if with_text else None))
    tag = run_tag or default_tag(manifest)
    settings = {"hits": hits, "remove_query": remove_query, "with_text": with_text}
    if idx.needs_encoder:
        settings["query_encoder"] = "token-lookup" if idx.encoder.describe().get("query_encoder") == "token-lookup" else "full"
    return Output(rows, fmt=fmt, tag=tag, finish=lambda n: provenance(idx, index_dir, queries, tag, n, settings, overrides))
