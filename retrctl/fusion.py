"""Fusion of ranked lists: reciprocal rank fusion and weighted linear combination of normalised scores.

One function, ``fuse``, over runs as records read them (``query_id -> [(doc_id, score)]``), so the same code
fuses two run files (``retrctl fuse``, ``retrctl eval --sweep``) and the heads of one index.

Methods (per query; the queries fused are the union of the runs' queries):

- ``rrf``: score(d) = Σ_i w_i / (k + rank_i(d)) (Cormack, Clarke & Büttcher 2009, "Reciprocal rank fusion
  outperforms Condorcet and individual rank learning methods", SIGIR). Ranks are 1-based, in trec_eval's
  order (score descending, ties by doc id descending: ``records.trec_order``), so the rank a list gives a doc
  is the rank ``retrctl eval`` sees. k = 60 by default (the paper's; with k = 1 or 2, as in
  getzep/graphiti#1847, one list's top hit beats a doc every list ranks 3rd). Scores are not used, so
  ``norm`` does not apply.
- ``linear``: score(d) = Σ_i w_i · norm_i(s_i(d)), normalised per query over the list's own (depth-cut) hits,
  then weighted, then summed (the order of operations matters, so it is fixed: normalise before weighting, as
  Pyserini's hybrid searcher and ranx do). Norms: ``minmax`` (s − min) / (max − min); ``zscore``
  (s − mean) / std (population std); ``none`` the raw score (raw BM25 dwarfs cosine scores, so
  ``minmax`` is the default). A list whose scores are all equal (one hit included) has no range: ``minmax``
  maps its docs to 1.0 and ``zscore`` to 0.0, without dividing by zero.

A doc missing from a list (explicit, because each tool guesses differently: AmenRa/ranx#32):

- ``rrf``: the list contributes nothing (no synthetic rank; sentence-transformers#3883 gave absent docs rank
  len(list) and buried a doc both lists found). As ranx's ``rrf`` (its comb_sum adds 0.0 for absent docs).
- ``linear``: the list contributes w_i times the lowest normalised score the list can give: 0.0 with
  ``minmax`` (the bottom of the range; ranx's ``wsum`` adds ``res.get(doc_id, 0.0)`` to min-max normalised
  runs), and the list's lowest (normalised) score for that query with ``none`` and ``zscore`` (Pyserini's
  ``HybridSearcher._hybrid_results``: ``dense_score = min_dense_score`` for a doc only the sparse side found).
  With ``minmax`` the two rules agree (the minimum maps to 0.0). A query a run lacks entirely gives 0.0.

A list weighted 0 is left out (``read_by``): it adds nothing to any score, and kept in, the docs only it found would
enter the fused list tied at the others' lowest score, reordering their bottom; so a fusion at (0, 1) ranks as the
second list alone, and a fused index does not search a member or head weighted 0.

The method defaults to ``linear`` with ``minmax`` (``METHOD``, ``NORM``, ``RRF_K``: the one default of every
caller). Weights default to 1 for every run (RRF as published; linear = CombSUM); one weight w for two runs is
(w, 1 − w), the pair ``eval --sweep`` tries; over more runs the sweep shares w equally among all but the last
(``swept_weights``: several dense lists against one sparse list). ``weights_from`` reads the best weights of a
sweep (``eval --sweep --json``), as ranx's ``optimize_fusion`` returns the best parameters for its
``fuse(params=…)``; a sweep with a prior weight (``--sweep-prior``) leaves it only for a row that beats it in
eval's paired t-test. ``depth`` keeps
each list's top ``depth`` before anything else (Pyserini's fusion ``--depth``); ``hits`` cuts the fused list.
The fused list is in trec_eval's order, so a fused run written and read back ranks the same.

ranx (AmenRa/ranx) has these methods but compiles them with numba; a hand-written version over a few
thousand docs per query is fast enough and keeps numba/llvmlite out of the install. tests/test_fuse.py
checks it against hand-computed cases.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

from retrctl.errors import RecordError, UsageError
from retrctl.records import read_jsonl, trec_order

METHODS = ("rrf", "linear")
NORMS = ("none", "minmax", "zscore")
# The defaults of every caller (fuse, eval --sweep, a multi-head search): with BM25 + MiniLM, linear min-max fusion
# scores above RRF on SciFact and XQuAD-en and level with it on ArguAna, and above it for every pair of a
# multi-head index's heads (bench/RESULTS.md, "Fusion: BM25 + MiniLM"), as in Pyserini's BEIR fusion experiments.
METHOD, NORM, RRF_K = "linear", "minmax", 60.0
Run = Mapping[str, Sequence[tuple[str, float]]]


def with_defaults(method: str | None, norm: str | None, k: float | None) -> tuple[str, str, float]:
    """(method, norm, RRF k) as given, each unset one (None: its flag was not given) at its default."""
    return method or METHOD, norm or NORM, RRF_K if k is None else k


def check(n_runs: int, method: str = METHOD, k: float = RRF_K, weights: Sequence[float] | None = None,
          norm: str = NORM, depth: int | None = None, hits: int | None = None) -> list[float]:
    """The settings' errors as UsageError (exit 2 on the command line); returns the weights."""
    if n_runs < 2:
        raise UsageError(f"fusion needs at least 2 runs, got {n_runs}")
    if method not in METHODS:
        raise UsageError(f"fusion method must be one of {', '.join(METHODS)}, got {method!r}")
    if norm not in NORMS:
        raise UsageError(f"norm must be one of {', '.join(NORMS)}, got {norm!r}")
    if not (math.isfinite(k) and k >= 0):
        raise UsageError(f"rrf k must be a finite number >= 0, got {k}")
    for name, v in (("depth", depth), ("hits", hits)):
        if v is not None and v < 1:
            raise UsageError(f"{name} must be >= 1, got {v}")
    w = [1.0] * n_runs if weights is None else complement([float(x) for x in weights], n_runs)
    if len(w) != n_runs:
        raise UsageError(f"{len(w)} weights for {n_runs} runs: give one weight per run")
    if any(not math.isfinite(x) or x < 0 for x in w) or not any(w):
        raise UsageError(f"weights must be finite, >= 0 and not all 0, got {','.join(f'{x:g}' for x in w)}")
    return w


