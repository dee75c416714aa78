"""index: a dense (faiss) or BM25 (bm25s) index of a corpus, updated in place by content hash.

Methods: dense retrieval with a bi-encoder (Karpukhin et al. 2020, "Dense Passage Retrieval for Open-Domain
Question Answering", arXiv:2004.04906), searched with faiss (Douze et al. 2024, "The Faiss library",
arXiv:2401.08281); lexical BM25 (Robertson & Zaragoza 2009) in its Lucene variant, computed by bm25s (Lù 2024,
arXiv:2407.03618). A doc is "title text" in both (BEIR's convention, Thakur et al. 2021, arXiv:2104.08663).

| knob                                       | flag                                    | default |
|--------------------------------------------|-----------------------------------------|---------|
| dense or lexical                           | `--method dense|bm25`                   | dense (an existing index keeps its own) |
| encoder and its settings (pooling, prompts, lengths) | `--model`, `--pooling`, `--passage-prompt`, … | the model's own |
| faiss structure (factory string, inner product) | `--index-type Flat|HNSW32|IVF1024,PQ32…` | Flat |
| BM25 k1, b (Pyserini's BEIR "flat" setting) | `--k1`, `--b`                           | 0.9, 0.4 |
| BM25 variant (Kamphuis et al. 2020)        | `--bm25-method lucene|robertson|atire|bm25l|bm25+` | lucene |
| stopwords (bm25s lists)                    | `--stopwords en|none|de|…`              | en |
| BM25 tokens: bm25s's words, or also CJK/Thai characters and pairs (Lucene's CJK bigrams) | `--bm25-tokens words|multilingual` | multilingual (an existing index keeps its own) |
| encode batch                               | `--batch-size`                          | 32 |
| a multi-head model's heads, one sub-index each, one pass (BGE-M3: dense, lexical, colbert) | `--heads dense,sparse,colbert` (`lexical` = `sparse`; dense required) | every head the model has |
| sparse terms kept per doc                  | `--sparse-top-k`                        | the head's (a lexical head: all) |
| BM25 beside the model's heads (one index, the hybrid) | `--heads dense,bm25` (+ the BM25 flags) | off |
| the search's fusion defaults, recorded in the index | `--fusion`, `--norm`, `--weights` (per head), `--rrf-k`, `--depth` | none (search's own); an update keeps them |
| those defaults from a sweep's best row      | `--weights-from SWEEP --weights-by nDCG@10` | off |
| another index's version with other search defaults | `--copy-from IDX` (+ the fusion flags) | off |
| a new index from another's vectors where its model has the same weights (only changed docs encoded) | `--vectors-from IDX` | off |
| indexes of one corpus searched as one, their lists fused (an ensemble of models; a model and BM25) | `--fuse IDX1 IDX2 …` (+ the fusion flags: `--weights` one per member) | off |
| a query tower for the stored vectors (train `--passage-index`), recorded in the index | `--query-model` | the index's model; an update keeps it |
| dense resume checkpoint interval (docs)    | `--checkpoint-every`                    | 4096 |
| old versions kept (see below)              | `--keep`                                | 2 |
| shard of the corpus (stable hash of docid) | `--shard-id/--shard-num`, then `--merge` | one shard |

Heads: a model with a sparse head (SPLADE, or BGE-M3's lexical head) or BGE-M3's colbert head is indexed with every
head by default, in one pass over the corpus, as heads of one dense index (retrctl/indexes/heads/): the
colbert head's token vectors are kept as fp16, one flat array + per-doc offsets (indexes/multivector.py), and go
through the updates, resume and shard merges below with the vectors; the log gives each head's bytes per doc.
`--heads dense,bm25` adds the corpus's BM25 as a head (the bm25 backend's store, statistics recomputed over the
docs after every change), so a dense + BM25 hybrid is one index; `--weights` (and `--fusion`, `--norm`) record
how `search` fuses the heads by default.

Updates (pyserini#1964, faiss#3339): run again on an existing IDX and it is brought in line with the corpus by
content hash — new docs are added, changed docs re-encoded, docs no longer in the corpus deleted (`--no-delete`
keeps them); nothing is rewritten when nothing changed. Changing a setting that the stored data depends on
(model or its settings, or the model's weights: the manifest keeps a hash of its weight files, so a model dir
trained again under the same path is noticed; index type, BM25 settings) rebuilds from scratch, with a warning; `--rebuild` forces it
(also the way out of a damaged index: a missing or truncated file is named, exit 2).

Search defaults on an index already built: `retrctl index --copy-from IDX --weights 0.6 -o NEW` publishes IDX's
current version as NEW's next version (a new index when NEW does not exist) with the fusion flags given recorded
over IDX's: the files are shared (hard links; copies across file systems), no corpus is read and nothing is
encoded (the backend is opened to check the defaults against its heads). IDX is left as it is, so a Make
recipe keeps both as file targets. `--weights-from SWEEP` takes the weights (and the fusion settings) from the best
row of `retrctl eval A B --sweep … --json` (ties to the weight nearer 0.5), as `retrctl fuse --weights-from`
does; two heads take one weight w as w,1-w.

Fused: `retrctl index --fuse IDX1 IDX2 … --weights 0.35,0.35,0.3 -o OUT` publishes each index's current version as
a member of OUT (hard links, nothing encoded); `retrctl search OUT` searches every member with its own settings and
fuses their lists as `retrctl fuse` fuses their runs (Pyserini's hybrid searcher, saved). The members must hold the
same doc ids; OUT is not updated in place (update the members, then fuse again: retrctl/indexes/fused.py).

Layout and what is atomic (retrctl.indexes.store): IDX/versions/N/ are complete, immutable
indexes; IDX/index.json is a pointer naming the current one (plus a copy of its manifest). An update writes
versions/.N.tmp-PID, renames it to versions/N, then replaces the pointer with os.replace — the one atomic step.
A searcher resolves the pointer once and reads only that version, so it gets the old or the new index, never a
mix; a kill -9 at any point leaves the previous version current, and the next run sweeps the leftovers and
finishes. A version is deleted once `--keep` newer ones exist (default 2: the version a searcher just opened
survives the next whole update). IDX written by earlier retrctl (flat, no versions/) opens as it is; its first
update converts it.

Refusals: an existing `-o` must be recognisably a retrctl index (the pointer's format marker, or a flat retrctl
manifest) with nothing foreign in it; a project dir, a file, `/` are refused with exit 2 and left untouched.

Lock: `retrctl index` holds an flock on IDX/index.lock (with its pid) from start to publish; a second writer on the
same IDX exits 75 (EX_TEMPFAIL) naming the holder's pid. A lock left by a killed run is taken over with a warning.
A new IDX is built in a private directory beside it and renamed into place when complete: a killed first build
leaves no IDX (a Makefile target of it is not taken for done), and the next run sweeps the leftover.

Resume: dense encoding goes in chunks of `--checkpoint-every` docs (4096) saved under `IDX.partial/`; a killed run
restarted on the same corpus reuses the chunks whose docids and content hashes match (it logs how many docs came
from checkpoints), and the directory is removed on success.

Shards: `--shard-id i --shard-num n` indexes the docs whose docid hashes to shard i (e.g. one per GPU/machine);
`--shard-id 1-9` indexes those of shards 1 to 9; `retrctl index --merge IDX.0 IDX.1 … -o IDX` joins them (an IVF
is re-trained on the merged vectors, BM25 statistics are recomputed over the union).

Truncation: passages cut at the passage max length are counted and reported on stderr (ST#4060).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import click

from retrctl import distributed, records
from retrctl.distributed import RaySettings
from retrctl.errors import UsageError
from retrctl.hashing import shard, shard_ids
from retrctl.indexes import BACKENDS, DEFAULT_BACKEND, declared_flags
from retrctl.indexes.store import KEEP
from retrctl.options import encoder_overrides, flag_option, options, swept_fusion
from retrctl.stage import check_shard, progress, stage

log = logging.getLogger("retrctl.index")


# `index`'s fusion flags (the shared ones of fuse, eval and search) → the search knobs they become the defaults of
SEARCH_DEFAULTS = {"fusion": "fusion_method", "norm": "norm", "rrf_k": "rrf_k", "depth": "depth", "weights": "weights"}


class SettingsError(UsageError):
    """Inputs that cannot be indexed together (different encoders, overlapping shards)."""


def methods() -> dict:
    """The backends built from a corpus (``Index.from_corpus``): `--method`'s choices."""
    return {name: backend for name, backend in BACKENDS.items() if backend.from_corpus}


