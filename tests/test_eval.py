"""eval: numbers agree with pytrec_eval (trec_eval -c) on ties, graded qrels, -l, missing queries and a real
BM25 run on SciFact; CLI table / JSON / per-query / comparison; bad input exits 2 naming file:line."""

import json
import math
import random

import pytest
import pytrec_eval
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from retrctl import metrics, records
from stages.eval import eval as eval_runs

TREC = {"nDCG@10": "ndcg_cut_10", "R@100": "recall_100", "R@1000": "recall_1000", "AP": "map", "P@10": "P_10",
        "P@5": "P_5", "nDCG@3": "ndcg_cut_3", "R@5": "recall_5"}


def reference(run, qrels, names, rel_level=1):
    """trec_eval -c straight from pytrec_eval: mean over every judged query, missing queries score 0.
    RR@k as `trec_eval -M k -m recip_rank`: the ranking cut at k in trec_eval's order (score desc, doc id desc)."""
    want = {TREC[n] for n in names if n in TREC}
    per = pytrec_eval.RelevanceEvaluator(qrels, want, relevance_level=rel_level).evaluate(run)
    out, per_query = {}, {q: {} for q in qrels}
    for n in names:
        if n.startswith("RR@"):
            cut = {q: dict(records.trec_order(d)[: int(n[3:])]) for q, d in run.items()}
            rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}, relevance_level=rel_level).evaluate(cut)
        for q in qrels:
            got = rr.get(q, {}).get("recip_rank", 0.0) if n.startswith("RR@") else per.get(q, {}).get(TREC[n], 0.0)
            per_query[q][n] = got
        out[n] = sum(per_query[q][n] for q in qrels) / len(qrels)
    return out, per_query


def synthetic(seed=0, n_queries=40, n_docs=60, depth=30):
    """Scores rounded to one decimal (many ties), grades 0-3, some judged queries absent from the run,
    some run queries without judgments."""
    rng = random.Random(seed)
    docs = [f"d{i:03d}" for i in range(n_docs)]
    qrels = {f"q{i}": {d: rng.choice([0, 1, 1, 2, 3]) for d in rng.sample(docs, rng.randint(1, 8))} for i in range(n_queries)}
    run = {f"q{i}": {d: round(rng.random(), 1) for d in rng.sample(docs, depth)} for i in range(5, n_queries + 5)}
    return run, qrels


def assert_close(ours: metrics.Result, ref, per_query_ref):
    for name, value in ref.items():
        assert ours.mean[name] == pytest.approx(value, abs=1e-6), name
    for q, vals in per_query_ref.items():
        for name, value in vals.items():
            assert ours.per_query[q][name] == pytest.approx(value, abs=1e-6), (q, name)


# ---------------------------------------------------------------- (a) Python API against pytrec_eval


def test_synthetic_run_with_ties_graded_qrels_and_missing_queries_matches_pytrec_eval():
    run, qrels = synthetic()
    names = ["nDCG@10", "R@100", "R@1000", "RR@10", "AP", "P@10", "nDCG@3"]
    res = metrics.evaluate(run, qrels, names)
    assert_close(res, *reference(run, qrels, names))
    assert res.counts["evaluated"] == 40 and res.counts["missing"] == 5 and res.counts["ignored"] == 5


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 12), st.integers(1, 20))
def test_property_agrees_with_pytrec_eval(seed, n_queries, depth):
    run, qrels = synthetic(seed, n_queries=n_queries, n_docs=25, depth=min(depth, 25))
    names = ["nDCG@10", "RR@10", "AP", "P@5", "R@5"]
    assert_close(metrics.evaluate(run, qrels, names), *reference(run, qrels, names))


def test_relevance_level_like_trec_eval_dash_l():
    run, qrels = synthetic(3)
    ours = metrics.evaluate(run, qrels, ["AP(rel=2)", "P(rel=2)@10"])
    per = pytrec_eval.RelevanceEvaluator(qrels, {"map", "P_10"}, relevance_level=2).evaluate(run)
    for name, trec in (("AP(rel=2)", "map"), ("P(rel=2)@10", "P_10")):
        want = sum(per.get(q, {}).get(trec, 0.0) for q in qrels) / len(qrels)
        assert ours.mean[name] == pytest.approx(want, abs=1e-9)
    # grades are gains for nDCG: -l does not apply, so AP moves with rel=2 while nDCG cannot be asked to
    assert ours.mean["AP(rel=2)"] != metrics.evaluate(run, qrels, ["AP"]).mean["AP"]


