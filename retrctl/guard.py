"""The guard: a model trained without labels is delivered only when it beats its base on held-out pseudo-queries.

Training on pseudo-queries (crops, generated queries) labelled by a teacher can make a retriever worse on the
corpus (Tamber et al. 2025; users of GPL report it: UKPLab/gpl#38). Without judgements the only evidence is a
held-out slice of the same pseudo-data, so:

1. ``hold_out`` sets aside the groups whose first positive is a held-out document: shard 0 of ``shards`` by a
   stable hash of its id, the documents that ``--shard-id 0 --shard-num N`` gives crop and qgen, so a pipeline can
   make more queries for exactly that slice. Training never sees those documents as positives, nor their queries
   (they may still appear as another query's negative).
2. After training, ``select`` scores candidates on the held-out queries: the base model (α = 0, its weights
   exactly), the trained model (α = 1) and WiSE-FT interpolations α·trained + (1 − α)·base between them
   (Wortsman et al. 2022, "Robust fine-tuning of zero-shot models", arXiv:2109.01903), each by nDCG@10 of a
   query's positives among a pool of documents (``pool``): the whole corpus when it has at most ``MAX_POOL``
   documents, else each held-out query's top hits from BM25 and from the base model over the whole corpus
   (LARMOR's pooling; searched here, or read from a pipeline's runs of them). The teacher's negatives are not the
   pool: the trained model learnt to push exactly those down, so a pool of them would tilt the test its way.
3. The base is kept unless a candidate beats it with a paired t-test p below ``level`` divided by the number of
   candidates tried (Bonferroni): the margin that the held-out set's noise justifies. Among those that pass,
   the best mean wins.
4. Some held-out queries may veto (``veto``: the held-out documents' generated queries, which look like a user's):
   a candidate whose mean on them is below the base's is refused, whatever the whole set says. Every held-out
   query decides (crops add the power a few dozen generated queries lack), and the queries most like real ones
   can still refuse a model that only learnt the crops' task (crops copy their document's words and flatter a
   model trained on crops).

What it promises, and what not: the delivered model is the base, or a candidate that was significantly better
than the base on the held-out pseudo-queries and not worse on the veto queries. That is a paired test on
pseudo-queries of held-out documents, not a measurement on real queries: a candidate can pass and still be worse
on a user's queries (where they differ from the pseudo-queries, or by the test's false positives, about ``level``
of the time when there is no real gain), and a real gain too small for the held-out set is refused. Above
``MAX_POOL`` documents a candidate's own top hits outside BM25's and the base's are not in the pool (finding
them costs one encode of the corpus per candidate), which can flatter a candidate that ranks such documents high.

One stderr line states the decision and its evidence; ``guard.json`` in the model directory keeps the table. Where
the guard encoded the pool with the model it delivers, that encode can be kept (``pool_index``: a dense index of the
pool) for ``retrctl index --vectors-from`` to start the delivered model's index from: the pool's documents are not
encoded a second time.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable
from pathlib import Path

from retrctl.hashing import in_shard, stable_int

log = logging.getLogger("retrctl.guard")

FILE = "guard.json"
MEASURE = "nDCG@10"
DEPTH = 100  # retrieval depth of the held-out queries in the pool
MAX_QUERIES = 200  # held-out queries scored (the first by hash): the cost is one encode of their pool per candidate
MAX_POOL = 2000  # documents in the pool: at ~25 docs/s on 2 CPU cores, under 1.5 min per candidate


def hold_out(groups: Iterable[dict], shards: int) -> tuple[list[dict], list[dict]]:
    """(training groups, held-out groups): a group is held out when its first positive is in shard 0 of ``shards``."""
    train, dev = [], []
    for g in groups:
        pos = g.get("positive_document_ids") or []
        (dev if pos and in_shard(pos[0], 0, shards) else train).append(g)
    return train, dev


def interpolate(base: dict, trained: dict, alpha: float) -> dict:
    """α·trained + (1 − α)·base for every floating tensor both state dicts hold with one shape; the rest (integer
    buffers, parameters of a head the base lacks) is the trained model's."""
    out = {}
    for k, t in trained.items():
        b = base.get(k)
        if b is not None and b.shape == t.shape and t.is_floating_point():
            out[k] = t if alpha == 1 else (b.to(t.dtype) if alpha == 0 else alpha * t + (1 - alpha) * b.to(t.dtype))
        else:
            out[k] = t
    return out