class BackendChoice(click.Choice):
    """--method: the names in BACKENDS when the flag is read or shown, so a backend registered after this module
    was imported (a plugin, a test) is a valid choice and listed by --help."""

    def __init__(self):
        super().__init__(tuple(methods()))

    @property
    def choices(self):
        return tuple(methods())

    @choices.setter
    def choices(self, _value):  # click.Choice.__init__ assigns it; the live registry wins
        pass


def index(docs: Iterable[dict], output: str | os.PathLike, *, model: str | None = None, method: str | None = None,
          batch_size: int = 32, delete: bool = True, rebuild: bool = False, keep: int = KEEP, meta: dict | None = None,
          encoder_settings: dict | None = None, search_defaults: dict | None = None, ray: RaySettings | None = None,
          query_model: str | None = None, vectors_from: str | os.PathLike | None = None, **backend_options) -> dict:
    """Build the index at ``output`` from doc records, or bring an existing one in line with them.

    ``backend_options``: the flags the registered backends declare (``retrctl.indexes.declared_flags``); the
    backend gets those it names in its ``flags``, an option left out (or None) taking the backend's default.
    ``ray``: encode on a Ray cluster's workers (retrctl/distributed.py); the checkpoints and the index are still
    written here, so a killed run resumes from ``output``.partial as without it.
    Holds ``output``'s writer lock throughout (records.BusyError when another writer has it) and publishes
    the result as a new version (``keep`` = versions that must supersede an old one before it is deleted).
    ``search_defaults``: fusion flags (fusion, norm, rrf_k, depth, weights) a multi-head index records for its
    searches (``Index.record_search_defaults``); those not given keep the updated index's recorded ones.
    ``query_model``: a query tower trained against the index's vectors (train --passage-index), recorded so that
    every search encodes queries with it (an update keeps a recorded one; a rebuild drops it).
    ``vectors_from``: another index whose stored vectors a new ``output`` starts from where they are this model's
    (``_seeded``): only the docs it lacks, or holds with another text, are encoded.
    Returns the counts {"added", "updated", "unchanged", "removed"}, "encoded" (docs run through the encoder,
    dense) and "rebuilt"/"written" flags.
    """
    from retrctl.indexes import declared_flags, store

    output = Path(output)
    if keep < 1:
        raise SettingsError("--keep must be at least 1")
    declared = declared_flags("index")
    for name, value in backend_options.items():
        if name not in declared:
            raise TypeError(f"index() got an unexpected keyword argument {name!r} (no index backend declares it)")
        if (problem := declared[name].check(value)) is not None:
            raise SettingsError(problem)
    options = {"batch_size": batch_size, **backend_options}
    with store.writer(output) as target:
        return _index(docs, output, target, model=model, method=method, delete=delete, rebuild=rebuild, keep=keep, meta=meta,
                      encoder_settings=encoder_settings, options=options, search_defaults=search_defaults or {}, ray=ray,
                      query_model=query_model, vectors_from=vectors_from)


