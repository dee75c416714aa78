"""mine: hard negatives for queries, written as training groups.

Method: retrieve top-k candidates per query, keep known positives (and optionally ranks 1..m as positives), sample
negatives from a rank range, and drop likely false negatives. As in DRAMA (Ma et al. 2025, arXiv:2502.18460,
§3.2: top-ranked docs of a strong retriever as positives, negatives sampled further down the list), FlagEmbedding's
hn_mine (`range_for_sampling`, Xiao et al. 2023, C-Pack, arXiv:2309.07597) and sentence-transformers'
`mine_hard_negatives` (absolute/relative margin to the positive's score; Moreira et al. 2024, NV-Retriever,
arXiv:2407.15831, "positive-aware" mining).

| knob (source)                                          | flag                         | default |
|--------------------------------------------------------|------------------------------|---------|
| retriever: dense model, `bm25`, `hybrid`, index, run   | `--retriever` (+ `--model`)  | —       |
| retrieval depth                                        | `--top-k`                    | end of the negative range |
| positives = ranks 1..m (DRAMA m=10)                    | `--positive-ranks`           | 0 (known positives only) |
| known positives: crop/qgen `source_docid`, judgments   | `--source-positives`, `--qrels` | on   |
| rank range negatives are sampled from (FlagEmbedding)  | `--negative-range`           | 30-100  |
| negatives per group (FlagEmbedding/Tevatron: 7)        | `--num-negatives`            | 7       |
| absolute margin: drop neg if s_neg > s_pos - margin    | `--margin`                   | off     |
| relative margin: drop if s_neg > s_pos * (1 - rel)     | `--relative-margin`          | off     |
| sampling                                               | `--seed`                     | 0       |

False-negative guards, in this order (the first that applies is the skip reason counted on stderr): a candidate
that is a positive of the query (judged, source or rank positive) by id; one missing from the corpus; one whose
normalized text (NFKC, casefolded, whitespace collapsed) equals a positive's (the same passage under another id,
FlagEmbedding#464); a text duplicate of a better-ranked candidate (negatives are deduped); then the margins. s_pos is the lowest score among the query's positives: a candidate scoring near any positive is suspect.
A positive the retriever did not return within top-k is scored exactly when the backend can (dense: the query
vector against the cached doc vector); otherwise its score is unknown and the score at rank top-k, an upper bound
on it, is the margin reference, and the group's `positive_scores` is null.

Determinism: candidates are ordered by (score desc, docid asc) whatever the backend returned (TREC runs order
ties by docid descending), the depth is exactly top-k for every backend (ST#3872), and the negatives of a query
are sampled with a generator seeded from (seed, query_id), then listed in rank order. Sharding by query id
(`--shard-id/--shard-num`) therefore concatenates to the output of one run.

Memory: queries are processed `--batch-size` at a time (ST#3164 materialized queries x corpus); score statistics
are kept in bounded reservoirs. Retrievers (bm25, dense with cached corpus vectors, hybrid RRF, index, run) are
retrctl/retrievers.py; with `hybrid` the fused scores are RRF scores, so margins apply to them.

Judgments none of whose query ids is among the queries are the wrong file for them: exit 2 after the last query
(nothing written) unless `--allow-empty`; some unknown query ids are a counted warning.

Every judged positive of a query is written (not only the first, tevatron#107), so training can mask in-batch
candidates that share an id or text with any of them.

Output (`--group-format`): `tevatron` = the canonical group {query_id, query_text, positive_document_ids,
negative_document_ids, positive_scores, negative_scores}; `tevatron-legacy` ({docid,title,text} passages);
`flagembedding` ({query, pos, neg} texts); `triplets` (sentence-transformers {anchor, positive, negative}, one
row per positive x negative). Passage text is "title text" as the dense index encodes it.

Deviations: FlagEmbedding's range "2-200" is a 0-based slice (ranks 3..200); ours is 1-based inclusive ranks.
Groups that fall short of --num-negatives are written anyway (counted exactly, per group, ST#3504); no random
fill-up from the corpus (FlagEmbedding#464 showed it picks positives). No cross-encoder check yet.
"""

from __future__ import annotations

import contextlib
import logging
import random
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator

import click
import numpy as np