def pool(dev: list[dict], corpus: dict[str, dict], rankings: Iterable[dict] = (), cap: int = MAX_POOL) -> dict[str, dict]:
    """The documents the held-out queries are searched among. A corpus of at most ``cap`` documents is the pool
    itself: every candidate's own top hits are in it. A larger one gives a pool as LARMOR builds one (Khramtsova
    et al., SIGIR 2024): every positive of the scored groups, then rank by rank each of ``rankings``' hits for
    each held-out query (``{query_id: [(doc_id, score), …]}`` best first, one per system searched over the whole
    corpus), so the pool holds every system's top k of every query for the largest k that fits ``cap`` (the
    positives are kept even past it, so each query can be answered). The pool is not the teacher's negatives:
    those are what training pushed down, and a pool of them favours the trained model."""
    if len(corpus) <= cap:
        return dict(corpus)
    taken = dict.fromkeys(sorted({d for g in dev for d in g["positive_document_ids"] if d in corpus}))
    lists = [[ranking.get(g["query_id"], ()) for g in dev] for ranking in rankings]
    for rank in range(max((len(hits) for hs in lists for hits in hs), default=0)):
        for hs in lists:
            for hits in hs:
                if len(taken) >= cap:
                    return {d: corpus[d] for d in taken}
                if rank < len(hits) and hits[rank][0] in corpus:
                    taken.setdefault(hits[rank][0])
    return {d: corpus[d] for d in taken}


def rankings(corpus: dict[str, dict], queries: list[dict], base, batch_size: int, depth: int = DEPTH,
             stored: tuple[list[str], object] | None = None) -> list[dict]:
    """BM25's and the ``base`` encoder's top ``depth`` of each query over the whole corpus (one encode of it, what
    indexing it costs, unless ``stored`` gives the base's vectors of it: doc ids, vectors): the systems a pool of a
    large corpus is made from. A candidate's own top hits would cost one more encode of the corpus each, so they
    enter the pool only when the corpus is the pool."""
    from retrctl.indexes.bm25 import BM25Index
    from retrctl.indexes.dense import DenseIndex

    def searched(idx):
        idx.build({"docid": d, **doc} for d, doc in corpus.items())
        return idx.search(queries, depth)

    dense = search_stored(base, stored, queries, batch_size, depth) if stored else searched(DenseIndex(base, "Flat", batch_size))
    return [searched(BM25Index.create()), dense]  # the index stage's defaults


def scored(dev: list[dict], veto: Iterable[str] = ()) -> list[dict]:
    """The held-out groups the guard scores: MAX_QUERIES at most, those of the ``veto`` query ids first, then the
    others, each in the order of a stable hash of their query id."""
    veto = set(veto)
    return sorted(dev, key=lambda g: (g["query_id"] not in veto, stable_int("guard-queries", g["query_id"])))[:MAX_QUERIES]


def queries_and_qrels(dev: list[dict]) -> tuple[list[dict], dict[str, dict[str, int]]]:
    queries = [{"query_id": g["query_id"], "query_text": g["query_text"]} for g in dev]
    qrels = {g["query_id"]: {d: 1 for d in g["positive_document_ids"]} for g in dev}
    return queries, qrels


def score(encoder, docs: dict[str, dict], queries: list[dict], qrels: dict, batch_size: int, built: list | None = None):
    """metrics.Result of one candidate: the pool indexed exactly (Flat), the queries searched to DEPTH; ``built``
    receives that index."""
    from retrctl import metrics
    from retrctl.indexes.dense import DenseIndex

    idx = DenseIndex(encoder, "Flat", batch_size)
    idx.build({"docid": d, **doc} for d, doc in docs.items())
    if built is not None:
        built.append(idx)
    return metrics.evaluate(idx.search(queries, DEPTH), qrels, [MEASURE])


def search_stored(encoder, stored: tuple[list[str], object], queries: list[dict], batch_size: int,
                  depth: int = DEPTH) -> dict:
    """The queries encoded and searched exactly among stored vectors (``stored``: doc ids, vectors) to ``depth``:
    ``{query_id: [(doc_id, score), …]}`` best first; no passage is encoded."""
    import numpy as np

    docids, vectors = stored
    q = encoder.encode([x["query_text"] for x in queries], kind="query", batch_size=batch_size)
    scores = q @ vectors.T
    top = np.argsort(-scores, axis=1, kind="stable")[:, :min(depth, len(docids))]
    return {x["query_id"]: [(docids[j], float(scores[i, j])) for j in top[i]] for i, x in enumerate(queries)}