def _index(docs, output: Path, target: Path, *, model, method, delete, rebuild, keep, meta, encoder_settings, options,
           search_defaults, ray, query_model=None, vectors_from=None) -> dict:
    """``target``: where store.writer has ``output`` written (itself, or for a new index a private sibling that is
    renamed to ``output`` when the writer's block ends)."""
    from retrctl.indexes import open_index

    workdir = output.with_name(output.name + ".partial")
    old = _current_or_none(output, rebuild)  # resolved once: the update reads only this version
    old_manifest = old.manifest if old else None
    method = method or (old_manifest or {}).get("backend") or DEFAULT_BACKEND
    if method not in BACKENDS:
        raise SettingsError(f"unknown method {method!r}")
    backend = BACKENDS[method]
    meta = meta or {}

    encoder = None
    if backend.needs_encoder:
        same = old_manifest if old_manifest and old_manifest.get("backend") == method else None
        if model is None and same is None:
            others = [name for name, other in methods().items() if not other.needs_encoder]
            raise SettingsError(f"a {method} index needs --model" + (f" (or --method {'/'.join(others)})" if others else ""))
        encoder = backend.encoder_for(model, same, **(encoder_settings or {}))
    elif model or encoder_settings:
        log.warning("--model and encoder flags are ignored by --method %s", method)
    # the others are other backends' flags; None (not given) leaves the backend's default
    options = {k: v for k, v in options.items() if k in backend.flags and v is not None}
    if old_manifest and old_manifest.get("backend") == method and not rebuild:
        options = backend.update_options(old_manifest, options)
    fresh = backend.create(encoder, **options)
    seeded = None
    if vectors_from is not None and old is not None:
        log.warning("--vectors-from %s: %s exists, and an update starts from its own vectors", vectors_from, output)
    elif vectors_from is not None and not backend.needs_encoder:
        raise SettingsError(f"--vectors-from: a {method} index stores no vectors")
    elif vectors_from is not None:
        seeded = _seeded(vectors_from, fresh, encoder)
    # an index with no docs is falsy: None tells a seeded start apart
    idx = seeded if seeded is not None else _reuse(output, old_manifest, fresh, rebuild,
                                                   lambda: open_index(old, encoder=encoder))
    idx.prepare_update(workdir, **options)
    recorded = dict(idx.search_defaults)
    if idx is fresh and old_manifest and old_manifest.get("search_defaults") and not search_defaults:
        log.warning("%s: the search defaults of the version replaced (%s) are not carried over; give them again",
                    output, old_manifest["search_defaults"])
    idx.record_search_defaults(search_defaults)  # checked before any doc is encoded
    recorded_query = getattr(idx, "query_desc", None)
    if query_model is not None:
        if not hasattr(idx, "record_query_model"):
            raise SettingsError(f"--query-model: a {method} index encodes no queries")
        idx.record_query_model(backend.encoder_for(query_model, None, **(encoder_settings or {})))

    before = dict(idx.meta)
    if ray is not None and not backend.needs_encoder:
        log.warning("--ray is ignored by --method %s (no model to run)", method)
        ray = None
    with distributed.workers(ray, encoder, "encode") as pool, idx.on_workers(pool):
        stats = idx.sync(docs, delete=delete) if idx is not fresh else idx.build(docs)
    idx.meta = {**idx.meta, **meta}
    changed = (stats["added"] or stats["updated"] or stats["removed"] or idx is fresh or seeded is not None or idx.meta != before
               or idx.search_defaults != recorded or getattr(idx, "query_desc", None) != recorded_query)
    log.info("%s index %s: %d docs (%d added, %d updated, %d unchanged, %d removed)", method, output, len(idx),
             stats["added"], stats["updated"], stats["unchanged"], stats["removed"])
    idx.report_update(stats, workdir)
    if changed:
        idx.save(output, keep=keep)
        log.info("published %s as version %s", output, _current_name(target))
    else:
        log.info("%s is up to date; left as it is", output)
    shutil.rmtree(workdir, ignore_errors=True)
    return {**stats, "encoded": idx.encoded, "rebuilt": idx is fresh, "written": bool(changed)}