def read_by(weights: Sequence[float] | None, n_lists: int = 0) -> list[int]:
    """The positions of the lists a fusion at ``weights`` reads: those weighted above 0 (all ``n_lists`` when
    ``weights`` is None, every list at 1)."""
    if weights is None:
        return list(range(n_lists))
    return [i for i, x in enumerate(weights) if x]


def complement(weights: list[float], n_runs: int) -> list[float]:
    """Weights as given, except one weight w for two lists: (w, 1 − w), as ``eval --sweep`` writes its rows
    (rounded to 10 places, so 0.3 gives exactly the sweep's 0.7); w must then be in [0, 1]."""
    if len(weights) != 1 or n_runs != 2:
        return weights
    w = weights[0]
    if not (math.isfinite(w) and 0 <= w <= 1):
        raise UsageError(f"one weight w for 2 lists means w,1-w: w must be in [0, 1], got {w:g}")
    return [w, round(1 - w, 10)]


def swept_weights(w: float, n_runs: int) -> list[float]:
    """The weights of ``eval --sweep``'s row w over ``n_runs`` runs: w shared equally among all runs but the last,
    1 − w on the last ((w, 1 − w) for two runs), rounded to 10 places as the grid is."""
    return [round(w / (n_runs - 1), 10)] * (n_runs - 1) + [round(1 - w, 10)]


def swept_w(weights: list[float]) -> float:
    """A sweep row's w (the weight all runs but the last share), from its weights."""
    return round(1 - weights[-1], 10)


