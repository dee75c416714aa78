"""eval across collections (BEIR's table): per-collection columns equal the single-collection eval, the average
is the mean of the collections' means, the average's test is the pooled paired t-test; JSON, CSV and the table
agree; the plot opens and names every system; a run matching no query of its collection exits 2 naming both."""

import csv
import io
import json
import random
import re

import pytest
from scipy import stats

from retrctl import across_collections, metrics, plots

COLLECTIONS = {"alpha": 30, "beta": 18, "gamma": 24}  # name -> judged queries: unequal, so macro != pooled mean
SYSTEMS = {"weak": 0.25, "strong": 0.9, "mid": 0.5}  # name -> how far the relevant doc's score is lifted


def write_trec(path, run):
    path.write_text("".join(f"{q} Q0 {d} {i} {s} t\n" for q, docs in run.items()
                            for i, (d, s) in enumerate(sorted(docs.items(), key=lambda x: -x[1]), 1)))
    return path


@pytest.fixture
def three(tmp_path):
    """Three collections with graded qrels and three systems of different strength; some judged queries are
    missing from some runs (they score 0, as trec_eval -c)."""
    rng = random.Random(7)
    qrels_paths, run_paths = {}, {}
    for c, n in COLLECTIONS.items():
        qrels = {f"q{i}": {f"r{i}": rng.choice([1, 2]), f"s{i}": rng.choice([0, 1])} for i in range(n)}
        qrels_paths[c] = tmp_path / f"{c}.qrels"
        qrels_paths[c].write_text("".join(f"{q} 0 {d} {r}\n" for q, j in qrels.items() for d, r in j.items()))
        for s, lift in SYSTEMS.items():
            run = {}
            for i, q in enumerate(qrels):
                if rng.random() < 0.1:
                    continue  # a judged query this run does not answer
                docs = {f"n{j}": round(rng.random(), 3) for j in range(12)}
                docs[f"r{i}"] = round(rng.random() + lift, 3)
                docs[f"s{i}"] = round(rng.random(), 3)
                run[q] = docs
            run_paths[s, c] = write_trec(tmp_path / f"{s}-{c}.trec", run)
    args = [a for c, p in qrels_paths.items() for a in ("--qrels", f"{c}={p}")]
    args += [f"{s}:{c}={run_paths[s, c]}" for s in SYSTEMS for c in COLLECTIONS]
    return {"args": args, "qrels": qrels_paths, "runs": run_paths, "dir": tmp_path}


MEASURES = ["-m", "nDCG@10", "-m", "RR@10", "-m", "AP"]
NAMES = ["nDCG@10", "RR@10", "AP"]


def test_columns_are_the_single_collection_eval_and_the_average_is_their_mean(three, runner):
    res = runner("eval", *three["args"], *MEASURES, "--json")
    assert res.exit_code == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["system"] for r in rows] == list(SYSTEMS)
    for row in rows:
        assert list(row["collections"]) == list(COLLECTIONS)
        for c in COLLECTIONS:
            single = runner("eval", three["runs"][row["system"], c], "--qrels", three["qrels"][c], *MEASURES, "--json")
            assert single.exit_code == 0, single.stderr
            want = json.loads(single.stdout)
            assert {m: row["collections"][c][m] for m in NAMES} == {m: want[m] for m in NAMES}
            assert row["collections"][c]["counts"] == want["counts"] and row["runs"][c] == str(three["runs"][row["system"], c])
        for m in NAMES:  # by hand: the mean of the three collections' means (BEIR's average)
            by_hand = (row["collections"]["alpha"][m] + row["collections"]["beta"][m] + row["collections"]["gamma"][m]) / 3
            assert row["average"][m] == pytest.approx(by_hand, abs=1e-12)
    assert rows[0]["settings"]["collections"]["beta"]["queries"] == 18
    assert "p_value" not in rows[0] and rows[1]["significant"] == NAMES  # strong vs weak: every measure moves


def test_tests_are_per_collection_and_pooled_for_the_average(three, runner):
    res = runner("eval", *three["args"], *MEASURES, "--json")
    rows = {r["system"]: r for r in map(json.loads, res.stdout.splitlines())}

    def per_query(system, c):
        out = runner("eval", three["runs"][system, c], "--qrels", three["qrels"][c], *MEASURES, "--json", "--per-query")
        return json.loads(out.stdout)["per_query"]

    pooled = {s: [] for s in ("weak", "mid")}
    for c in COLLECTIONS:
        base, other = per_query("weak", c), per_query("mid", c)
        qids = sorted(base)
        want = stats.ttest_rel([base[q]["AP"] for q in qids], [other[q]["AP"] for q in qids]).pvalue
        assert rows["mid"]["collections"][c]["p_value"]["AP"] == pytest.approx(want)
        pooled["weak"] += [base[q]["AP"] for q in qids]
        pooled["mid"] += [other[q]["AP"] for q in qids]
    assert rows["mid"]["p_value"]["AP"] == pytest.approx(stats.ttest_rel(pooled["weak"], pooled["mid"]).pvalue)


