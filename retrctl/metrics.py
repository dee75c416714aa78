"""Retrieval measures by ir_measures name, computed by pytrec_eval (the C trec_eval) through ir_measures.

Nothing here computes a measure by hand and nothing here reads files: the stage reads runs and qrels
(records.read_run / read_qrels) and passes dicts in. What retrctl owns is the set of queries a measure is
averaged over and the checks that keep trec_eval's semantics intact:

- ranking within a query: score descending, ties by doc id descending (trec_eval's own order; pytrec_eval#56)
- judged queries absent from a run score 0 and are counted (``trec_eval -c``; ir_measures#17)
- run queries without judgments are ignored and counted
- qrels entries with no judgments at all are skipped with a warning (pytrec_eval#49 corrupts later queries)
- a doc twice in one query's ranking is an error (pytrec_eval#50: nDCG > 1); NaN scores are refused
- retrieved docs without a judgment, and docs whose id equals the query id, are counted

Measures the C trec_eval lacks are routed so the semantics stay trec_eval's:

| name      | computed as                                                                                 |
|-----------|---------------------------------------------------------------------------------------------|
| RR@k      | trec_eval's ``recip_rank`` where the first relevant doc (in trec_eval's order) is within k, else 0: |
|           | the same as ``trec_eval -M k -m recip_rank``. ir_measures' default provider for RR@k (msmarco) |
|           | breaks ties by doc id ascending and disagreed on 1/3 of the queries of tie-heavy test runs |
| R_cap@k   | BEIR's capped recall, hits@k / min(k, #relevant) (beir#4): trec_eval's R@k where #relevant <= k, |
|           | else its P@k. ``capped_recall=True`` turns every plain R@k into R_cap@k                     |
| others    | ir_measures' default pipeline (its provider's own conventions), e.g. ERR@20, Judged@10       |
"""

from __future__ import annotations

import logging
import math
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import ir_measures

log = logging.getLogger("retrctl.metrics")

DEFAULT_MEASURES = ("nDCG@10", "R@100", "R@1000", "RR@10", "AP")
_CAPPED = re.compile(r"R_cap@(\d+)$")


@dataclass(frozen=True)
class Spec:
    """One requested measure: its label in tables/JSON and how it is computed."""

    name: str
    measure: object  # the ir_measures measure (for R_cap@k: R@k)
    route: str  # "trec" (pytrec_eval), "rr_cut", "capped", "other" (ir_measures default pipeline)
    cutoff: int | None = None


def parse(names: Iterable[str] = DEFAULT_MEASURES, capped_recall: bool = False) -> list[Spec]:
    """Measures by ir_measures name (``nDCG@10``, ``AP(rel=2)``, ``MRR@10``), trec_eval name
    (``ndcg_cut_10``) or ``R_cap@k``. Unknown names raise ValueError. Duplicates are dropped."""
    specs: dict[str, Spec] = {}
    for raw in names:
        for name in (n.strip() for n in str(raw).split(",")):
            if not name:
                continue
            for spec in _parse_one(name, capped_recall):
                specs.setdefault(spec.name, spec)
    if not specs:
        raise ValueError("no measures given")
    return list(specs.values())


def _parse_one(name: str, capped_recall: bool) -> list[Spec]:
    if m := _CAPPED.match(name):
        k = int(m.group(1))
        return [Spec(f"R_cap@{k}", ir_measures.R @ k, "capped", k)]
    try:
        measures = [ir_measures.parse_measure(name)]
    except (ValueError, NameError, SyntaxError, TypeError, AttributeError):
        try:
            measures = list(ir_measures.parse_trec_measure(name))
        except (ValueError, KeyError, NameError, SyntaxError, TypeError, AttributeError):
            measures = []
    if not measures:
        raise ValueError(f"unknown measure {name!r} (ir_measures names such as nDCG@10, R@100, RR@10, AP, P@10)")
    out = []
    for m in measures:
        cutoff = m["cutoff"] if isinstance(m["cutoff"], int) else None
        if capped_recall and cutoff and str(m) == f"R@{cutoff}":
            out.append(Spec(f"R_cap@{cutoff}", m, "capped", cutoff))
        elif m.NAME == "RR" and cutoff:
            out.append(Spec(str(m), m, "rr_cut", cutoff))
        elif ir_measures.pytrec_eval.supports(m):
            out.append(Spec(str(m), m, "trec", cutoff))
        elif ir_measures.DefaultPipeline.supports(m):
            out.append(Spec(str(m), m, "other", cutoff))
        else:
            raise ValueError(f"measure {name!r} is not supported by the installed ir_measures providers")
    return out