# a sweep row's fusion settings (eval --sweep --json: "settings") -> the fusion flags they are the values of
SWEPT = {"fusion": "fusion_method", "norm": "norm", "rrf_k": "rrf_k", "depth": "depth"}


def weights_from(path, measure: str = "nDCG@10") -> tuple[list[float], dict]:
    """The weights of the best row of an ``eval --sweep --json`` table by ``measure``, ties to the weight nearer
    0.5 (then the earlier row), and the fusion settings it was swept with ({flag name: value}, see ``SWEPT``):
    ranx's ``optimize_fusion`` as a file. A sweep made with ``--sweep-prior W`` names its prior in every row and
    tests each row against it: the best row is taken only where it beats the prior significantly (its
    ``significant`` lists ``measure``), else the prior's row. RecordError naming the file, line and field for a
    row that is not a sweep row or lacks the measure, and for a prior that is no row's weight."""
    rows = []
    for line, row in read_jsonl(path):
        weights = row.get("weights")
        if not (isinstance(weights, list) and weights and all(_number(w) for w in weights)):
            raise RecordError(path, line, "weights", "expected a list of numbers (a row of `retrctl eval --sweep --json`)")
        value = row.get(measure)
        if not _number(value):
            have = [k for k, v in row.items() if _number(v)]
            raise RecordError(path, line, measure, f"missing or not a number (this row has {', '.join(have) or 'no measure'}; "
                                                   "choose with --weights-by)")
        rows.append((line, row))
    if not rows:
        raise RecordError(path, message="no sweep rows (expected the output of `retrctl eval --sweep --json`)")
    prior = rows[0][1].get("prior")
    if prior is not None:
        at_prior = [r for _, r in rows if _number(prior) and swept_w(r["weights"]) == prior]
        if not at_prior:
            raise RecordError(path, rows[0][0], "prior", f"{prior!r} is not the weight of any row")
        rows = [(line, r) for line, r in rows if r is at_prior[0] or measure in (r.get("significant") or ())]
    best = max(rows, key=lambda lr: (lr[1][measure], -abs(swept_w(lr[1]["weights"]) - 0.5), -lr[0]))[1]
    swept = best.get("settings") if isinstance(best.get("settings"), dict) else {}
    return [float(w) for w in best["weights"]], {flag: swept[k] for k, flag in SWEPT.items() if k in swept}


def known_items_of(path, flag: str = "--known-items") -> dict | None:
    """The known-item verdict a sweep file records (``eval --sweep --known-items … --json``: the dense side's and
    the last run's nDCG@10 on known-item queries, and whether the dense side reads the corpus), None when ``path``
    is not a sweep file; UsageError (naming ``flag``) for a sweep made without ``--known-items``."""
    if not os.path.isfile(path):
        return None
    try:
        _, first = next(read_jsonl(path))
    except (RecordError, StopIteration, UnicodeDecodeError):
        return None
    if "weights" not in first:
        return None
    verdict = (first.get("settings") or {}).get("known_items")
    if not isinstance(verdict, dict) or not isinstance(verdict.get("reads"), bool):
        raise UsageError(f"{path} is a sweep made without --known-items: it holds no verdict", flag=flag)
    return verdict


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def swept_settings(path, settings: dict, given: dict) -> dict:
    """The fusion flags for weights taken from the sweep at ``path``: the sweep's ``settings``, where the flags the
    user ``given`` ({flag name: value}, only those set) agree with them; UsageError where one does not (the
    weights were chosen for another fusion)."""
    for name, value in given.items():
        if name in settings and settings[name] != value:
            flag = "--fusion" if name == "fusion_method" else f"--{name.replace('_', '-')}"
            raise UsageError(f"{flag} {value}: the weights in {path} were chosen with {flag} {settings[name]}")
    return {**settings, **given}