def score_stored(encoder, stored: tuple[list[str], object], queries: list[dict], qrels: dict, batch_size: int):
    """metrics.Result of one candidate searched among stored vectors (``search_stored``): a query tower among its
    dense index's, every doc of the index; the base among its own index's vectors of the pool."""
    from retrctl import metrics

    run = search_stored(encoder, stored, queries, batch_size)
    return metrics.evaluate({q: dict(hits) for q, hits in run.items()}, qrels, [MEASURE])


def base_index_checked(directory: str | Path, base_model: str, corpus: dict[str, dict]) -> None:
    """``UsageError`` unless ``directory`` is a dense index built by a model with ``base_model``'s weights
    (``encoded.other_weights``) over ``corpus``'s texts (every doc in it, with the same content hash): what lets the
    guard read the base's vectors there (``select`` compares the settings they were encoded with)."""
    from retrctl import records
    from retrctl.errors import UsageError
    from retrctl.indexes import base, store
    from retrctl.indexes.encoded import other_weights
    from retrctl.models import Encoder

    version = store.resolved(directory)
    manifest = version.manifest
    built_by = (manifest.get("encoder") or {}).get("model")
    why = (f"a {manifest.get('backend')} index {f'built by {built_by}' if built_by else 'with no model'}"
           if manifest.get("backend") != "dense" else other_weights(manifest, Encoder.load(base_model, device="cpu")))
    if why:
        raise UsageError(f"{directory}: {why}; the guard reads the base's vectors from a dense index built by --model "
                         f"{base_model}", flag="--guard-base-index")
    held = dict(zip(*base.read_docids(version.path), strict=True))
    for d, doc in corpus.items():
        if held.get(d) != records.content_hash(doc.get("title") or "", doc["text"]):
            why = "is not in it" if d not in held else "has another text there"
            raise UsageError(f"{directory}: --corpus doc {d!r} {why}: index the corpus with --model {base_model} "
                             "(retrctl index CORPUS --model …)", flag="--guard-base-index")


def decide(results: dict[float, object], level: float = 0.05, veto: Iterable[str] = ()) -> dict:
    """The decision from each candidate's metrics.Result, keyed by α (0 = the base): the base unless a candidate
    beats it at p < level / (candidates tried) and does not score below it on the ``veto`` queries (ids among
    the scored ones); then the best such candidate by mean."""
    from retrctl import metrics

    base = results[0.0]
    veto = sorted(set(veto) & base.per_query.keys())
    rows = []
    for a in sorted(results):
        r = results[a]
        row = {"alpha": a, MEASURE: round(r.mean[MEASURE], 6), "gain": round(r.mean[MEASURE] - base.mean[MEASURE], 6),
               "p": 1.0 if a == 0.0 else metrics.paired_ttest(base, r)[MEASURE]}
        if veto:
            row["veto_gain"] = round(sum(r.per_query[q][MEASURE] - base.per_query[q][MEASURE] for q in veto) / len(veto), 6)
        rows.append(row)
    pick, threshold = choose(rows, level)
    return {"pick": pick, "threshold": threshold, "level": level, "queries": len(base.per_query),
            "veto_queries": len(veto), "candidates": rows, "measure": MEASURE}


def choose(rows: list[dict], level: float) -> tuple[float, float]:
    """(the α picked, the threshold) from candidate rows as guard.json keeps them (α 0 = the base): the candidates
    that gain, at p < level / (candidates tried), and do not lose on the veto queries; the best mean among them."""
    tried = [r for r in rows if r["alpha"] != 0.0]
    threshold = level / max(len(tried), 1)
    winners = [(r[MEASURE], r["alpha"]) for r in tried
               if r["gain"] > 0 and r["p"] < threshold and r.get("veto_gain", 0.0) >= 0]
    return (max(winners)[1] if winners else 0.0), threshold


def describe(decision: dict) -> str:
    """The one line a user reads: what was delivered and why."""
    rows = {r["alpha"]: r for r in decision["candidates"]}
    base, pick = rows[0.0], rows[decision["pick"]]
    evidence = ", ".join(f"α={a:g} {r[MEASURE]:.4f}" + ("" if a == 0 else f" (p={r['p']:.3g})") for a, r in rows.items())
    refused = [a for a, r in rows.items() if a != 0 and r["gain"] > 0 and r["p"] < decision["threshold"]]
    if decision["pick"] == 0.0 and refused:
        verdict = "kept the base model: the veto queries refused " + ", ".join(f"α={a:g}" for a in refused)
    elif decision["pick"] == 0.0:
        verdict = "kept the base model: no candidate beat it beyond the held-out set's noise"
    else:
        gain = f"{pick[MEASURE] - base[MEASURE]:+.4f} over the base"
        delivered = decision.get("delivered", decision["pick"])
        verdict = (f"delivered α={delivered:g} ({gain})" if delivered == decision["pick"] else
                   f"delivered α={delivered:g}, the trained model (α={decision['pick']:g} passed, {gain})")
    vetoes = ""
    if decision.get("veto_queries"):
        vetoes = (f"; change on the {decision['veto_queries']} veto queries: "
                  + ", ".join(f"α={a:g} {r['veto_gain']:+.4f}" for a, r in rows.items() if a != 0))
    return (f"{verdict}; held-out {MEASURE} over {decision['queries']} queries: {evidence}; "
            f"threshold p < {decision['threshold']:.3g}{vetoes}")