def test_ties_are_broken_by_doc_id_descending_as_trec_eval():
    qrels = {"q": {"a": 1}}
    run = {"q": {"a": 1.0, "b": 1.0}}  # trec_eval ranks b before a
    res = metrics.evaluate(run, qrels, ["RR@10", "RR", "P@1"])
    assert res.mean == {"RR@10": 0.5, "RR": 0.5, "P@1": 0.0}
    assert pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run)["q"]["recip_rank"] == 0.5
    # the cut for RR@k keeps trec_eval's order: 'a' ties with 'b' at rank 1-2 and 'c' is above both
    res = metrics.evaluate({"q": {"c": 2.0, "a": 1.0, "b": 1.0}}, qrels, ["RR@2"])
    assert res.mean["RR@2"] == 0.0


def test_judged_queries_missing_from_the_run_score_zero_and_are_counted():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}}
    res = metrics.evaluate({"q1": {"a": 1.0}, "q3": {"x": 1.0}}, qrels, ["nDCG@10"])
    assert res.mean["nDCG@10"] == 0.5 and res.per_query["q2"]["nDCG@10"] == 0.0
    assert (res.counts["evaluated"], res.counts["missing"], res.counts["ignored"]) == (2, 1, 1)


def test_empty_qrels_entry_is_skipped_with_a_warning(caplog):
    qrels = {"q1": {"a": 1}, "q2": {}, "q3": {"c": 1}}
    run = {"q1": {"a": 1.0}, "q2": {"b": 1.0}, "q3": {"c": 1.0, "z": 0.5}}
    res = metrics.evaluate(run, qrels, ["AP", "nDCG@10"])
    assert res.counts["skipped"] == 1 and "q2" not in res.per_query
    assert res.mean == {"AP": 1.0, "nDCG@10": 1.0}
    assert "skipped 1 qrels entries" in caplog.text


def test_unjudged_and_self_hits_are_counted_and_ignore_self_drops_them():
    qrels = {"q1": {"d1": 1}}
    run = {"q1": {"q1": 3.0, "x": 2.0, "d1": 1.0}}
    kept = metrics.evaluate(run, qrels, ["RR@10"])
    assert kept.mean["RR@10"] == pytest.approx(1 / 3)
    assert kept.counts["unjudged"] == 2 and kept.counts["self_hits"] == 1
    dropped = metrics.evaluate(run, qrels, ["RR@10"], ignore_self=True)
    assert dropped.mean["RR@10"] == 0.5


def test_capped_recall_is_beirs_formula():
    rng = random.Random(1)
    docs = [f"d{i}" for i in range(50)]
    qrels = {f"q{i}": {d: 1 for d in rng.sample(docs, rng.randint(1, 12))} for i in range(20)}
    run = {q: {d: float(s) for s, d in enumerate(rng.sample(docs, 30))} for q in qrels}  # no ties
    k = 5
    res = metrics.evaluate(run, qrels, ["R@5"], capped_recall=True)
    beir = []
    for q, judged in qrels.items():
        top = sorted(run[q], key=run[q].get, reverse=True)[:k]
        beir.append(len(set(top) & set(judged)) / min(k, len(judged)))
    assert res.measures == ["R_cap@5"]
    assert res.mean["R_cap@5"] == pytest.approx(sum(beir) / len(beir), abs=1e-9)
    assert res.mean["R_cap@5"] > metrics.evaluate(run, qrels, ["R@5"]).mean["R@5"]  # some queries have > 5 relevant


def test_bad_runs_are_refused():
    with pytest.raises(ValueError, match="appears twice"):
        metrics.evaluate({"q": [("a", 1.0), ("a", 0.5)]}, {"q": {"a": 1}})
    with pytest.raises(ValueError, match="score must be a number"):
        metrics.evaluate({"q": {"a": math.nan}}, {"q": {"a": 1}})
    with pytest.raises(ValueError, match="unknown measure"):
        metrics.parse(["nDCG@ten"])


def test_measure_names_and_aliases():
    assert [s.name for s in metrics.parse(["MRR@10", "ndcg_cut_10", "nDCG@10", "P@10,R@100"])] == ["RR@10", "nDCG@10", "P@10", "R@100"]
    assert [s.name for s in metrics.parse(["R@100", "R_cap@10"], capped_recall=True)] == ["R_cap@100", "R_cap@10"]