from retrctl import distributed, records
from retrctl.errors import UsageError
from retrctl.hashing import in_shard, stable_rng
from retrctl.options import check_range, encoder_overrides, options, parse_range, renamed
from retrctl.retrievers import open_retriever
from retrctl.stage import stage

log = logging.getLogger("retrctl.mine")

FORMATS = ("tevatron", "tevatron-legacy", "flagembedding", "triplets")
REASONS = ("positive", "positive_text", "not_in_corpus", "duplicate", "margin", "relative_margin")


def norm_text(doc: dict) -> str:
    text = doc["text"] if doc["text"].strip() else doc.get("title", "")
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


class Dist:
    """Count, exact min/max and quartiles from a bounded, seeded reservoir (memory does not grow with queries)."""

    def __init__(self, cap: int = 100_000):
        self.n, self.cap, self.sample, self.rng = 0, cap, [], random.Random(0)
        self.lo, self.hi = float("inf"), float("-inf")

    def add(self, x: float) -> None:
        self.n += 1
        self.lo, self.hi = min(self.lo, x), max(self.hi, x)
        if len(self.sample) < self.cap:
            self.sample.append(x)
        elif (j := self.rng.randrange(self.n)) < self.cap:
            self.sample[j] = x

    def __str__(self) -> str:
        if not self.n:
            return "n=0"
        q1, med, q3 = np.percentile(self.sample, [25, 50, 75])
        return f"n={self.n} min={self.lo:.4g} q1={q1:.4g} median={med:.4g} q3={q3:.4g} max={self.hi:.4g}"


def _rng(seed: int, qid: str) -> random.Random:
    return stable_rng(seed, qid)


def mine(queries: Iterable[dict], *, corpus: dict[str, dict], retriever, qrels: dict | None = None,
         top_k: int | None = None, positive_ranks: int = 0, source_positives: bool = True,
         negative_range: str = "30-100", num_negatives: int = 7, margin: float | None = None,
         relative_margin: float | None = None, seed: int = 0, batch_size: int = 64, group_format: str = "tevatron",
         allow_empty: bool = False, qrels_path: str = "qrels", stats: dict | None = None) -> Iterator[dict]:
    """Yield one training group per query with a positive. ``stats`` (a dict), when given, receives the counters.

    Judgments none of whose query ids is among the queries are the wrong file: RecordError (naming ``qrels_path``)
    after the last query, so an atomic writer leaves nothing, unless ``allow_empty``."""
    lo, hi = parse_range(negative_range, "negative range")
    depth = top_k or max(hi, positive_ranks)
    if depth < hi:
        log.warning("--top-k %d is shorter than the negative range %s: sampling from ranks %d-%d", depth, negative_range, lo, depth)
    if group_format not in FORMATS:
        raise ValueError(f"group format must be one of {FORMATS}, got {group_format!r}")
    if num_negatives < 0 or positive_ranks < 0 or batch_size < 1:
        raise ValueError("num_negatives and positive_ranks must be >= 0, batch_size >= 1")
    qrels = qrels or {}
    st = stats if stats is not None else {}
    st.update(Counter(queries=0, groups=0, no_positive=0, empty_query=0, short_groups=0, missing_negatives=0,
                      positives_not_retrieved=0, positives_unscored=0, positive_not_in_corpus=0, eligible=0,
                      kept=0, **{f"skip_{r}": 0 for r in REASONS}))
    dists = {"positive": Dist(), "kept": Dist(), "skipped": Dist(), **{r: Dist() for r in ("margin", "relative_margin")}}
    seen_q: set[str] = set()
    for chunk in records.batched(queries, batch_size):
        st["queries"] += len(chunk)
        seen_q.update(q["query_id"] for q in chunk)
        live = [q for q in chunk if q["query_text"].strip()]
        st["empty_query"] += len(chunk) - len(live)
        ranked = retriever.search(live, depth) if live else {}
        for q in live:
            qid = q["query_id"]
            cands = sorted(ranked.get(qid, [])[:depth], key=lambda c: (-c[1], c[0]))
            group = _group(q, cands, retriever, corpus, qrels.get(qid, {}), source_positives, positive_ranks,
                           lo, hi, num_negatives, margin, relative_margin, _rng(seed, qid), st, dists)
            if group is not None:
                st["groups"] += 1
                yield from _format(group, corpus, group_format)
    unknown = set(qrels) - seen_q
    if unknown:
        log.warning("%d query ids in the judgments are not among the queries (e.g. %s)", len(unknown), min(unknown))
    st["qrels_unknown_queries"] = len(unknown)
    _report(st, dists, num_negatives)
    if qrels and len(unknown) == len(qrels) and not allow_empty:
        raise records.RecordError(qrels_path, message=f"none of its {len(qrels)} query ids is among the {st['queries']} "
                                  f"queries (e.g. {min(unknown)!r}): wrong judgments for these queries? (--allow-empty "
                                  "writes the groups anyway)")