def normalize(ranked: Sequence[tuple[str, float]], norm: str) -> tuple[dict[str, float], float]:
    """({doc: normalised score}, the score a doc missing from this list gets) for one query's list."""
    if not ranked:
        return {}, 0.0
    scores = [float(s) for _, s in ranked]
    if norm == "none":
        return dict(zip((d for d, _ in ranked), scores, strict=True)), min(scores)
    if norm == "minmax":
        lo, hi = min(scores), max(scores)
        span = hi - lo
        out = [1.0 if span == 0 else (s - lo) / span for s in scores]
        return dict(zip((d for d, _ in ranked), out, strict=True)), 0.0
    mean = math.fsum(scores) / len(scores)
    std = math.sqrt(math.fsum((s - mean) ** 2 for s in scores) / len(scores))
    out = [0.0 if std == 0 else (s - mean) / std for s in scores]
    return dict(zip((d for d, _ in ranked), out, strict=True)), min(out)


def fuse_query(lists: Sequence[Sequence[tuple[str, float]]], method: str = METHOD, k: float = RRF_K,
               weights: Sequence[float] | None = None, norm: str = NORM, depth: int | None = None,
               hits: int | None = None) -> list[tuple[str, float]]:
    """One query's fused list, best first (trec_eval's order). ``lists``: one (doc, score) list per run."""
    w = [1.0] * len(lists) if weights is None else weights
    read = read_by(w)
    lists, w = [lists[i] for i in read], [w[i] for i in read]
    ranked = [trec_order(lst)[:depth] if depth else trec_order(lst) for lst in lists]
    fused: dict[str, float] = {}
    if method == "rrf":
        for wi, lst in zip(w, ranked, strict=True):
            for rank, (doc, _) in enumerate(lst, 1):
                fused[doc] = fused.get(doc, 0.0) + wi / (k + rank)
    else:
        normed = [normalize(lst, norm) for lst in ranked]
        docs = dict.fromkeys(d for lst in ranked for d, _ in lst)  # first-seen order; the sort below decides
        for doc in docs:
            fused[doc] = math.fsum(wi * scores.get(doc, missing) for wi, (scores, missing) in zip(w, normed, strict=True))
    out = trec_order(fused)
    return out[:hits] if hits else out


def fuse(runs: Sequence[Run], method: str = METHOD, k: float = RRF_K, weights: Sequence[float] | None = None,
         norm: str = NORM, depth: int | None = None, hits: int | None = None) -> dict[str, list[tuple[str, float]]]:
    """Fuse runs (``query_id -> [(doc_id, score)]``) into one run of the same shape; see the module doc.

    UsageError for settings that cannot work (fewer than 2 runs, a weight per run missing, unknown method/norm).
    """
    w = check(len(runs), method, k, weights, norm, depth, hits)
    qids = list(dict.fromkeys(q for run in runs for q in run))
    return {q: fuse_query([run.get(q, ()) for run in runs], method, k, w, norm, depth, hits) for q in qids}


def parse_weights(text: str) -> list[float]:
    """'0.3,0.7' -> [0.3, 0.7]; ValueError naming the bad item."""
    out = []
    for item in str(text).split(","):
        try:
            out.append(float(item))
        except ValueError:
            raise ValueError(f"weights must be numbers separated by commas (e.g. 0.3,0.7), got {item.strip()!r}") from None
    return out


def parse_grid(text: str) -> list[float]:
    """'LO:HI:STEP' -> [LO, LO+STEP, …, HI] (HI included when the steps reach it); ValueError otherwise."""
    try:
        lo, hi, step = (float(x) for x in str(text).split(":"))
    except ValueError:
        raise ValueError(f"sweep must look like LO:HI:STEP (e.g. 0:1:0.1), got {text!r}") from None
    if not all(math.isfinite(x) for x in (lo, hi, step)) or step <= 0 or hi < lo or lo < 0 or hi > 1:
        raise ValueError(f"sweep needs 0 <= LO <= HI <= 1 and STEP > 0, got {text!r}")
    n = math.floor((hi - lo) / step + 1e-9)
    return [round(lo + i * step, 10) for i in range(n + 1)]