def test_paired_ttest_is_scipys_and_identical_runs_give_one():
    run, qrels = synthetic(5)
    other = {q: {d: s + (0.05 if qrels.get(q, {}).get(d, 0) > 0 else 0) for d, s in docs.items()} for q, docs in run.items()}
    a, b = metrics.evaluate(run, qrels), metrics.evaluate(other, qrels)
    p = metrics.paired_ttest(a, b)
    qids = sorted(qrels)
    want = stats.ttest_rel([a.per_query[q]["AP"] for q in qids], [b.per_query[q]["AP"] for q in qids]).pvalue
    assert p["AP"] == pytest.approx(want)
    assert metrics.paired_ttest(a, a) == dict.fromkeys(a.measures, 1.0)


def test_eval_function_marks_significant_differences():
    rng = random.Random(0)
    qrels = {f"q{i}": {f"r{i}": 1} for i in range(60)}
    good = {q: {f"r{i}": 2.0, **{f"n{j}": rng.random() for j in range(20)}} for i, q in enumerate(qrels)}
    bad = {q: {f"r{i}": 0.01, **{f"n{j}": 0.5 + rng.random() for j in range(20)}} for i, q in enumerate(qrels)}
    rows = eval_runs([("good", good), ("bad", bad), ("good2", good)], qrels, measures=["nDCG@10", "AP"])
    assert [r["run"] for r in rows] == ["good", "bad", "good2"]
    assert "p_value" not in rows[0] and rows[1]["significant"] == ["nDCG@10", "AP"] and rows[2]["significant"] == []
    assert rows[0]["nDCG@10"] == 1.0 and rows[1]["nDCG@10"] < 0.5


# ---------------------------------------------------------------- a real BM25 run on SciFact, through the CLI


@pytest.fixture(scope="module")
def scifact_run(tmp_path_factory):
    """bm25s on a 500-doc slice of SciFact (all test positives + the first other docs), test queries, top 100."""
    import bm25s
    from conftest import shared_data

    root = shared_data("scifact")
    qrels = records.read_qrels(root)
    positives = {d for judged in qrels.values() for d in judged}
    docs = []
    for d in records.read(root, "doc"):
        if d["docid"] in positives or len(docs) < 500 - len(positives):
            docs.append(d)
        if len(docs) >= 500:
            break
    queries = [q for q in records.read(root, "query") if q["query_id"] in qrels]
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([f"{d['title']} {d['text']}" for d in docs], show_progress=False), show_progress=False)
    ids, scores = retriever.retrieve(bm25s.tokenize([q["query_text"] for q in queries], show_progress=False), k=100,
                                     show_progress=False)
    run = {q["query_id"]: {docs[i]["docid"]: float(s) for i, s in zip(row_i, row_s, strict=True)}
           for q, row_i, row_s in zip(queries, ids, scores, strict=True)}
    out = tmp_path_factory.mktemp("scifact")
    records.write_run(records.run_rows({q: records.trec_order(d) for q, d in run.items()}), out / "bm25.trec")
    (out / "qrels.trec").write_text("".join(f"{q} 0 {d} {r}\n" for q, j in qrels.items() for d, r in j.items()))
    return out / "bm25.trec", out / "qrels.trec", root


@pytest.mark.real
def test_real_bm25_run_matches_pytrec_eval_through_the_cli(scifact_run, runner):
    run_path, qrels_path, _ = scifact_run
    names = ["nDCG@10", "R@100", "R@1000", "RR@10", "AP", "P@10"]
    result = runner("eval", run_path, "--qrels", qrels_path, "--json", "--per-query", *sum((["-m", n] for n in names), []))
    assert result.exit_code == 0, result.stderr
    row = json.loads(result.stdout)
    # the reference reads both files with pytrec_eval's own parsers
    with open(run_path) as f:
        run = pytrec_eval.parse_run(f)
    with open(qrels_path) as f:
        qrels = pytrec_eval.parse_qrel(f)
    ref, ref_per_query = reference(run, qrels, names)
    worst = max(abs(row[n] - ref[n]) for n in names)
    worst_q = max(abs(row["per_query"][q][n] - ref_per_query[q][n]) for q in qrels for n in names)
    assert worst <= 1e-6 and worst_q <= 1e-6, (worst, worst_q)
    assert row["nDCG@10"] > 0.5  # a 500-doc slice holding every positive: BM25 finds most of them
    assert row["counts"]["evaluated"] == len(qrels) == 300 and "evaluated" in result.stderr