def _group(q, cands, retriever, corpus, judged, source_positives, positive_ranks, lo, hi, num_negatives,
           margin, relative_margin, rng, st, dists) -> dict | None:
    known = []
    if source_positives and q.get("source_docid"):
        known.append(q["source_docid"])
    known += sorted((d for d, rel in judged.items() if rel > 0), key=lambda d: (-judged[d], d))
    excluded = set(known)  # judged positives missing from the corpus are still excluded by id
    pos = []
    for d in dict.fromkeys(known):
        if d in corpus:
            pos.append(d)
        else:
            st["positive_not_in_corpus"] += 1
    pos += [d for d, _ in cands[:positive_ranks] if d in corpus and d not in pos]
    if not pos:
        st["no_positive"] += 1
        return None
    excluded.update(pos)
    score_of = dict(cands)
    missing = [d for d in pos if d not in score_of]
    st["positives_not_retrieved"] += len(missing)
    exact = retriever.score(q["query_id"], missing) if missing and hasattr(retriever, "score") else {}
    pscores = [score_of.get(d, exact.get(d)) for d in pos]
    known_scores = [s for s in pscores if s is not None]
    if len(known_scores) < len(pscores):
        st["positives_unscored"] += len(pscores) - len(known_scores)
        # the retriever ranked every candidate above the unscored positive: rank top-k's score bounds it
        known_scores.append(cands[-1][1] if cands else float("-inf"))
    for s in pscores:
        if s is not None:
            dists["positive"].add(s)
    ref = min(known_scores)
    pos_texts = {norm_text(corpus[d]) for d in pos}
    seen_texts: set[str] = set()
    pool = []
    for rank, (d, s) in enumerate(cands, 1):
        if rank < lo or rank > hi:
            continue
        doc = corpus.get(d)
        text = norm_text(doc) if doc is not None else None
        if d in excluded:
            reason = "positive"
        elif doc is None:
            reason = "not_in_corpus"
        elif text in pos_texts:
            reason = "positive_text"
        elif text in seen_texts:
            reason = "duplicate"
        elif margin is not None and s > ref - margin:
            reason = "margin"
        elif relative_margin is not None and s > ref * (1 - relative_margin):
            reason = "relative_margin"
        else:
            seen_texts.add(text)
            pool.append((rank, d, s))
            continue
        if text is not None:
            seen_texts.add(text)  # a later copy of a skipped candidate's text is a duplicate too
        st[f"skip_{reason}"] += 1
        dists["skipped"].add(s)
        if reason in dists:
            dists[reason].add(s)
    st["eligible"] += len(pool)
    negs = sorted(rng.sample(pool, num_negatives)) if len(pool) > num_negatives else pool
    for _, _, s in negs:
        dists["kept"].add(s)
    st["kept"] += len(negs)
    if len(negs) < num_negatives:
        st["short_groups"] += 1
        st["missing_negatives"] += num_negatives - len(negs)
    return {"query_id": q["query_id"], "query_text": q["query_text"], "positive_document_ids": pos,
            "negative_document_ids": [d for _, d, _ in negs],
            "positive_scores": None if None in pscores else [float(s) for s in pscores],
            "negative_scores": [float(s) for _, _, s in negs]}


def _format(g: dict, corpus: dict, fmt: str) -> Iterator[dict]:
    if fmt == "tevatron":
        yield g
        return
    pos, neg = g["positive_document_ids"], g["negative_document_ids"]
    if fmt == "tevatron-legacy":
        def passages(ids):
            return [{"docid": d, "title": corpus[d]["title"], "text": corpus[d]["text"]} for d in ids]
        yield {"query_id": g["query_id"], "query": g["query_text"], "positive_passages": passages(pos),
               "negative_passages": passages(neg)}
    elif fmt == "flagembedding":
        yield {"query": g["query_text"], "pos": [records.passage_text(corpus[d]) for d in pos],
               "neg": [records.passage_text(corpus[d]) for d in neg]}
    else:  # sentence-transformers triplets
        for p in pos:
            for n in neg:
                yield {"anchor": g["query_text"], "positive": records.passage_text(corpus[p]), "negative": records.passage_text(corpus[n])}