def deliver_base(model_dir: str | Path, base_model: str, known_items: dict, keep: str | Path | None = None,
                 pool_index: str | Path | None = None) -> dict:
    """Nothing trained: ``base_model`` as it is, written to ``model_dir`` (and to ``keep``, in place of a trained
    model) where a known-item verdict (``fusion.known_items_of``) says it does not read the corpus, with guard.json
    recording that verdict. Pseudo-queries in a language the base cannot read do not teach it the language
    (bench/RESULTS.md, "Known items": the lists trained there added nothing). No pool is encoded: a ``pool_index``
    of an earlier run is removed."""
    from retrctl import records
    from retrctl.models import Encoder

    keep_pool(pool_index, None)
    decision = {"pick": 0.0, "delivered": 0.0, "trained": False, "known_items": known_items, "queries": 0,
                "candidates": [], "measure": MEASURE, "base_model": str(base_model)}
    enc = Encoder.load(base_model, device="cpu")
    if keep is not None:
        with records.atomic_dir(keep, resume=False) as tmp:
            enc.save(tmp)
    with records.atomic_dir(model_dir, resume=False) as tmp:
        enc.save(tmp)
        (Path(tmp) / FILE).write_text(json.dumps(decision, indent=1) + "\n", encoding="utf-8")
    log.info("kept the base model untrained: it does not read the corpus (known items: nDCG@10 %.4f against the "
             "last run's %.4f over %d queries, below half)", known_items["dense"], known_items["last"],
             known_items["queries"])
    return decision