@pytest.mark.real
def test_beir_folder_as_qrels_gives_the_same_numbers(scifact_run, runner):
    run_path, qrels_path, root = scifact_run
    a = runner("eval", run_path, "--qrels", qrels_path, "--json")
    b = runner("eval", run_path, "--qrels", root, "--qrels-split", "test", "--json")
    assert a.exit_code == b.exit_code == 0, b.stderr
    strip = lambda r: {k: v for k, v in json.loads(r.stdout).items() if k != "settings"}  # noqa: E731
    assert strip(a) == strip(b)
    assert json.loads(b.stdout)["settings"]["qrels"].endswith("test.tsv")


# ---------------------------------------------------------------- (b) CLI


def write_trec(path, run):
    path.write_text("".join(f"{q} Q0 {d} {i} {s} t\n" for q, docs in run.items() for i, (d, s) in enumerate(docs.items(), 1)))
    return path


@pytest.fixture
def two_runs(tmp_path):
    rng = random.Random(0)
    qrels = {f"q{i}": {f"r{i}": 1, f"s{i}": 2} for i in range(40)}
    good = {q: {f"s{i}": 3.0, f"r{i}": 2.5, **{f"n{j}": rng.random() for j in range(10)}} for i, q in enumerate(qrels)}
    bad = {q: {f"n{j}": 1 + rng.random() for j in range(10)} | {f"r{i}": 0.1} for i, q in enumerate(qrels)}
    (tmp_path / "qrels.txt").write_text("".join(f"{q} 0 {d} {r}\n" for q, j in qrels.items() for d, r in j.items()))
    return write_trec(tmp_path / "good.trec", good), write_trec(tmp_path / "bad.trec", bad), tmp_path / "qrels.txt"


def test_cli_table_compares_runs_and_marks_significance(two_runs, runner):
    good, bad, qrels = two_runs
    result = runner("eval", good, bad, "--qrels", qrels)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("# qrels:") and "ignore_self: off" in lines[0] and "capped_recall: off" in lines[0]
    assert "paired t-test" in lines[0]
    assert lines[1].split() == ["run", "nDCG@10", "R@100", "R@1000", "RR@10", "AP", "queries"]
    good_row, bad_row = lines[2].split(), lines[3].split()
    assert good_row[1:] == ["1.0000"] * 5 + ["40"]
    assert all(v.endswith("*") for v in bad_row[1:6])
    assert "retrctl.eval" in result.stderr and "retrctl.eval" not in result.stdout


def test_cli_json_per_query_and_output_file(two_runs, runner, tmp_path):
    good, bad, qrels = two_runs
    out = tmp_path / "res.jsonl"
    result = runner("eval", good, bad, "--qrels", qrels, "--json", "--per-query", "-m", "P@1", "--capped-recall",
                    "-m", "R@1", "-o", out)
    assert result.exit_code == 0 and result.stdout == ""
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["run"] for r in rows] == [str(good), str(bad)]
    assert rows[0]["P@1"] == 1.0 and rows[0]["R_cap@1"] == 1.0 and "R@1" not in rows[0]
    assert rows[1]["significant"] == ["P@1", "R_cap@1"] and rows[1]["p_value"]["P@1"] < 0.05
    assert rows[0]["settings"]["capped_recall"] is True and rows[0]["counts"]["missing"] == 0
    assert rows[1]["per_query"]["q3"] == {"P@1": 0.0, "R_cap@1": 0.0}


def test_cli_per_query_text_rows(two_runs, runner):
    good, _, qrels = two_runs
    result = runner("eval", good, "--qrels", qrels, "--per-query", "-m", "AP", "-m", "RR@10")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == "query_id\tmeasure\tvalue"
    rows = [line.split("\t") for line in lines[2:]]
    assert len(rows) == 40 * 2 + 2 and rows[-1] == ["all", "RR@10", "1.000000"]
    assert {r[1] for r in rows} == {"AP", "RR@10"}


def test_cli_reads_jsonl_and_parquet_runs(two_runs, runner, tmp_path):
    good, _, qrels = two_runs
    rows = list(records.run_rows(records.read_run(good)))
    records.write_run(rows, tmp_path / "good.jsonl")
    records.write_run(rows, tmp_path / "good.parquet")
    outs = [runner("eval", p, "--qrels", qrels, "--json") for p in (good, tmp_path / "good.jsonl", tmp_path / "good.parquet")]
    assert all(r.exit_code == 0 for r in outs), [r.stderr for r in outs]
    values = [{k: v for k, v in json.loads(r.stdout).items() if k not in ("run",)} for r in outs]
    assert values[0] == values[1] == values[2]