@dataclass
class Result:
    """A run's scores: mean per measure, every judged query's values, and the counts behind them."""

    measures: list[str]
    mean: dict[str, float]
    per_query: dict[str, dict[str, float]]  # query_id -> measure -> value, for every judged query
    counts: dict[str, int] = field(default_factory=dict)


def _clean_qrels(qrels: Mapping) -> tuple[dict[str, dict[str, int]], int]:
    clean, skipped = {}, 0
    for qid, judged in qrels.items():
        if not judged:
            skipped += 1
            continue
        docs = {}
        for docid, rel in judged.items():
            if isinstance(rel, float) and rel.is_integer():
                rel = int(rel)
            if isinstance(rel, bool) or not isinstance(rel, int):
                raise ValueError(f"qrels {qid!r}/{docid!r}: relevance must be an integer grade, got {rel!r}")
            docs[str(docid)] = rel
        clean[str(qid)] = docs
    if skipped:
        log.warning("skipped %d qrels entries with no judgments (they would corrupt pytrec_eval's scores)", skipped)
    return clean, skipped


def _clean_run(run: Mapping, qrels: dict, ignore_self: bool, counts: dict) -> dict[str, dict[str, float]]:
    """The judged queries of a run as {doc_id: score}; checks repeated docs and NaN in every query.

    No sorting here: pytrec_eval orders each ranking itself, in trec_eval's order.
    """
    out = {}
    for qid, docs in run.items():
        qid = str(qid)
        if isinstance(docs, Mapping):
            scores = docs
        else:
            pairs = list(docs)
            scores = dict(pairs)
            if len(scores) != len(pairs):
                seen = set()
                dup = next(d for d, _ in pairs if d in seen or seen.add(d))
                raise ValueError(f"doc {dup!r} appears twice for query {qid!r}")
        try:
            nan = any(map(math.isnan, scores.values()))
        except TypeError:
            nan = True
        if nan:
            bad = next(s for s in scores.values() if not isinstance(s, (int, float)) or math.isnan(s))
            raise ValueError(f"query {qid!r}: score must be a number, got {bad!r}")
        if qid not in qrels:
            counts["ignored"] += 1
            continue
        if qid in scores:
            counts["self_hits"] += 1
            if ignore_self:
                scores = {d: v for d, v in scores.items() if d != qid}
        if scores:
            if not all(type(d) is str and type(v) is float for d, v in scores.items()):
                scores = {str(d): float(v) for d, v in scores.items()}  # pytrec_eval wants str -> float
            out[qid] = scores
    return out


def _calc(provider, measures, qrels, run_dd) -> Iterable:
    if not measures:
        return []
    return provider.evaluator(list(measures), qrels).iter_calc(run_dd)


def _whole_rr(measure):
    """RR without its cutoff, other parameters kept (plain ``RR`` when there are none, so ``-m RR`` shares it)."""
    return ir_measures.RR(**{k: v for k, v in measure.params.items() if k != "cutoff"})