def _report(st: dict, dists: dict, num_negatives: int) -> None:
    log.info("%d queries -> %d groups; %d without a positive, %d empty", st["queries"], st["groups"], st["no_positive"], st["empty_query"])
    if st["positive_not_in_corpus"]:
        log.warning("%d known positives are not in the corpus (excluded from negatives, not written)", st["positive_not_in_corpus"])
    if st["positives_not_retrieved"]:
        log.info("%d positives were not in the top-k; %d of them could not be scored (margin reference: the "
                 "score at rank top-k, an upper bound)", st["positives_not_retrieved"], st["positives_unscored"])
    skips = ", ".join(f"{r} {st[f'skip_{r}']}" for r in REASONS)
    log.info("candidates in the negative range: %d eligible, %d kept; skipped: %s", st["eligible"], st["kept"], skips)
    log.info("scores of positives: %s", dists["positive"])
    log.info("scores of kept negatives: %s", dists["kept"])
    log.info("scores of skipped candidates: %s", dists["skipped"])
    for r in ("margin", "relative_margin"):
        if dists[r].n:
            log.info("scores of candidates skipped by %s: %s", r, dists[r])
    log.info("%d of %d groups have fewer than %d negatives (%d negatives short in total)",
             st["short_groups"], st["groups"], num_negatives, st["missing_negatives"])


@stage(mine, reads="query", writes="group")
@options("corpus", "qrels", "retriever", "model", "encoder", "top_k", "batch_size", "seed", "ray")
@click.option("--positive-ranks", type=click.IntRange(min=0), help="Also take ranks 1..m as positives (DRAMA: m=10).")
@click.option("--source-positives/--no-source-positives", default=None, help="Use a query's source_docid as a positive.")
@click.option("--negative-range", callback=check_range, help="Ranks negatives are sampled from, 1-based inclusive (e.g. 30-100).")
@click.option("--num-negatives", type=click.IntRange(min=0), help="Negatives per group.")
@click.option("--margin", type=float, help="Drop candidates with score > positive score - MARGIN.")
@click.option("--relative-margin", type=click.FloatRange(min=0), help="Drop candidates with score > positive score * (1 - REL).")
@click.option("--group-format", type=click.Choice(FORMATS), help="Group format written.")
@renamed("--output-format", "--group-format", type=click.Choice(FORMATS))  # search's and fuse's is a run format
@click.option("--cache/--no-cache", default=True, show_default=True, help="Cache dense corpus vectors by (model, content hash).")
@click.option("--allow-empty", is_flag=True, help="Write the groups even when no query id of --qrels is among the queries.")
def command(queries, corpus, qrels, retriever, model, cache, shard_id, shard_num, **opts):
    """Hard negatives for queries (DRAMA / FlagEmbedding / sentence-transformers): training groups."""
    if not corpus:
        raise UsageError("mine needs --corpus (the documents candidates come from)")
    ray = distributed.pop_settings(opts)
    overrides = encoder_overrides(opts)
    if ray is not None:  # the workers' copies run the model (on their GPUs when they have them)
        overrides.setdefault("device", "cpu")
    opts = {k: v for k, v in opts.items() if v is not None}
    docs = records.read_corpus(corpus)
    judged = records.read_qrels(qrels) if qrels else None
    if judged and shard_num > 1:  # judgments of other shards' queries are not "unknown"
        judged = {q: v for q, v in judged.items() if in_shard(q, shard_id, shard_num)}
    stack = contextlib.ExitStack()  # Ray workers (with --ray), held until the last group is written
    ret = open_retriever(retriever, model=model, docs=docs, corpus_path=corpus, batch_size=opts.get("batch_size", 64),
                         cache=cache, ray=ray, stack=stack, **overrides)
    return _closing(stack, mine(queries, corpus=docs, retriever=ret, qrels=judged, qrels_path=qrels, **opts))


def _closing(stack: contextlib.ExitStack, groups: Iterator[dict]) -> Iterator[dict]:
    with stack:
        yield from groups