def _seeded(source: str | os.PathLike, fresh, encoder):
    """The index ``source`` opened as the start of a new one, where its stored data is what ``fresh`` would store:
    the same backend and settings but for the model's path and weight files, and a model with ``encoder``'s weights
    (``encoded.other_weights``: also a model saved again elsewhere, as the guard saves the base it keeps). Its search
    defaults and query tower are not carried over. None, with the reason logged, where it cannot stand for
    ``encoder``'s vectors: the new index is then encoded in full."""
    from retrctl.indexes import open_index, store
    from retrctl.indexes.encoded import describe, other_weights
    from retrctl.models.config import passage_differences

    if not (Path(source) / store.MANIFEST).is_file():
        raise UsageError(f"{source}: not an index (no {store.MANIFEST})", flag="--vectors-from")
    version = store.resolve(source)
    want, have = _requested_settings(fresh), _held_settings(version.manifest)
    mine = describe(encoder)
    # the index's own settings (backend, structure, heads), then those of the encoder its vectors depend on
    diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k) and not k.startswith("encoder."))
    diff += [f"encoder.{k}" for k in passage_differences(version.manifest.get("encoder") or {}, mine, heads=True)]
    why = ", ".join(f"{k}: {have.get(k)!r} there, {want.get(k)!r} here" for k in diff) if diff else \
        other_weights(version.manifest, encoder)
    if why:
        log.info("--vectors-from %s: encoding every doc, its vectors are not this model's (%s)", source, why)
        return None
    idx = open_index(version, encoder=encoder)
    idx.encoder_desc, idx.meta, idx.search_defaults = mine, {}, {}
    if getattr(idx, "query_desc", None) is not None:
        idx.drop_query_model()
    log.info("starting from %s's vectors (version %s): its model has the same weights", source, version.name or "flat")
    return idx


