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
is a setting of one fusion, not a run to compare with the first).

Deviations: ``--ignore-self`` is on by default when the qrels path names ArguAna or Quora, BEIR's datasets
whose queries are corpus documents (their published numbers drop self-hits, beir#91, beir#206), with a note on
stderr; ``--keep-self`` turns it off. Elsewhere it is off, as in trec_eval.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import click

from retrctl import fusion, metrics, records
from retrctl.errors import UsageError
from retrctl.stage import options, stage

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


def sweep(run_a: dict, run_b: dict, qrels: dict, grid: list[float], *, fusion_method: str = fusion.METHOD,
          rrf_k: float = fusion.RRF_K, norm: str = fusion.NORM, depth: int | None = None, **opts) -> list[dict]:
    """One row per grid weight w: ``eval`` of the two runs fused with weights (w, 1 - w), plus ``"weights"``.
    Fused runs are made one at a time, as eval consumes them."""
    def fused():
        for w in grid:
            ws = [w, round(1 - w, 10)]
            yield f"{fusion_method}:{ws[0]:g},{ws[1]:g}", fusion.fuse([run_a, run_b], fusion_method, rrf_k, ws, norm, depth, FUSE_HITS)

    rows = eval(fused(), qrels, **opts)
    for w, row in zip(grid, rows, strict=True):
        row.pop("p_value", None)
        row.pop("significant", None)
        row["weights"] = [w, round(1 - w, 10)]
    return rows


def _sweep_table(rows: list[dict], names: list[str], header: str) -> str:
    out = [header, "\t".join(["w_a", "w_b", *names, "queries"])]
    for row in rows:
        out.append("\t".join([*(f"{w:g}" for w in row["weights"]), *(f"{row[m]:.4f}" for m in names), str(row["counts"]["evaluated"])]))
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


@stage(eval)
@click.argument("runs", nargs=-1, required=True)
@options("qrels", "output", "input_format")
@click.option("--qrels-split", help="Split file of a BEIR folder's qrels/ (default: test, else dev).")
@click.option("-m", "--measure", "measures", multiple=True, help="ir_measures name, repeatable (e.g. -m nDCG@10 -m 'AP(rel=2)').")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run and line instead of a table.")
@click.option("--per-query", is_flag=True, help="Per-query values (query_id, measure, value), then 'all'.")
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True), help="Significance level of the paired t-test against the first run.")
@click.option("--capped-recall", is_flag=True, help="BEIR's capped recall: R@k as hits@k / min(k, #relevant), named R_cap@k.")
@click.option("--ignore-self/--keep-self", "self_flag", default=None,
              help="Drop retrieved docs whose id equals the query id (default: on for ArguAna/Quora qrels, else off).")
@click.option("--sweep", "sweep_grid", help="Fuse the two runs at weights w, 1-w for w in LO:HI:STEP (e.g. 0:1:0.1); one "
              "row per weight; the fusion flags apply to it only.")
@options("fusion")
def command(runs, qrels, qrels_split, output, input_format, as_json, self_flag, sweep_grid, fusion_method, rrf_k, norm, depth,
            **opts):
    """Score runs (TREC, JSONL, Parquet) against qrels; several runs are compared with the first (--sweep: two runs
    fused over a weight grid)."""
    if not qrels:
        raise UsageError("--qrels is required")
    grid = None
    ctx = click.get_current_context()
    if sweep_grid is None:
        stray = [f"--{n.replace('_', '-')}" for n in ("fusion_method", "rrf_k", "norm", "depth")
                 if ctx.get_parameter_source(n).name == "COMMANDLINE"]
        if stray:
            raise UsageError(f"{', '.join(stray).replace('--fusion-method', '--fusion')} only apply with --sweep")
    else:
        try:
            grid = fusion.parse_grid(sweep_grid)
        except ValueError as e:
            raise UsageError(str(e), flag="--sweep") from None
        if len(runs) != 2:
            raise UsageError(f"--sweep fuses exactly 2 runs, got {len(runs)}")
        if ctx.get_parameter_source("alpha").name == "COMMANDLINE" or opts["per_query"]:
            raise UsageError("--sweep prints one row per weight: --alpha and --per-query do not apply")
    try:
        names = [s.name for s in metrics.parse(opts["measures"], opts["capped_recall"])]
    except ValueError as e:
        raise UsageError(str(e), flag="-m / --measure") from None
    qrels_file = records.resolve(qrels, "qrels", qrels_split)
    ignore_self = self_flag if self_flag is not None else bool(SELF_CONVENTION.search(qrels_file))
    if self_flag is None and ignore_self:
        log.info("--ignore-self is on: BEIR drops self-hits for ArguAna/Quora (beir#91); --keep-self turns it off")
    judged = records.read_qrels(qrels_file)
    header = (f"# qrels: {qrels_file}  ignore_self: {'on' if ignore_self else 'off'}  capped_recall: "
              f"{'on' if opts['capped_recall'] else 'off'}")
    if grid is not None:
        run_a, run_b = (records.read_run(p, input_format) for p in runs)
        opts = {k: v for k, v in opts.items() if k not in ("alpha", "per_query")}
        fusion_method, norm, rrf_k = fusion.with_defaults(fusion_method, norm, rrf_k)
        rows = sweep(run_a, run_b, judged, grid, fusion_method=fusion_method, rrf_k=rrf_k, norm=norm, depth=depth,
                     ignore_self=ignore_self, **opts)
        settings = {"qrels": qrels_file, "ignore_self": ignore_self, "capped_recall": opts["capped_recall"], "runs": list(runs),
                    "fusion": fusion_method, **({"rrf_k": rrf_k} if fusion_method == "rrf" else {"norm": norm}),
                    "depth": depth, "hits": FUSE_HITS}
        _log_counts(rows[0], ignore_self)  # the same queries at every weight
        fused_with = f"rrf k={rrf_k:g}" if fusion_method == "rrf" else f"linear norm={norm}"
        header += f"  sweep: {fused_with}, w_a on {runs[0]}, w_b on {runs[1]}"
        with records.open_output(output) as f:
            if as_json:
                f.writelines(records.dumps({**row, "settings": settings}) + "\n" for row in rows)
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
    with records.open_output(output) as f:
        if as_json:
            f.writelines(records.dumps({**row, "settings": settings}) + "\n" for row in rows)
        elif opts["per_query"]:
            f.write(_per_query_rows(rows, names, header))
        else:
            f.write(_table(rows, names, header))

