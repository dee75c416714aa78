"""Evaluation across collections as BEIR reports it: one row per system, one column per collection, and the
average of the collections' means (every collection weighs the same, whatever its number of queries).

Inputs are already-scored runs (``metrics.Result``, one per system and collection); nothing here reads a file.
Significance, against the first row (the baseline), with ``metrics.paired_ttest`` (two-sided paired t-test,
scipy.stats.ttest_rel):
- a collection's column: over that collection's judged queries, as ``retrctl eval`` does on one collection;
- the average column: over the judged queries of all collections pooled (query ids kept apart by collection).
  That test asks whether the per-query differences are centred on zero over the pooled queries, so it weighs a
  collection by its number of queries, while the average weighs each collection equally.
A table made without tests (a fusion sweep: its rows are settings of one fusion) carries no p-values.

Output forms share one layout, ``measure  <row labels>  <collections…>  average``: ``text`` (aligned, 4
decimals, ``*`` marks p < alpha), ``csv`` (full precision, a ``significant`` column naming the marked columns),
``json_rows`` (one object per row) and ``plot`` (grouped bars, or for a sweep the measure against the weight).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from retrctl import metrics, plots
from retrctl.errors import RecordError

AVERAGE = "average"


def check_judged(run: Mapping, qrels: Mapping, *, run_path: str, collection: str, qrels_path: str) -> None:
    """A run none of whose queries is judged in its collection's qrels would average in as a zero: it is bad input
    (most likely a run of another collection, or query ids spelled otherwise), named with its collection."""
    judged = {q for q, docs in qrels.items() if docs}
    if not any(str(q) in judged for q in run):
        example = next(iter(run), None)
        raise RecordError(run_path, message=f"none of its {len(run)} queries (e.g. {example!r}) is judged in collection "
                          f"{collection!r} ({qrels_path}): is it a run of another collection?")


@dataclass
class Table:
    """Scores of rows (systems, or a sweep's weights) on collections, their averages and, for rows after the
    first, p-values against the first.

    rows: each row's label cells (one per ``row_header`` entry), in order; means[row][column][measure] with
    column a collection or ``AVERAGE``; counts[row][collection]: metrics' counts; p_value[row][column][measure]
    for every row but the first when the table was built with tests (``alpha`` is then set)."""

    row_header: tuple[str, ...]
    rows: list[tuple[str, ...]]
    collections: list[str]
    measures: list[str]
    means: dict[tuple, dict[str, dict[str, float]]]
    counts: dict[tuple, dict[str, dict]]
    p_value: dict[tuple, dict[str, dict[str, float]]] = field(default_factory=dict)
    alpha: float | None = None

    @property
    def columns(self) -> list[str]:
        return [*self.collections, AVERAGE]

    def significant(self, row: tuple, column: str, measure: str) -> bool:
        p = self.p_value.get(row, {}).get(column, {}).get(measure)
        return self.alpha is not None and p is not None and p < self.alpha


def compare(results: Mapping[tuple, Mapping[str, metrics.Result]], *, row_header: Sequence[str] = ("system",),
            alpha: float | None = 0.05) -> Table:
    """The table of ``results[row][collection]`` (every row scored on the same collections, in the same order, and
    with the same measures). ``alpha=None`` builds it without tests."""
    rows = list(results)
    if not rows:
        raise ValueError("no rows to compare")
    collections = list(results[rows[0]])
    for row in rows:
        if list(results[row]) != collections:
            raise ValueError(f"row {row} is scored on {list(results[row])}, the first on {collections}")
    measures = results[rows[0]][collections[0]].measures
    means, counts, p_value = {}, {}, {}
    for row in rows:
        per = {c: dict(results[row][c].mean) for c in collections}
        per[AVERAGE] = {m: sum(per[c][m] for c in collections) / len(collections) for m in measures}
        means[row] = per
        counts[row] = {c: dict(results[row][c].counts) for c in collections}
    if alpha is not None:
        base = rows[0]
        pooled_base = pooled(results[base])
        for row in rows[1:]:
            tests = {c: metrics.paired_ttest(results[base][c], results[row][c]) for c in collections}
            tests[AVERAGE] = metrics.paired_ttest(pooled_base, pooled(results[row]))
            p_value[row] = tests
    return Table(tuple(row_header), rows, collections, list(measures), means, counts, p_value, alpha)


def pooled(per_collection: Mapping[str, metrics.Result]) -> metrics.Result:
    """The judged queries of every collection as one result (ids ``collection<TAB>query``), for the pooled test."""
    first = next(iter(per_collection.values()))
    per_query = {f"{c}\t{q}": vals for c, res in per_collection.items() for q, vals in res.per_query.items()}
    return metrics.Result(first.measures, {}, per_query)


# ---------------------------------------------------------------- output forms


def _cells(table: Table, mark: bool) -> list[list[str]]:
    out = [["measure", *table.row_header, *table.columns]]
    for m in table.measures:
        for row in table.rows:
            values = [f"{table.means[row][c][m]:.4f}" + ("*" if mark and table.significant(row, c, m) else "")
                      for c in table.columns]
            out.append([m, *row, *values])
    return out


def text(table: Table, header: Sequence[str] = ()) -> str:
    """The aligned table after ``#`` header lines: labels left, numbers right, ``*`` where p < alpha."""
    cells = _cells(table, mark=True)
    labels = 1 + len(table.row_header)
    widths = [max(len(r[c]) for r in cells) for c in range(len(cells[0]))]
    lines = ["  ".join(v.ljust(w) if c < labels else v.rjust(w) for c, (v, w) in enumerate(zip(r, widths, strict=True))).rstrip()
             for r in cells]
    return "".join(f"{h}\n" for h in header) + "\n".join(lines) + "\n"


def to_csv(table: Table) -> str:
    """The table as CSV at full precision; ``significant`` lists the columns where p < alpha (``;``-separated)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["measure", *table.row_header, *table.columns, "significant"])
    for m in table.measures:
        for row in table.rows:
            marked = [c for c in table.columns if table.significant(row, c, m)]
            writer.writerow([m, *row, *(repr(table.means[row][c][m]) for c in table.columns), ";".join(marked)])
    return buf.getvalue()


def json_rows(table: Table) -> list[dict]:
    """One object per row: ``{"collections": {name: {<measure>: mean, "counts", "p_value", "significant"}},
    "average": {<measure>: mean}, "p_value": {<measure>: p}, "significant": [measures]}`` (p-values on rows after
    the first of a table with tests; the average's are the pooled test's). The caller adds the row's label."""
    out = []
    for row in table.rows:
        obj: dict = {"collections": {}, "average": dict(table.means[row][AVERAGE])}
        tests = table.p_value.get(row)
        for c in table.collections:
            cell = {**table.means[row][c], "counts": table.counts[row][c]}
            if tests:
                cell["p_value"] = tests[c]
                cell["significant"] = [m for m in table.measures if table.significant(row, c, m)]
            obj["collections"][c] = cell
        if tests:
            obj["p_value"] = tests[AVERAGE]
            obj["significant"] = [m for m in table.measures if table.significant(row, AVERAGE, m)]
        out.append(obj)
    return out


def plot(table: Table, path, *, title: str = "", x: Sequence[float] | None = None, x_label: str = "") -> None:
    """One panel per measure. Without ``x``: grouped bars, a cluster per collection (and the average, set apart),
    a bar per row, labelled ``row_label``. With ``x`` (one value per row, e.g. a sweep's weight): the measure
    against x, one line per collection and a bold one for the average. One collection: no average (it is the
    collection)."""
    plt = plots.pyplot()
    several = len(table.collections) > 1
    columns = table.columns if several else table.collections
    n = len(table.measures)
    with plt.rc_context(plots.GREY_RC):
        if x is None:
            width = max(6.0, 1.0 + 0.45 * len(columns) * max(len(table.rows), 2))
            fig, axes = plt.subplots(n, 1, figsize=(width, 2.8 * n), squeeze=False)
            for ax, m in zip(axes[:, 0], table.measures, strict=True):
                series = {row_label(table, row): [table.means[row][c][m] for c in columns] for row in table.rows}
                plots.grouped_bars(ax, columns, series)
                if several:
                    ax.axvline(len(table.collections) - 0.5, color="0.3", linewidth=0.8, linestyle=":")
                ax.set_ylabel(m)
        else:
            fig, axes = plt.subplots(n, 1, figsize=(7.0, 2.8 * n), squeeze=False)
            for ax, m in zip(axes[:, 0], table.measures, strict=True):
                series = {c: [table.means[row][c][m] for row in table.rows] for c in columns}
                plots.lines(ax, list(x), series, emphasize=AVERAGE)
                ax.set_ylabel(m)
                ax.set_xlabel(x_label)
        if title:
            axes[0, 0].set_title(title)
        fig.tight_layout()
    plots.save_figure(fig, path)


def row_label(table: Table, row: tuple) -> str:
    """A row's legend label: its label cells joined (a system's name, or ``w_a=0.3 w_b=0.7``)."""
    if len(row) == 1:
        return row[0]
    return " ".join(f"{h}={v}" for h, v in zip(table.row_header, row, strict=True))