def _current_or_none(output: Path, rebuild: bool):
    """The version to update (resolved once), or None for a new index; with --rebuild a damaged one is ignored."""
    from retrctl.indexes import store

    if not (output / store.MANIFEST).exists():
        return None
    try:
        return store.resolve(output)
    except records.RecordError as e:
        if not rebuild:
            raise
        log.warning("%s; --rebuild: building a new version", e)
        return None


def _current_name(directory: Path) -> str:
    from retrctl.indexes import store

    return store.resolve(directory).name or "(flat)"


def _requested_settings(fresh) -> dict:
    """What the stored data of the index ``fresh`` (new, empty) will depend on: its backend's content settings."""
    return {"backend": fresh.name, **fresh.content_settings(fresh.manifest())}


def _held_settings(manifest: dict) -> dict:
    """What a stored version's data depends on, from its manifest, keyed as ``_requested_settings``."""
    backend = BACKENDS.get(manifest.get("backend"))
    return {"backend": manifest.get("backend"),
            **(backend.content_settings(manifest) if backend else manifest.get("settings", {}))}


def _reuse(output: Path, old: dict | None, fresh, rebuild: bool, load):
    """The existing index when its stored settings equal the requested ones; else the fresh one (a rebuild)."""
    if old is None or rebuild:
        return fresh
    want, have = _requested_settings(fresh), _held_settings(old)
    if "encoder.weights" not in have:  # written before the weights were hashed: kept, as an update kept it then
        want.pop("encoder.weights", None)
    if want != have:
        diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
        log.warning("%s was built with other settings (%s): rebuilding from scratch", output,
                    ", ".join(f"{k}: {have.get(k)!r} -> {want.get(k)!r}" for k in diff))
        return fresh
    return load()


