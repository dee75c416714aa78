"""Figures that read when printed in grey: matplotlib on its headless Agg backend, saved atomically.

Colour never carries meaning alone here: bars differ by grey level *and* hatch, lines by grey level, dash and
marker, so a figure printed on a black-and-white printer (or read by someone who cannot tell red from green)
says the same thing. matplotlib is imported only when a figure is drawn (``pyplot()``), so importing this module
costs nothing.

- ``pyplot()``: matplotlib.pyplot on the Agg backend (no display needed).
- ``GREY_RC``: rcParams for every figure here (``with plt.rc_context(GREY_RC):``).
- ``bar_style(i)`` / ``line_style(i)``: the i-th series' look (face grey + hatch; grey + dash + marker).
- ``grouped_bars(ax, groups, series)``: one cluster of bars per group, one bar per series, labelled legend.
- ``lines(ax, x, series, emphasize=None)``: one line per series over shared x values (one drawn bolder).
- ``check_path(path)``: the format a figure path asks for (.png, .svg, .pdf), ValueError otherwise.
- ``save_figure(fig, path)``: written (with ``SAVE_RC``: 150 dpi, tight box, SVG text kept as text) to a
  temporary file beside ``path`` and renamed into place, then closed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from retrctl.records import atomic_path

FORMATS = ("png", "svg", "pdf")

# grey levels with a hatch each: neighbours differ in both, so no two bars look alike in grey; no face darker
# than 0.4, so the black hatch stays visible on every bar
_BAR_GREYS = ("0.95", "0.68", "0.48", "0.85", "0.58", "0.40")
_HATCHES = ("", "///", "...", "xx", "\\\\", "++", "oo", "--")
_LINE_GREYS = ("0.0", "0.45", "0.25", "0.6", "0.1", "0.35")
_DASHES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")

GREY_RC = {
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "axes.edgecolor": "0.2",
    "axes.grid": True,
    "axes.grid.axis": "y",
    "grid.color": "0.85",
    "grid.linewidth": 0.6,
    "axes.axisbelow": True,
    "hatch.color": "0.1",
    "hatch.linewidth": 0.8,
}
# applied by save_figure, whatever style drew the figure
SAVE_RC = {
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
    "svg.fonttype": "none",  # SVG keeps text as text: searchable, and legends can be read back
}


def pyplot():
    """matplotlib.pyplot on the Agg backend: figures render without a display, in any process."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bar_style(i: int) -> dict:
    """The i-th bar series' keyword arguments for ``ax.bar``: a face grey and a hatch, black edges."""
    return {"color": _BAR_GREYS[i % len(_BAR_GREYS)], "hatch": _HATCHES[i % len(_HATCHES)], "edgecolor": "0.1",
            "linewidth": 0.7}


def line_style(i: int) -> dict:
    """The i-th line series' keyword arguments for ``ax.plot``: a grey, a dash pattern and a marker."""
    return {"color": _LINE_GREYS[i % len(_LINE_GREYS)], "linestyle": _DASHES[i % len(_DASHES)],
            "marker": _MARKERS[i % len(_MARKERS)], "markersize": 4, "linewidth": 1.3}


def grouped_bars(ax, groups: Sequence[str], series: Mapping[str, Sequence[float]], *, value_labels: bool = True) -> None:
    """One cluster per group, one bar per series within it (in the mapping's order), each series in its
    ``bar_style``; a legend names every series. ``value_labels`` writes each bar's value above it."""
    n = max(len(series), 1)
    width = 0.8 / n
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        bars = ax.bar(xs, values, width, label=label, **bar_style(i))
        if value_labels:
            ax.bar_label(bars, fmt="%.3f", fontsize=6, rotation=90, padding=2)
    ax.set_xticks(range(len(groups)), groups)
    top = max((v for values in series.values() for v in values), default=1.0)
    ax.set_ylim(0, top * 1.18 if top > 0 else 1.0)  # room for the value labels
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def lines(ax, x: Sequence[float], series: Mapping[str, Sequence[float]], *, emphasize: str | None = None) -> None:
    """One line per series over the shared x values, each in its ``line_style``; the series named ``emphasize``
    (e.g. an average) is drawn solid, black and thicker. A legend names every series."""
    others = 0
    for label, values in series.items():
        if label == emphasize:
            style = {**line_style(0), "color": "0.0", "linestyle": "-", "linewidth": 2.4, "markersize": 5}
        else:
            style = line_style(others + (emphasize is not None))
            others += 1
        ax.plot(x, values, label=label, **style)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def check_path(path) -> str:
    """The format a figure path asks for, from its extension; ValueError for any other."""
    ext = os.path.splitext(str(path))[1].lower().lstrip(".")
    if ext not in FORMATS:
        raise ValueError(f"a figure path must end in {', '.join('.' + f for f in FORMATS)}, got {str(path)!r}")
    return ext


def save_figure(fig, path) -> None:
    """Write ``fig`` to ``path`` (format from the extension) through a temporary file renamed into place, so a
    reader never sees half a figure; the figure is closed afterwards."""
    fmt = check_path(path)
    plt = pyplot()
    try:
        with atomic_path(path, suffix="." + fmt) as tmp, plt.rc_context(SAVE_RC):
            fig.savefig(tmp, format=fmt)
    finally:
        plt.close(fig)