def evaluate(run: Mapping, qrels: Mapping, measures: Iterable[str] = DEFAULT_MEASURES, *, ignore_self: bool = False,
             capped_recall: bool = False) -> Result:
    """Score one run against qrels with trec_eval -c semantics.

    run: query_id -> [(doc_id, score)] or {doc_id: score}; qrels: query_id -> {doc_id: grade}.
    ignore_self drops docs whose id equals the query id (BEIR's convention for ArguAna and Quora, beir#91).
    Raises ValueError for a repeated doc, a NaN score, a non-integer grade, or an unknown measure.
    """
    measures = list(measures)
    specs = measures if measures and all(isinstance(m, Spec) for m in measures) else parse(measures, capped_recall)
    qrels, skipped = _clean_qrels(qrels)
    counts = dict(evaluated=len(qrels), missing=0, ignored=0, skipped=skipped, no_relevant=0, docs=0, unjudged=0,
                  self_hits=0)
    run_dd = _clean_run(run, qrels, ignore_self, counts)
    counts["missing"] = sum(1 for q in qrels if q not in run_dd)
    counts["no_relevant"] = sum(1 for j in qrels.values() if not any(r > 0 for r in j.values()))
    counts["docs"] = sum(len(r) for r in run_dd.values())
    counts["unjudged"] = sum(1 for q, r in run_dd.items() for d in r if d not in qrels[q])

    # one pytrec_eval pass for everything it computes (with the parts of R_cap@k and RR@k)
    trec = {s.measure for s in specs if s.route == "trec"}
    for s in specs:
        if s.route == "capped":
            trec |= {ir_measures.R @ s.cutoff, ir_measures.P @ s.cutoff, ir_measures.NumRel}
        if s.route == "rr_cut":
            trec.add(_whole_rr(s.measure))
    values: dict[object, dict[str, float]] = {}
    for metric in _calc(ir_measures.pytrec_eval, trec, qrels, run_dd):
        values.setdefault(metric.measure, {})[metric.query_id] = metric.value
    for metric in _calc(ir_measures.DefaultPipeline, {s.measure for s in specs if s.route == "other"}, qrels, run_dd):
        values.setdefault(metric.measure, {})[metric.query_id] = metric.value

    per_query: dict[str, dict[str, float]] = {q: {} for q in qrels}
    mean = {}
    for s in specs:
        if s.route == "capped":
            rec, prec, nrel = values[ir_measures.R @ s.cutoff], values[ir_measures.P @ s.cutoff], values[ir_measures.NumRel]
            got = {q: rec.get(q, 0.0) if nrel.get(q, 0) <= s.cutoff else prec.get(q, 0.0) for q in qrels}
        elif s.route == "rr_cut":  # 1/rank of the first relevant doc (trec_eval order) when that rank <= k
            whole = values[_whole_rr(s.measure)]
            got = {q: rr if rr * s.cutoff >= 1 - 1e-9 else 0.0 for q, rr in whole.items()}
        else:
            got = values.get(s.measure, {})
        agg = s.measure.aggregator()
        for q in qrels:
            v = float(got.get(q, s.measure.DEFAULT))  # judged, not retrieved: 0 as trec_eval -c
            per_query[q][s.name] = v
            agg.add(v)
        mean[s.name] = float(agg.result()) if qrels else 0.0
    return Result([s.name for s in specs], mean, per_query, counts)


def paired_ttest(base: Result, other: Result) -> dict[str, float]:
    """Two-sided paired t-test (scipy.stats.ttest_rel) per measure over the judged queries of both runs.

    Identical per-query values give p = 1.0 (scipy would return NaN).
    """
    from scipy import stats

    if set(base.per_query) != set(other.per_query):
        raise ValueError("runs were scored against different qrels: cannot pair queries")
    qids = sorted(base.per_query)
    out = {}
    for m in base.measures:
        if m not in other.measures:
            continue
        a = [base.per_query[q][m] for q in qids]
        b = [other.per_query[q][m] for q in qids]
        if len(qids) < 2 or a == b:
            out[m] = 1.0
            continue
        with warnings.catch_warnings():  # scipy warns about near-identical samples; the p-value says enough
            warnings.simplefilter("ignore", RuntimeWarning)
            p = float(stats.ttest_rel(a, b).pvalue)
        out[m] = 0.0 if math.isnan(p) else p  # NaN only when every query moved by the same amount
    return out