def merge(parts: list[str | os.PathLike], output: str | os.PathLike, keep: int = KEEP,
          search_defaults: dict | None = None) -> int:
    """Join shard indexes into one at ``output`` (``search_defaults``: as ``index``'s, over the first part's);
    returns the doc count."""
    from retrctl.indexes import open_index, store

    versions = [store.resolve(p) for p in parts]  # each part resolved once
    manifests = [v.manifest for v in versions]
    backends = {m.get("backend") for m in manifests}
    if len(backends) != 1:
        raise SettingsError(f"cannot merge different backends: {', '.join(sorted(map(str, backends)))}")
    shards = [m.get("shard") for m in manifests if m.get("shard")]
    if shards:
        nums = {s["num"] for s in shards}
        ids = sorted(i for s in shards for i in s.get("ids", [s.get("id")]))
        if len(nums) == 1 and ids != list(range(nums.pop())):
            log.warning("merging shards %s of %d: the merged index is not the whole corpus", ids, shards[0]["num"])
    with store.writer(output):
        first = open_index(versions[0])
        rest = [open_index(v, encoder=first.encoder) for v in versions[1:]]  # one encoder loaded, where there is one
        try:
            merged = type(first).merge([first, *rest])
        except ValueError as e:
            raise SettingsError(str(e)) from None
        merged.meta = {k: v for k, v in first.meta.items() if k != "shard"}
        merged.record_search_defaults(search_defaults or {})
        merged.save(output, keep=keep)
    log.info("merged %d indexes (%d docs) into %s", len(parts), len(merged), output)
    return len(merged)


def copy(source: str | os.PathLike, output: str | os.PathLike, keep: int = KEEP,
         search_defaults: dict | None = None) -> str:
    """Publish the current version of the index ``source`` as a new version of ``output`` (a new index, or the next
    version of an existing one), with ``search_defaults`` (as ``index``'s) recorded over ``source``'s: its files
    shared, no corpus read, nothing encoded. Returns the version published."""
    from retrctl.indexes import open_index, store

    version = store.resolve(source)
    idx = open_index(version, with_encoder=False)  # the backend checks the defaults against the heads it holds
    idx.record_search_defaults(search_defaults or {})
    manifest = {k: v for k, v in version.manifest.items() if k != "search_defaults"}
    if idx.search_defaults:
        manifest["search_defaults"] = idx.search_defaults
    name = store.publish_copy(version, output, manifest, keep=keep)
    log.info("published %s (version %s) as %s version %s%s", source, version.name or "flat", output, name,
             f" with search defaults {idx.search_defaults}" if idx.search_defaults else "")
    return name


def fuse(members: list[str | os.PathLike], output: str | os.PathLike, keep: int = KEEP,
         search_defaults: dict | None = None) -> int:
    """Publish the current version of each index ``members`` names as a member of a fused index at ``output``
    (retrctl/indexes/fused.py: searched as one, the members' lists fused), with ``search_defaults`` (as ``index``'s;
    weights one per member, in the order given) recorded: the files shared, nothing encoded. Returns the doc count."""
    from retrctl.indexes import fused, store

    if len(members) < 2:
        raise UsageError("--fuse needs two or more index directories")
    idx = fused.publish([store.resolve(m) for m in members], output, search_defaults or {}, keep=keep, with_encoder=False)
    log.info("fused %s into %s (%d docs)%s", ", ".join(map(str, members)), output, len(idx),
             f" with search defaults {idx.search_defaults}" if idx.search_defaults else "")
    return len(idx)


def backend_options() -> list[click.Option]:
    """The registered backends' `index` flags, read at each parse so a backend registered later brings its own."""
    return [flag_option(flag) for flag in declared_flags("index").values()]


@stage(index, writes="dir", atomic=False, more_options=backend_options)  # a versioned store: built and published by store.writer
@options("model", "encoder", "runtime", "batch_size", "shard", "input_format", "fusion", "weights", "weights_from", "ray")
@click.argument("inputs", nargs=-1)
@click.option("--method", type=BackendChoice(), help=f"Index backend: {', '.join(f'{n} ({b.summary})' for n, b in methods().items())}. "
              f"[default: {DEFAULT_BACKEND}, or the existing index's]")
@click.option("--delete/--no-delete", default=True, show_default=True, help="On update, delete docs no longer in the corpus.")
@click.option("--rebuild", is_flag=True, help="Build from scratch even if -o holds an up-to-date-able index.")
@click.option("--keep", type=click.IntRange(min=1), help="Delete an old version once this many newer ones exist "
              "(2: a searcher that opened the previous version is not pulled from under it).")