def test_ignore_self_is_on_for_arguana_and_recorded(runner, tmp_path):
    qrels = tmp_path / "arguana" / "qrels"
    qrels.mkdir(parents=True)
    (qrels / "test.tsv").write_text("query-id\tcorpus-id\tscore\nqa\tda\t1\nqb\tdb\t1\n")
    run = write_trec(tmp_path / "run.trec", {"qa": {"qa": 9.0, "da": 1.0}, "qb": {"qb": 9.0, "db": 1.0}})
    auto = runner("eval", run, "--qrels", tmp_path / "arguana", "-m", "RR@10", "--json")
    kept = runner("eval", run, "--qrels", tmp_path / "arguana", "-m", "RR@10", "--json", "--keep-self")
    assert auto.exit_code == kept.exit_code == 0, auto.stderr
    a, k = json.loads(auto.stdout), json.loads(kept.stdout)
    assert a["RR@10"] == 1.0 and a["settings"]["ignore_self"] is True and "--ignore-self is on" in auto.stderr
    assert k["RR@10"] == 0.5 and k["settings"]["ignore_self"] is False and "own id" in kept.stderr
    table = runner("eval", run, "--qrels", tmp_path / "arguana")
    assert "ignore_self: on" in table.stdout.splitlines()[0]


# ---------------------------------------------------------------- (c) bad input


def test_duplicate_doc_in_run_exits_2_with_file_line_and_no_output(tmp_path, runner, qrels_file):
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d1 1 2.0 t\nq1 Q0 d2 2 1.0 t\nq1 Q0 d1 3 0.5 t\n")
    out = tmp_path / "out.txt"
    result = runner("eval", run, "--qrels", qrels_file, "-o", out)
    assert result.exit_code == 2
    assert result.stderr.strip() == f"retrctl eval: {run}:3: field 'doc_id': doc 'd1' appears twice for query 'q1'"
    assert not out.exists() and list(tmp_path.glob(".out*")) == []


@pytest.mark.parametrize(
    "text, expect",
    [
        ("q1 Q0 d1 1 nan t\n", ":1: field 'score': NaN score"),
        ("q1 Q0 d1 1 x t\n", ":1: field 'score': not a number"),
        ("q1 Q0 d1 1 1.0\n", ":1: expected 6 columns"),
        ("\n", "empty input"),
    ],
)
def test_bad_run_files_exit_2(tmp_path, runner, qrels_file, text, expect):
    run = tmp_path / "run.trec"
    run.write_text(text)
    result = runner("eval", run, "--qrels", qrels_file)
    assert result.exit_code == 2 and expect in result.stderr and result.stdout == ""


def test_empty_or_bad_qrels_exit_2(tmp_path, runner):
    run = write_trec(tmp_path / "run.trec", {"q1": {"d1": 1.0}})
    (tmp_path / "empty.tsv").write_text("query-id\tcorpus-id\tscore\n")
    (tmp_path / "bad.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\thigh\n")
    empty = runner("eval", run, "--qrels", tmp_path / "empty.tsv")
    bad = runner("eval", run, "--qrels", tmp_path / "bad.tsv")
    assert empty.exit_code == 2 and "empty input" in empty.stderr
    assert bad.exit_code == 2 and f"{tmp_path / 'bad.tsv'}:2: field 'relevance'" in bad.stderr


def test_usage_errors_exit_2(tmp_path, runner, qrels_file):
    run = write_trec(tmp_path / "run.trec", {"q1": {"d1": 1.0}})
    assert runner("eval", run).exit_code == 2  # no --qrels
    bad = runner("eval", run, "--qrels", qrels_file, "-m", "nDCG@ten")
    assert bad.exit_code == 2 and "unknown measure" in bad.stderr
    assert runner("eval", "--qrels", qrels_file).exit_code == 2  # no run


def test_cli_reads_runs_from_stdin(two_runs, runner):
    good, _, qrels = two_runs
    trec = runner("eval", "-", "--qrels", qrels, "--json", input=good.read_text())
    lines = "".join(records.dumps(r) + "\n" for r in records.run_rows(records.read_run(good)))
    as_jsonl = runner("eval", "-", "--qrels", qrels, "--json", "--input-format", "jsonl", input=lines)
    assert trec.exit_code == as_jsonl.exit_code == 0, trec.stderr + as_jsonl.stderr
    assert json.loads(trec.stdout)["nDCG@10"] == json.loads(as_jsonl.stdout)["nDCG@10"] == 1.0