def parse_table(text):
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    return [line.split() for line in lines]


def test_table_and_csv_say_the_same(three, runner):
    table = runner("eval", *three["args"], *MEASURES)
    as_csv = runner("eval", *three["args"], *MEASURES, "--csv")
    assert table.exit_code == as_csv.exit_code == 0, table.stderr + as_csv.stderr
    head = table.stdout.splitlines()[:2]
    assert head[0].startswith("# collections: alpha (30 queries") and "ignore_self off" in head[0]
    assert head[1].startswith("# *: p < 0.05, paired t-test vs weak") and "pooled" in head[1]
    cells = parse_table(table.stdout)
    rows = list(csv.reader(io.StringIO(as_csv.stdout)))
    assert cells[0] == ["measure", "system", "alpha", "beta", "gamma", "average"]
    assert rows[0] == [*cells[0], "significant"]
    assert len(cells) == len(rows) == 1 + len(NAMES) * len(SYSTEMS)
    for printed, row in zip(cells[1:], rows[1:], strict=True):
        assert printed[:2] == row[:2]
        marked = [col for col, v in zip(cells[0][2:], printed[2:], strict=True) if v.endswith("*")]
        assert [f"{float(v):.4f}" for v in row[2:6]] == [v.rstrip("*") for v in printed[2:]]
        assert row[6] == ";".join(marked)
    assert [r[1] for r in rows[1:4]] == list(SYSTEMS) and {r[0] for r in rows[1:4]} == {"nDCG@10"}


def svg_texts(path):
    return re.findall(r"<text[^>]*>([^<]*)</text>", path.read_text())


def test_plot_opens_and_names_every_system(three, runner):
    png, svg = three["dir"] / "bars.png", three["dir"] / "bars.svg"
    for path in (png, svg):
        res = runner("eval", *three["args"], *MEASURES, "--plot", path, "-o", three["dir"] / "table.txt")
        assert res.exit_code == 0, res.stderr
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.shape[0] > 200 and image.shape[1] > 200
    texts = svg_texts(svg)
    assert svg.read_text().startswith("<?xml") and "<svg" in svg.read_text()[:500]
    for name in [*SYSTEMS, *COLLECTIONS, "average", *NAMES]:
        assert name in texts, name
    assert not list(three["dir"].glob(".*tmp*"))  # the atomic save left nothing behind


def test_sweep_across_collections_is_each_collections_sweep_and_plots_lines(three, runner):
    runs, qrels = three["runs"], three["qrels"]
    args = [a for c in COLLECTIONS for a in ("--qrels", f"{c}={qrels[c]}")]
    args += [f"{s}:{c}={runs[s, c]}" for s in ("weak", "strong") for c in COLLECTIONS]
    svg = three["dir"] / "sweep.svg"
    res = runner("eval", *args, "-m", "nDCG@10", "--sweep", "0:1:0.25", "--fusion", "rrf", "--json", "--plot", svg)
    assert res.exit_code == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["weights"] for r in rows] == [[0.0, 1.0], [0.25, 0.75], [0.5, 0.5], [0.75, 0.25], [1.0, 0.0]]
    for c in COLLECTIONS:
        one = runner("eval", runs["weak", c], runs["strong", c], "--qrels", qrels[c], "-m", "nDCG@10", "--sweep", "0:1:0.25",
                     "--fusion", "rrf", "--json")
        assert [r["collections"][c]["nDCG@10"] for r in rows] == [json.loads(x)["nDCG@10"] for x in one.stdout.splitlines()]
    for r in rows:
        assert r["average"]["nDCG@10"] == pytest.approx(sum(r["collections"][c]["nDCG@10"] for c in COLLECTIONS) / 3)
        assert "p_value" not in r and r["settings"]["fusion"] == "rrf"
    texts = svg_texts(svg)
    assert all(name in texts for name in [*COLLECTIONS, "average"])
    table = runner("eval", *args, "-m", "nDCG@10", "--sweep", "0:1:0.25")
    assert parse_table(table.stdout)[0] == ["measure", "w_a", "w_b", "alpha", "beta", "gamma", "average"]
    assert "# sweep:" in table.stdout


# ---------------------------------------------------------------- bad input and usage


