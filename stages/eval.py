"""eval: score runs against judgments with trec_eval's semantics; compare runs with a paired t-test.

Method: the TREC evaluation measures as implemented by trec_eval (NIST, usnistgov/trec_eval), called through
pytrec_eval (Van Gysel & de Rijke 2018, "Pytrec_eval: An Extremely Fast Python Interface to trec_eval",
SIGIR, arXiv:1805.01597) and named as in ir_measures (MacAvaney, Macdonald & Ounis 2022, "Streamlining
Evaluation with ir-measures", ECIR, arXiv:2111.13466). Significance: two-sided paired t-test over queries
(Smucker, Allan & Carterette 2007, "A Comparison of Statistical Significance Tests for Information Retrieval
Evaluation", CIKM), scipy.stats.ttest_rel. Measures and the -c / tie semantics live in retrctl.metrics.

| knob                                       | flag                                      |
|--------------------------------------------|-------------------------------------------|
| measures (ir_measures names, trec_eval -m) | ``-m nDCG@10 -m R@100`` (repeatable)      |
| relevance level (trec_eval -l)             | in the name: ``-m 'AP(rel=2)'``           |
| average over all judged queries (-c)       | always on                                 |
| per-query values (trec_eval -q)            | ``--per-query``                           |
| significance level                         | ``--alpha`` (``*`` marks p < alpha)       |
| BEIR's capped recall (beir#4)              | ``--capped-recall`` (R@k becomes R_cap@k)  |
| drop docs whose id is the query id (beir#91) | ``--ignore-self`` / ``--keep-self``     |
| several collections (BEIR's table)         | ``--qrels NAME=PATH`` + ``SYSTEM:NAME=RUN`` |
| table as CSV / as a figure                 | ``--csv`` / ``--plot FILE.png``           |

Output (stdout, or ``-o``): a table, one row per run, after a ``#`` header line that records the qrels file,
ignore-self, capped-recall and the test. ``--json``: one JSON object per run and line,
``{"run": path, "nDCG@10": …, "counts": {…}, "settings": {…}}``, runs after the first also carry
``"p_value": {measure: p}`` and ``"significant": [measures]``; ``--per-query`` adds ``"per_query": {qid:
{measure: value}}``. Text ``--per-query``: tab-separated ``query_id measure value`` rows (a ``run`` column
first when several runs are given), ending with ``all`` rows as trec_eval -q does. Counts of evaluated,
missing, ignored and skipped queries go to stderr.

Weight sweep (the weight of a hybrid moves nDCG a lot): ``retrctl eval RUN_A RUN_B --qrels Q --sweep
0:1:0.1 [--fusion linear|rrf] [--norm minmax] [--rrf-k 60] [--depth N]`` fuses the two runs at each grid point
(weight w on RUN_A, 1 - w on RUN_B, as Pyserini's interpolation α·s1 + (1-α)·s2) with retrctl.fusion, as
``retrctl fuse --weights w,1-w`` would (its default 1000 hits per query), and prints one row per weight: ``w_a
w_b <measures> queries`` (``--json``: one object per weight with ``"weights"``; no significance marks, every row
is a setting of one fusion, not a run to compare with the first). Three or more runs (several dense lists and one
sparse, say) share w equally among all but the last, 1 - w on the last: ``w_a w_b w_c …``, one weight per run, so
``fuse --weights-from`` and ``index --fuse --weights-from`` over the same runs in the same order take the row as is.
``--sweep-prior W`` tests every row against W's (paired t-test) so that ``--weights-from`` leaves W only on
evidence; ``--known-items QRELS`` (crops: queries cut from the one document each judges, simulated known-item
queries as Azzopardi, de Rijke & Balog 2007, "Building Simulated Queries for Known-Item Topics", SIGIR) first
asks whether the dense side reads the corpus at all (``known_items``: its nDCG@10 on them at least half of the last run's), and where it
does not the prior is 0, the last run alone (a model on a language it was not trained on); ``--known-items SWEEP``
takes that verdict from another sweep's settings (the base model's, for lists trained from it).

Across collections, as BEIR reports it (Thakur et al. 2021, "BEIR: A Heterogeneous Benchmark for Zero-shot
Evaluation of Information Retrieval Models", NeurIPS Datasets and Benchmarks, arXiv:2104.08663): ``--qrels
NAME=PATH`` once per collection and runs as ``SYSTEM:NAME=RUN`` print one row per system and measure, one column
per collection and the average of the collections' means (retrctl.across_collections). Tests, against the first
system: a collection's column over its queries (as above); the average over the queries of all collections
pooled. Every system needs a run for every collection; a run none of whose queries is judged in its collection
is bad input (exit 2), not a zero averaged in. ``--sweep`` with two systems fuses them per collection: one row
per weight. ``--csv``: the table at full precision. ``--plot FILE.png|svg|pdf``: grouped bars (a cluster per
collection, a hatched grey bar per system), or for ``--sweep`` the measure against the weight, one line per
collection and the average in bold (retrctl.plots, matplotlib's Agg backend; readable in grey).

Deviations: ``--ignore-self`` is on by default when the qrels path names ArguAna or Quora, BEIR's datasets
whose queries are corpus documents (their published numbers drop self-hits, beir#91, beir#206), with a note on
stderr; ``--keep-self`` turns it off. Elsewhere it is off, as in trec_eval.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import re
from collections.abc import Iterable, Iterator

import click

from retrctl import across_collections, fusion, metrics, plots, records
from retrctl.errors import UsageError
from retrctl.options import QRELS_HELP, options
from retrctl.stage import stage

log = logging.getLogger("retrctl.eval")
SELF_CONVENTION = re.compile(r"arguana|quora", re.IGNORECASE)


def eval(runs: Iterable[tuple[str, dict]], qrels: dict, *, measures=metrics.DEFAULT_MEASURES, ignore_self: bool = False,
         capped_recall: bool = False, alpha: float = 0.05, per_query: bool = False) -> list[dict]:
    """One row per run: {"run", <measure>: mean, "counts"}; later runs add "p_value" and "significant"
    (paired t-test against the first run). Runs are consumed one at a time, so only one is held in memory."""
    specs = metrics.parse(measures, capped_recall)
    rows, base = [], None
    for name, run in runs:
        res = metrics.evaluate(run, qrels, specs, ignore_self=ignore_self)
        row = {"run": name, **res.mean, "counts": res.counts}
        if base is None:
            base = res
        else:
            row["p_value"] = metrics.paired_ttest(base, res)
            row["significant"] = [m for m, p in row["p_value"].items() if p < alpha]
        if per_query:
            row["per_query"] = res.per_query
        rows.append(row)
    return rows


FUSE_HITS = 1000  # retrctl fuse's default --hits: a sweep row equals evaluating that fused run


def fused_runs(runs: list[dict], grid: list[float], *, fusion_method: str, rrf_k: float, norm: str,
               depth: int | None) -> Iterator[tuple[float, dict]]:
    """(w, the runs fused with weights ``fusion.swept_weights(w, len(runs))``: (w, 1 - w) for two) for each grid
    weight, made one at a time."""
    for w in grid:
        yield w, fusion.fuse(runs, fusion_method, rrf_k, fusion.swept_weights(w, len(runs)), norm, depth, FUSE_HITS)


def sweep(runs: list[dict], qrels: dict, grid: list[float], *, fusion_method: str = fusion.METHOD,
          rrf_k: float = fusion.RRF_K, norm: str = fusion.NORM, depth: int | None = None, prior: float | None = None,
          **opts) -> list[dict]:
    """One row per grid weight w: ``eval`` of the runs fused with weights (w, 1 - w), over three or more runs w
    shared equally among all but the last, plus ``"weights"``. With ``prior`` (a grid weight) every row also names
    it and the others carry ``p_value`` and ``significant`` (paired t-test against the prior's row at ``alpha``):
    what ``fuse --weights-from`` needs to leave the prior only on evidence. Fused runs are made one at a time, as
    eval consumes them."""
    order = grid if prior is None else [prior, *(w for w in grid if w != prior)]
    fused = ((f"{fusion_method}:" + ",".join(f"{x:g}" for x in fusion.swept_weights(w, len(runs))), run)
             for w, run in fused_runs(runs, order, fusion_method=fusion_method, rrf_k=rrf_k, norm=norm, depth=depth))
    by_weight = dict(zip(order, eval(fused, qrels, **opts), strict=True))
    rows = []
    for w in grid:
        row = by_weight[w]
        if prior is None:
            row.pop("p_value", None)
            row.pop("significant", None)
        else:
            row.setdefault("significant", [])
            row["prior"] = prior
        row["weights"] = fusion.swept_weights(w, len(runs))
        rows.append(row)
    return rows


# a dense side that finds its known items (queries cut from the one document they judge: `retrctl crop`) less than
# half as well as the last run (BM25, which finds a copied sentence by its words) cannot read the corpus: over the
# 18 collections in ../shared/data the base model's ratio is 0.62 or more where it reads the language and 0.42 or
# less where it does not (bench/RESULTS.md, "Known items")
READS_AT = 0.5


def known_items(runs: list[dict], qrels: dict, *, fusion_method: str = fusion.METHOD, rrf_k: float = fusion.RRF_K,
                norm: str = fusion.NORM, depth: int | None = None, ignore_self: bool = False) -> dict:
    """Whether a sweep's dense side (every run but the last, fused at equal weights) reads the corpus: its nDCG@10
    on known-item queries against the last run's, ``{"dense", "last", "queries", "reads"}`` (reads: at least
    ``READS_AT`` times the last run's)."""
    dense = runs[0] if len(runs) == 2 else fusion.fuse(runs[:-1], fusion_method, rrf_k, None, norm, depth, FUSE_HITS)
    rows = eval((("dense", dense), ("last", runs[-1])), qrels, measures=("nDCG@10",), ignore_self=ignore_self)
    if not rows[1]["counts"]["evaluated"] or rows[1]["counts"]["missing"] == rows[1]["counts"]["evaluated"]:
        raise ValueError("none of its queries is in the last run: search them with the sweep's queries")
    scores = [row["nDCG@10"] for row in rows]
    return {"dense": scores[0], "last": scores[1], "queries": rows[0]["counts"]["evaluated"],
            "reads": scores[0] >= READS_AT * scores[1]}


def weight_columns(n_runs: int) -> list[str]:
    """A sweep table's weight columns, one per run fused: w_a, w_b, …"""
    return [f"w_{chr(ord('a') + i)}" for i in range(n_runs)]


def _sweep_table(rows: list[dict], names: list[str], header: str) -> str:
    """One tab-separated row per weight; with a prior, each measure's p against the prior's row ('-' on that row)."""
    tested = "prior" in rows[0]
    columns = [*weight_columns(len(rows[0]["weights"])), *names, *(f"p_{m}" for m in names if tested), "queries"]
    out = [header, "\t".join(columns)]
    for row in rows:
        ps = [f"{row['p_value'][m]:.2g}" if "p_value" in row else "-" for m in names] if tested else []
        out.append("\t".join([*(f"{w:g}" for w in row["weights"]), *(f"{row[m]:.4f}" for m in names), *ps,
                              str(row["counts"]["evaluated"])]))
    return "\n".join(out) + "\n"


def _table(rows: list[dict], names: list[str], header: str) -> str:
    cells = [["run", *names, "queries"]]
    for i, row in enumerate(rows):
        marks = ["*" if i and m in row["significant"] else "" for m in names]
        cells.append([row["run"], *(f"{row[m]:.4f}{s}" for m, s in zip(names, marks, strict=True)), str(row["counts"]["evaluated"])])
    widths = [max(len(r[c]) for r in cells) for c in range(len(cells[0]))]
    lines = ["  ".join(v.ljust(w) if c == 0 else v.rjust(w) for c, (v, w) in enumerate(zip(r, widths, strict=True))).rstrip() for r in cells]
    return header + "\n" + "\n".join(lines) + "\n"


def _per_query_rows(rows: list[dict], names: list[str], header: str) -> str:
    several = len(rows) > 1
    out = [header, "\t".join((["run"] if several else []) + ["query_id", "measure", "value"])]
    for row in rows:
        lead = [row["run"]] if several else []
        for qid, vals in row["per_query"].items():
            out += ["\t".join([*lead, qid, m, f"{vals[m]:.6f}"]) for m in names]
        out += ["\t".join([*lead, "all", m, f"{row[m]:.6f}"]) for m in names]
    return "\n".join(out) + "\n"


def _prior(value: str | None) -> tuple[float | None, str | None]:
    """``--sweep-prior``'s weight, and the sweep file it was read from (None for a number given): a file's is the
    weight ``fuse --weights-from`` takes from it, so one sweep's choice is where the next starts."""
    if value is None:
        return None, None
    try:
        weight = float(value)
    except ValueError:
        if not os.path.isfile(value):
            raise UsageError(f"expected a weight in [0, 1] or a file of `eval --sweep --json`, got {value!r}",
                             flag="--sweep-prior") from None
        return fusion.swept_w(fusion.weights_from(value)[0]), value
    if not 0 <= weight <= 1:
        raise UsageError(f"{value} is not in the range 0 to 1", flag="--sweep-prior")
    return weight, None


def _known_verdict(known_from: str, runs: list[dict], qrels_split: str | None, fusion_settings: dict,
                   ignore_self: bool) -> dict:
    """--known-items' verdict, logged: measured on the sweep's runs (QRELS), or another sweep's (SWEEP)."""
    verdict = fusion.known_items_of(known_from)
    if verdict is not None:
        verdict = {**verdict, "from": known_from}
    else:
        known_file = records.resolve(known_from, "qrels", qrels_split)
        try:
            measured = known_items(runs, records.read_qrels(known_file), ignore_self=ignore_self, **fusion_settings)
        except ValueError as e:
            raise UsageError(f"{known_file}: {e}", flag="--known-items") from None
        verdict = {**measured, "qrels": known_file}
    log.info("known items (%s): the dense side %.4f nDCG@10 on %d queries, the last run %.4f: %s", known_from,
             verdict["dense"], verdict["queries"], verdict["last"],
             "it reads the corpus" if verdict["reads"] else
             f"below {READS_AT:g} of it, it cannot read the corpus: the prior is 0, the last run alone")
    return verdict


def _log_counts(row: dict, ignore_self: bool) -> None:
    c = row["counts"]
    log.info("%s: %d judged queries evaluated, %d missing from the run (scored 0), %d run queries without judgments "
             "(ignored), %d empty qrels entries skipped; %d of %d retrieved docs unjudged",
             row["run"], c["evaluated"], c["missing"], c["ignored"], c["skipped"], c["unjudged"], c["docs"])
    if c["docs"] and c["unjudged"] == c["docs"]:
        log.warning("%s: no retrieved document is judged: do the run's doc ids match the qrels?", row["run"])
    if c["evaluated"] and c["missing"] == c["evaluated"]:
        log.warning("%s: no judged query is in the run: do the run's query ids match the qrels?", row["run"])
    if c["no_relevant"]:
        log.info("%s: %d judged queries have no relevant document (they score 0, as in trec_eval)", row["run"], c["no_relevant"])
    if c["self_hits"] and not ignore_self:
        log.warning("%s: %d queries retrieve a doc with their own id; --ignore-self drops those (BEIR's convention "
                    "for ArguAna/Quora)", row["run"], c["self_hits"])


NAMED_QRELS = re.compile(r"^([A-Za-z0-9][\w.+-]*)=(.+)$")  # NAME=PATH (a NAME has no '/', so a path is never one)
NAMED_RUN = re.compile(r"^([A-Za-z0-9][\w.+-]*):([A-Za-z0-9][\w.+-]*)=(.+)$")  # SYSTEM:COLLECTION=PATH


def collection_plan(qrels: tuple[str, ...], runs: tuple[str, ...]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """``--qrels NAME=PATH`` flags and ``SYSTEM:NAME=RUN`` arguments as ({collection: qrels path},
    {system: {collection: run path}}), both in the order given; UsageError for anything that does not name a
    collection, a pair given twice, or a system without a run for every collection."""
    collections: dict[str, str] = {}
    for value in qrels:
        m = NAMED_QRELS.match(value)
        if not m:
            raise UsageError(f"{value!r}: with several collections every --qrels is NAME=PATH", flag="--qrels")
        name, path = m.groups()
        if name in collections or name == across_collections.AVERAGE:
            raise UsageError(f"collection name {name!r} is {'given twice' if name in collections else 'reserved'}", flag="--qrels")
        collections[name] = path
    plan: dict[str, dict[str, str]] = {}
    for value in runs:
        m = NAMED_RUN.match(value)
        if not m:
            raise UsageError(f"run {value!r}: with --qrels NAME=PATH every run is SYSTEM:NAME=RUN (e.g. bm25:scifact=bm25.trec)")
        system, name, path = m.groups()
        if name not in collections:
            raise UsageError(f"run {value!r} names collection {name!r}, which no --qrels NAME=PATH gives "
                             f"(collections: {', '.join(collections)})")
        if name in plan.setdefault(system, {}):
            raise UsageError(f"system {system!r} has two runs for collection {name!r}")
        plan[system][name] = path
    missing = [f"{s}:{c}" for s, by_collection in plan.items() for c in collections if c not in by_collection]
    if missing:
        raise UsageError(f"every system needs a run for every collection (an average over fewer is another average); "
                         f"missing: {', '.join(missing)}")
    return collections, {s: {c: plan[s][c] for c in collections} for s in plan}


def _across(runs, qrels, qrels_split, output, input_format, as_json, as_csv, plot, self_flag, grid, fusion_settings, opts):
    """The BEIR-style table: one row per system (or sweep weight), one column per collection, then the average."""
    if opts["per_query"]:
        raise UsageError("--per-query scores one collection; across collections --json carries each collection's counts")
    named_qrels, plan = collection_plan(qrels, runs)
    systems = list(plan)
    if grid is not None and len(systems) != 2:
        raise UsageError(f"--sweep fuses exactly 2 systems, got {len(systems)}")
    records.check_outputs([output, plot], [*named_qrels.values(), *(p for by in plan.values() for p in by.values())])
    specs = metrics.parse(opts["measures"], opts["capped_recall"])
    settings: dict = {"collections": {}, "capped_recall": opts["capped_recall"]}
    results: dict[tuple, dict[str, metrics.Result]] = {}
    for name, given in named_qrels.items():
        qrels_file = records.resolve(given, "qrels", qrels_split)
        ignore_self = self_flag if self_flag is not None else bool(SELF_CONVENTION.search(qrels_file))
        if self_flag is None and ignore_self:
            log.info("%s: --ignore-self is on: BEIR drops self-hits for ArguAna/Quora (beir#91); --keep-self turns it off", name)
        judged = records.read_qrels(qrels_file)
        loaded = {}
        for system in systems:  # read, check and (without --sweep) score one run at a time
            run_path = plan[system][name]
            run = records.read_run(run_path, input_format)
            across_collections.check_judged(run, judged, run_path=run_path, collection=name, qrels_path=qrels_file)
            if grid is None:
                res = metrics.evaluate(run, judged, specs, ignore_self=ignore_self)
                _log_counts({"run": f"{system} on {name} ({run_path})", "counts": res.counts}, ignore_self)
                results.setdefault((system,), {})[name] = res
            else:
                loaded[system] = run
        if grid is not None:
            for w, fused in fused_runs([loaded[s] for s in systems], grid, **fusion_settings):
                res = metrics.evaluate(fused, judged, specs, ignore_self=ignore_self)
                results.setdefault((f"{w:.10g}", f"{round(1 - w, 10):.10g}"), {})[name] = res
            _log_counts({"run": f"fusion on {name}", "counts": res.counts}, ignore_self)  # the same queries at every weight
        settings["collections"][name] = {"qrels": qrels_file, "ignore_self": ignore_self,
                                         "queries": next(iter(results.values()))[name].counts["evaluated"]}
    described = "; ".join(f"{n} ({c['queries']} queries, qrels {c['qrels']}, ignore_self {'on' if c['ignore_self'] else 'off'})"
                          for n, c in settings["collections"].items())
    header = [f"# collections: {described}  capped_recall: {'on' if opts['capped_recall'] else 'off'}"]
    if grid is None:
        table = across_collections.compare(results, row_header=("system",), alpha=opts["alpha"])
        test = (f"paired t-test vs {systems[0]}: a collection's column over its queries, the average over the queries "
                "of all collections pooled") if len(systems) > 1 else None
        settings.update(alpha=opts["alpha"], test=test)
        if test:
            header.append(f"# *: p < {opts['alpha']:g}, {test}")
        labels = [{"system": s, "runs": plan[s]} for s in systems]
    else:
        table = across_collections.compare(results, row_header=("w_a", "w_b"), alpha=None)
        method = fusion_settings["fusion_method"]
        settings.update(runs={s: plan[s] for s in systems}, fusion=method,
                        **({"rrf_k": fusion_settings["rrf_k"]} if method == "rrf" else {"norm": fusion_settings["norm"]}),
                        depth=fusion_settings["depth"], hits=FUSE_HITS)
        fused_with = f"rrf k={fusion_settings['rrf_k']:g}" if method == "rrf" else f"linear norm={fusion_settings['norm']}"
        header.append(f"# sweep: {fused_with}, w_a on {systems[0]}, w_b on {systems[1]} (no tests: each row is a setting "
                      "of one fusion)")
        labels = [{"weights": [w, round(1 - w, 10)]} for w in grid]
    if plot:
        x = None if grid is None else grid
        across_collections.plot(table, plot, title=f"{', '.join(table.measures)} across {len(named_qrels)} collections",
                                x=x, x_label=f"w_a (weight on {systems[0]}; {systems[1]} gets 1 - w_a)")
    with records.open_output(output) as f:
        if as_json:
            f.writelines(records.dumps({**label, **row, "settings": settings}) + "\n"
                         for label, row in zip(labels, across_collections.json_rows(table), strict=True))
        elif as_csv:
            f.write(across_collections.to_csv(table))
        else:
            f.write(across_collections.text(table, header))


def _single_table(rows: list[dict], names: list[str], collection: str, weights: list[float] | None) -> across_collections.Table:
    """One collection's rows (runs, or a sweep's weights) as a table without tests, for --csv and --plot."""
    labels = [(row["run"],) if weights is None else tuple(f"{x:.10g}" for x in row["weights"]) for row in rows]
    results = {label: {collection: metrics.Result(names, {m: row[m] for m in names}, {}, row["counts"])}
               for label, row in zip(labels, rows, strict=True)}
    header = ("run",) if weights is None else tuple(weight_columns(len(rows[0]["weights"])))
    return across_collections.compare(results, row_header=header, alpha=None)


def _single_csv(rows: list[dict], names: list[str]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    weights = "weights" in rows[0]
    label = weight_columns(len(rows[0]["weights"])) if weights else ["run"]
    writer.writerow([*label, *names, "queries", *([] if weights else ["significant"])])
    for row in rows:
        label = [f"{w:.10g}" for w in row["weights"]] if weights else [row["run"]]
        marks = [] if weights else [";".join(row.get("significant", []))]
        writer.writerow([*label, *(repr(row[m]) for m in names), row["counts"]["evaluated"], *marks])
    return buf.getvalue()


@stage(eval)
@click.argument("runs", nargs=-1, required=True)
@options("output", "input_format")
@click.option("--qrels", multiple=True, metavar="PATH|NAME=PATH", help=QRELS_HELP)  # NAME=PATH: see the docstring
@click.option("--qrels-split", help="Split file of a BEIR folder's qrels/ (default: test, else dev).")
@click.option("-m", "--measure", "measures", multiple=True, help="ir_measures name, repeatable (e.g. -m nDCG@10 -m 'AP(rel=2)').")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run (across collections: per system) and line.")
@click.option("--csv", "as_csv", is_flag=True, help="The table as CSV, at full precision.")
@click.option("--plot", metavar="FILE", help="Also draw the scores to FILE.png, .svg or .pdf: bars per run (and collection), or for "
              "--sweep the measure against the weight; grey-safe.")
@click.option("--per-query", is_flag=True, help="Per-query values (query_id, measure, value), then 'all'.")
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True), help="Significance level of the paired t-test against the first run.")
@click.option("--capped-recall", is_flag=True, help="BEIR's capped recall: R@k as hits@k / min(k, #relevant), named R_cap@k.")
@click.option("--ignore-self/--keep-self", "self_flag", default=None,
              help="Drop retrieved docs whose id equals the query id (default: on for ArguAna/Quora qrels, else off).")
@click.option("--sweep", "sweep_grid", help="Fuse the two runs at weights w, 1-w for w in LO:HI:STEP (e.g. 0:1:0.1; "
              "over more runs w is shared by all but the last); one row per weight; the fusion flags apply to it only.")
@click.option("--sweep-prior", metavar="W|SWEEP", help="A weight of the --sweep grid that the other rows are tested "
              "against (paired t-test at --alpha): `fuse --weights-from` keeps it unless a row beats it significantly. "
              "A file of `eval --sweep --json` instead of W: the weight `fuse --weights-from` takes from it.")
@click.option("--known-items", "known_from", metavar="QRELS|SWEEP", help="Queries cut from the one document they judge "
              "(`retrctl crop`): where the sweep's dense side (every run but the last, fused equally) scores below half "
              "of the last run on them (nDCG@10), it cannot read the corpus and the prior is 0, the last run alone. A "
              "sweep file made with it instead: that sweep's verdict (the model a trained one started from).")
@options("fusion")
def command(runs, qrels, qrels_split, output, input_format, as_json, as_csv, plot, self_flag, sweep_grid, sweep_prior,
            known_from, fusion_method, rrf_k, norm, depth, **opts):
    """Score runs (TREC, JSONL, Parquet) against qrels; several runs are compared with the first (--sweep: two runs
    fused over a weight grid). Across collections (BEIR's table): --qrels NAME=PATH per collection and runs as
    SYSTEM:NAME=RUN."""
    if not qrels:
        raise UsageError("--qrels is required")
    if as_csv and (as_json or opts["per_query"]):
        raise UsageError("--csv is the table as CSV: --json and --per-query are other outputs")
    if plot:
        try:
            plots.check_path(plot)
        except ValueError as e:
            raise UsageError(str(e), flag="--plot") from None
        if output != "-" and os.path.realpath(output) == os.path.realpath(plot):
            raise UsageError("--plot and -o name the same file", flag="--plot")
    grid = None
    ctx = click.get_current_context()
    sweep_prior, prior_from = _prior(sweep_prior)
    across = len(qrels) > 1 or bool(NAMED_QRELS.match(qrels[0]))
    if sweep_grid is None:
        stray = [f"--{n.replace('_', '-')}" for n in ("fusion_method", "rrf_k", "norm", "depth", "sweep_prior")
                 if ctx.get_parameter_source(n).name == "COMMANDLINE"] + (["--known-items"] if known_from else [])
        if stray:
            raise UsageError(f"{', '.join(stray).replace('--fusion-method', '--fusion')} only apply with --sweep")
    else:
        try:
            grid = fusion.parse_grid(sweep_grid)
        except ValueError as e:
            raise UsageError(str(e), flag="--sweep") from None
        if len(runs) < 2 and not across:
            raise UsageError(f"--sweep fuses 2 or more runs, got {len(runs)}")
        if opts["per_query"] or (ctx.get_parameter_source("alpha").name == "COMMANDLINE" and sweep_prior is None):
            raise UsageError("--sweep prints one row per weight: --per-query does not apply, nor --alpha without "
                             "--sweep-prior")
        if sweep_prior is not None and sweep_prior not in grid:
            raise UsageError(f"{sweep_prior:g} is not a weight of --sweep {sweep_grid}", flag="--sweep-prior")
        if sweep_prior is not None and across:
            raise UsageError("--sweep-prior tests the weights of one collection's sweep", flag="--sweep-prior")
        if known_from and sweep_prior is None:
            raise UsageError("--known-items moves --sweep-prior's weight: give both", flag="--known-items")
        if known_from and 0 not in grid:
            raise UsageError(f"--sweep {sweep_grid} lacks the weight 0 that --known-items may move the prior to",
                             flag="--known-items")
    try:
        names = [s.name for s in metrics.parse(opts["measures"], opts["capped_recall"])]
    except ValueError as e:
        raise UsageError(str(e), flag="-m / --measure") from None
    fusion_method, norm, rrf_k = fusion.with_defaults(fusion_method, norm, rrf_k)
    fusion_settings = {"fusion_method": fusion_method, "rrf_k": rrf_k, "norm": norm, "depth": depth}
    if across:
        return _across(runs, qrels, qrels_split, output, input_format, as_json, as_csv, plot, self_flag, grid,
                       fusion_settings, opts)
    qrels_file = records.resolve(qrels[0], "qrels", qrels_split)
    collection = os.path.basename(os.path.normpath(qrels[0]))
    ignore_self = self_flag if self_flag is not None else bool(SELF_CONVENTION.search(qrels_file))
    if self_flag is None and ignore_self:
        log.info("--ignore-self is on: BEIR drops self-hits for ArguAna/Quora (beir#91); --keep-self turns it off")
    judged = records.read_qrels(qrels_file)
    header = (f"# qrels: {qrels_file}  ignore_self: {'on' if ignore_self else 'off'}  capped_recall: "
              f"{'on' if opts['capped_recall'] else 'off'}")
    if grid is not None:
        opts = {k: v for k, v in opts.items() if k != "per_query" and (k != "alpha" or sweep_prior is not None)}
        loaded = [records.read_run(p, input_format) for p in runs]
        verdict = None
        if known_from:
            verdict = _known_verdict(known_from, loaded, qrels_split, fusion_settings, ignore_self)
            if not verdict["reads"]:
                sweep_prior = 0.0
        rows = sweep(loaded, judged, grid, fusion_method=fusion_method, rrf_k=rrf_k, norm=norm, depth=depth,
                     prior=sweep_prior, ignore_self=ignore_self, **opts)
        settings = {"qrels": qrels_file, "ignore_self": ignore_self, "capped_recall": opts["capped_recall"], "runs": list(runs),
                    "fusion": fusion_method, **({"rrf_k": rrf_k} if fusion_method == "rrf" else {"norm": norm}),
                    "depth": depth, "hits": FUSE_HITS,
                    **({"prior": sweep_prior, "alpha": opts["alpha"], "test": "paired t-test vs the prior's row"}
                       if sweep_prior is not None else {}), **({"prior_from": prior_from} if prior_from else {}),
                    **({"known_items": verdict} if verdict else {})}
        _log_counts(rows[0], ignore_self)  # the same queries at every weight
        fused_with = f"rrf k={rrf_k:g}" if fusion_method == "rrf" else f"linear norm={norm}"
        on = zip(weight_columns(len(runs)), runs, strict=True)
        header += f"  sweep: {fused_with}, " + ", ".join(f"{c} on {r}" for c, r in on)
        if plot:
            shared = f"w_a (weight on {runs[0]}" if len(runs) == 2 else f"w (weight shared by {', '.join(runs[:-1])}"
            across_collections.plot(_single_table(rows, names, collection, grid), plot, title=f"sweep on {collection}",
                                    x=grid, x_label=f"{shared}; {runs[-1]} gets 1 - w)")
        with records.open_output(output) as f:
            if as_json:
                f.writelines(records.dumps({**row, "settings": settings}) + "\n" for row in rows)
            elif as_csv:
                f.write(_single_csv(rows, names))
            else:
                f.write(_sweep_table(rows, names, header))
        return
    rows = eval(((p, records.read_run(p, input_format)) for p in runs), judged, ignore_self=ignore_self, **opts)
    settings = {"qrels": qrels_file, "ignore_self": ignore_self, "capped_recall": opts["capped_recall"], "alpha": opts["alpha"],
                "test": f"paired t-test vs {runs[0]}" if len(runs) > 1 else None}
    for row in rows:
        _log_counts(row, ignore_self)
    if len(runs) > 1:
        header += f"  *: p < {opts['alpha']:g}, paired t-test vs {runs[0]}"
    if plot:
        across_collections.plot(_single_table(rows, names, collection, None), plot, title=collection)
    with records.open_output(output) as f:
        if as_json:
            f.writelines(records.dumps({**row, "settings": settings}) + "\n" for row in rows)
        elif as_csv:
            f.write(_single_csv(rows, names))
        elif opts["per_query"]:
            f.write(_per_query_rows(rows, names, header))
        else:
            f.write(_table(rows, names, header))