def select(model_dir: Path, base_model: str, dev: list[dict], corpus: dict[str, dict], *, alphas: list[float],
           seed: int, batch_size: int = 32, level: float = 0.05, veto: Iterable[str] = (),
           keep: str | Path | None = None, passage_index: str | Path | None = None, deliver: str = "pick",
           pool_runs: list[dict] | None = None, base_index: str | Path | None = None,
           pool_index: str | Path | None = None) -> dict:
    """Score the base, the trained model in ``model_dir`` and their interpolations on the held-out groups; write
    the pick's weights into ``model_dir`` (unless it is the trained model) and guard.json beside them. ``veto``:
    query ids whose held-out groups may refuse a candidate (``decide``). ``keep``: a directory that receives the
    trained model (α = 1) whatever the pick, to audit the decision. ``deliver``: "pick" writes the candidate that
    passed, "trained" the trained model itself (for an ensemble with the base: the output-space counterpart of the
    interpolation that passed); the base when none passed. ``passage_index``: the candidates are query
    towers of that dense index (train --passage-index), each scored by its held-out queries searched among the
    index's stored vectors (``score_stored``: the whole corpus, no passage encoded) instead of a pool it encodes.
    ``pool_runs``: rankings of the held-out queries over the whole corpus (``{query_id: [(doc_id, score), …]}``) that
    make the pool of a corpus above ``MAX_POOL`` instead of ``rankings`` (a pipeline's own BM25 and base-model runs:
    the same pool without encoding the corpus again). ``base_index``: a dense index of the corpus built by the base
    model (``base_index_checked``): the base (α = 0) is scored on its stored vectors of the pool, and searched there
    for a pool of its top hits, instead of encoding them again; the other candidates encode the pool as before.
    ``pool_index``: a directory that receives the delivered candidate's encode of the pool as a dense index
    (``keep_pool``), where the guard encoded one for it (not a query tower's, nor the base's stored vectors); an
    earlier run's is removed where it did not."""
    import shutil

    import torch

    from retrctl import records
    from retrctl.indexes import store
    from retrctl.indexes.dense import stored_vectors
    from retrctl.models import Encoder
    from retrctl.models.config import passage_differences

    veto = set(veto)
    dev = scored(dev, veto)
    queries, qrels = queries_and_qrels(dev)
    if len(queries) < 2:
        raise ValueError(f"the guard needs at least 2 held-out queries, got {len(queries)}: use fewer --guard-shards "
                         "or give more groups")
    enc = Encoder.load(model_dir, device="cpu")
    trained = {k: v.detach().clone() for k, v in enc.state_dict().items()}
    base_state = Encoder.load(base_model, device="cpu").state_dict()
    systems, source, base_measure, stored = [], "corpus", None, None
    built: list | None = [] if pool_index is not None else None  # each candidate's encode of the pool, for pool_index
    if passage_index is not None:  # query towers over the index's stored vectors: the pool is the whole index
        _, docids, vectors = stored_vectors(passage_index)
        docs = dict.fromkeys(docids)
        measure, source = functools.partial(score_stored, stored=(docids, vectors)), "index"
    else:
        if base_index is not None:  # its vectors stand for the base's only if the passages were encoded as here
            version = store.resolved(base_index)
            differ = passage_differences(version.manifest["encoder"], enc.describe())
            if differ:
                log.warning("%s was built with other %s than the candidates encode with: the base is encoded too",
                            base_index, ", ".join(differ))
            else:
                _, docids, vectors = stored_vectors(version)
                stored = (docids, vectors)
        if len(corpus) > MAX_POOL and pool_runs:  # pooled from the given runs' top hits
            systems, source = pool_runs, "the given runs' top hits"
        elif len(corpus) > MAX_POOL:  # pooled from BM25's and the base's top hits over the whole corpus
            enc.load_state_dict(interpolate(base_state, trained, 0.0))
            with torch.inference_mode():
                systems, source = rankings(corpus, queries, enc, batch_size, stored=stored), "bm25+base top hits"
        docs = pool(dev, corpus, systems, MAX_POOL)
        measure = functools.partial(score, docs=docs, built=built)
        if stored is not None:  # the base's vectors of the pool, as stored: the pool is encoded for the others only
            row = {d: i for i, d in enumerate(stored[0])}
            base_measure = functools.partial(score_stored, stored=(list(docs), stored[1][[row[d] for d in docs]]))
    log.info("%d held-out queries (%d may veto), a pool of %d docs, candidates α = 0%s, %s",
             len(queries), len(veto & qrels.keys()), len(docs), f" (stored in {base_index})" if base_measure else "",
             ", ".join(f"{a:g}" for a in alphas))
    results, encoded = {}, {}
    for a in [0.0, *alphas]:
        enc.load_state_dict(interpolate(base_state, trained, a))
        with torch.inference_mode():
            results[a] = (base_measure if a == 0 and base_measure else measure)(enc, queries=queries, qrels=qrels,
                                                                               batch_size=batch_size)
        if built:  # empty where the candidate encoded no pool (the base on its stored vectors)
            encoded[a] = built.pop()
        log.info("α=%g %s %.4f", a, MEASURE, results[a].mean[MEASURE])
    decision = decide(results, level, veto)
    decision["delivered"] = 1.0 if deliver == "trained" and decision["pick"] > 0 else decision["pick"]
    decision.update(alphas=alphas, pool_docs=len(docs), pool=source, base_model=str(base_model))
    if base_measure is not None:
        decision["base_vectors"] = str(base_index)
    if keep is not None:  # written beside, then renamed: a half-written copy is never mistaken for a model
        with records.atomic_dir(keep, resume=False) as tmp:
            shutil.copytree(model_dir, tmp, ignore=shutil.ignore_patterns("checkpoints", "teacher", "*.tmp"),
                            dirs_exist_ok=True)
    if decision["delivered"] != 1.0:
        enc.load_state_dict(interpolate(base_state, trained, decision["delivered"]))
        enc.save(model_dir)
    (Path(model_dir) / FILE).write_text(json.dumps(decision, indent=1) + "\n", encoding="utf-8")
    keep_pool(pool_index, encoded.get(decision["delivered"]), enc)
    log.info("%s", describe(decision))
    return decision


def keep_pool(directory: str | Path | None, idx, encoder=None) -> None:
    """The delivered model's encode of the pool (``idx``, the dense index ``score`` built with it) published at
    ``directory``, which ``index --vectors-from`` starts from: its manifest describes ``encoder`` (loaded from the
    model directory) anew, so that it records the weights of the files now there (the delivered model's, written
    after ``idx`` was built). An earlier run's is removed first, and none is written without ``idx``."""
    import shutil

    from retrctl.indexes.encoded import describe as describe_encoder

    if directory is None:
        return
    shutil.rmtree(directory, ignore_errors=True)
    if idx is None:
        return
    idx.encoder_desc = describe_encoder(encoder)
    idx.save(directory)
    log.info("kept the delivered model's vectors of the pool's %d docs in %s", len(idx), directory)