@click.option("--merge", "merge_", is_flag=True, help="INPUTS are index dirs (e.g. shards) to merge into -o.")
@click.option("--fuse", "fuse_", is_flag=True, help="INPUTS are index dirs of one corpus, published as the members of "
              "one fused index at -o: a search searches each and fuses their lists (--weights one per member, in "
              "order; --weights-from, --fusion, --norm recorded as its defaults). Files shared, no model loaded.")
@click.option("--copy-from", metavar="IDX", help="Publish IDX's current version as -o's new version with the fusion flags "
              "given as its search defaults: its files shared (hard links), no corpus read, no model loaded.")
@click.option("--vectors-from", metavar="IDX", help="A new index starts from IDX's stored vectors where IDX's model "
              "has the same weights as --model (tensor for tensor; same settings): only docs IDX lacks or holds with "
              "another text are encoded. Otherwise every doc is encoded, and the log says why.")
@click.option("--query-model", help="A query tower trained against this index's vectors (train --passage-index): "
              "searches encode queries with it, the docs stay the index model's. Dense (+ bm25) indexes.")
def command(inputs, output, merge_, fuse_, shard_id, shard_num, input_format, weights_from, weights_by, copy_from, **opts):
    """Build (or update) a dense, learned-sparse or BM25 index of a corpus (JSONL/Parquet/BEIR folder, '-' = stdin)."""
    ctx = click.get_current_context()
    if weights_from is not None:  # the sweep's weights, and its fusion settings where no flag sets them
        opts.update(swept_fusion(ctx, weights_from, weights_by))
    # the fusion flags: a multi-head index's search defaults (a search's own flags win)
    defaults = {name: opts.pop(key) for name, key in SEARCH_DEFAULTS.items() if opts.get(key) is not None}
    for key in SEARCH_DEFAULTS.values():
        opts.pop(key, None)
    if copy_from is not None or fuse_:
        allowed = {"copy_from", "fuse_", "output", "keep", "weights_from", "weights_by", "log_level", "quiet",
                   *SEARCH_DEFAULTS.values()}
        stray = [p.opts[0] for p in ctx.command.get_params(ctx) if isinstance(p, click.Option) and p.name not in allowed
                 and p.name in ctx.params
                 and ctx.get_parameter_source(p.name) is click.core.ParameterSource.COMMANDLINE]
        if copy_from is not None and fuse_:
            stray.insert(0, "--fuse")
        what = "--copy-from publishes IDX's version" if copy_from is not None else "--fuse publishes the INPUTS' versions"
        if stray or (inputs and copy_from is not None):
            raise UsageError(f"{what} as it is: {', '.join(stray) or 'a corpus'} cannot apply (only the fusion flags "
                             "and --keep)")
        if copy_from is not None:
            copy(copy_from, output, keep=opts["keep"], search_defaults=defaults)
        else:
            fuse(list(inputs), output, keep=opts["keep"], search_defaults=defaults)
        return
    if merge_:
        if len(inputs) < 2:
            raise UsageError("--merge needs two or more index directories")
        merge(list(inputs), output, keep=opts["keep"], search_defaults=defaults)
        return
    if len(inputs) > 1:
        raise UsageError("give one corpus (or --merge with index directories)")
    check_shard(shard_id, shard_num)
    path = inputs[0] if inputs else "-"
    meta = {}
    if path != "-":
        meta["source"] = os.path.abspath(records.resolve(path, "doc"))
    if shard_num > 1:
        ids = shard_ids(shard_id)
        meta["shard"] = {"id": ids.start, "num": shard_num} if len(ids) == 1 else {"ids": list(ids), "num": shard_num}
    docs = progress(shard(records.read(path, "doc", input_format), shard_id, shard_num, "docid"), desc="index", unit="doc")
    settings = encoder_overrides(opts)
    ray = distributed.pop_settings(opts)
    if ray is not None:  # this copy only describes the model; the workers' copies move to their GPUs
        settings.setdefault("device", "cpu")
    index(docs, output, meta=meta, encoder_settings=settings, search_defaults=defaults, ray=ray, **opts)