def test_a_run_matching_no_query_of_its_collection_exits_2_naming_run_and_collection(three, runner, tmp_path):
    stray = write_trec(tmp_path / "other.trec", {"x1": {"d": 1.0}, "x2": {"d": 0.5}})
    args = [a.replace(str(three["runs"]["mid", "beta"]), str(stray)) for a in three["args"]]
    out = tmp_path / "table.txt"
    res = runner("eval", *args, "-o", out, "--plot", tmp_path / "p.png")
    assert res.exit_code == 2 and res.stdout == ""
    line = res.stderr.strip().splitlines()[-1]  # after the counts of the runs scored before it
    assert line.startswith(f"retrctl eval: {stray}: none of its 2 queries") and "collection 'beta'" in line, line
    assert not out.exists() and not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("change, expect", [
    (lambda a: [x for x in a if not x.startswith("mid:gamma=")], "missing: mid:gamma"),
    (lambda a: [*a, a[-1]], "has two runs for collection"),
    (lambda a: [x.replace("weak:alpha=", "weak:delta=") for x in a], "names collection 'delta'"),
    (lambda a: [x.replace("weak:alpha=", "") for x in a], "every run is SYSTEM:NAME=RUN"),
    (lambda a: [x.replace("beta=", "") if x.startswith("beta=") else x for x in a], "every --qrels is NAME=PATH"),
    (lambda a: [*a, "--per-query"], "--per-query scores one collection"),
    (lambda a: [*a, "--sweep", "0:1:0.5"], "--sweep fuses exactly 2 systems, got 3"),
    (lambda a: [*a, "--plot", "fig.jpg"], "must end in .png, .svg, .pdf"),
    (lambda a: [*a, "--csv", "--json"], "--csv is the table as CSV"),
])
def test_usage_errors_exit_2(three, runner, change, expect):
    res = runner("eval", *change(three["args"]))
    assert res.exit_code == 2 and expect in res.stderr, res.stderr
    assert res.stdout == ""


def test_output_or_plot_onto_an_input_is_refused(three, runner):
    victim = three["runs"]["weak", "alpha"]
    disguised = victim.rename(victim.with_suffix(".svg"))  # a run file whose name a figure could have
    args = [a.replace(str(victim), str(disguised)) for a in three["args"]]
    before = disguised.read_bytes()
    for flag in ("-o", "--plot"):
        res = runner("eval", *args, flag, disguised)
        assert res.exit_code == 2 and "would destroy the input" in res.stderr, res.stderr
        assert disguised.read_bytes() == before


# ---------------------------------------------------------------- one collection: --csv and --plot


def test_one_collection_csv_and_plot(three, runner):
    a, b = three["runs"]["weak", "alpha"], three["runs"]["strong", "alpha"]
    table = runner("eval", a, b, "--qrels", three["qrels"]["alpha"], *MEASURES)
    as_csv = runner("eval", a, b, "--qrels", three["qrels"]["alpha"], *MEASURES, "--csv", "--plot", three["dir"] / "one.svg")
    assert table.exit_code == as_csv.exit_code == 0, as_csv.stderr
    rows = list(csv.reader(io.StringIO(as_csv.stdout)))
    assert rows[0] == ["run", *NAMES, "queries", "significant"]
    printed = parse_table(table.stdout)[1:]
    for p, r in zip(printed, rows[1:], strict=True):
        assert p[0] == r[0] and [v.rstrip("*") for v in p[1:4]] == [f"{float(v):.4f}" for v in r[1:4]] and p[4] == r[4]
    assert rows[2][5] == ";".join(NAMES)
    texts = svg_texts(three["dir"] / "one.svg")
    assert str(a) in texts and str(b) in texts and "average" not in texts


# ---------------------------------------------------------------- the core helpers


def test_compare_without_tests_and_pooled_ids_kept_apart():
    res = {(s,): {c: metrics.Result(["AP"], {"AP": v}, {"q1": {"AP": v}}, {"evaluated": 1}) for c in ("x", "y")}
           for s, v in (("a", 0.2), ("b", 0.6))}
    table = across_collections.compare(res, alpha=None)
    assert table.p_value == {} and not table.significant(("b",), "x", "AP")
    assert table.means[("b",)]["average"] == {"AP": 0.6}
    assert sorted(across_collections.pooled(res[("a",)]).per_query) == ["x\tq1", "y\tq1"]
    with pytest.raises(ValueError, match="scored on"):
        across_collections.compare({("a",): res[("a",)], ("b",): {"x": res[("b",)]["x"]}})


def test_save_figure_is_atomic_and_checks_the_extension(tmp_path):
    plt = plots.pyplot()
    fig, ax = plt.subplots()
    plots.grouped_bars(ax, ["c1", "c2"], {"sys": [0.1, 0.2], "other": [0.3, 0.4]})
    plots.save_figure(fig, tmp_path / "f.svg")
    assert {"sys", "other", "c1"} <= set(svg_texts(tmp_path / "f.svg"))
    assert [p.name for p in tmp_path.iterdir()] == ["f.svg"]
    with pytest.raises(ValueError, match="must end in"):
        plots.check_path(tmp_path / "f.gif")
