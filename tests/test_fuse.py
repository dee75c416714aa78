"""Fusion (retrctl.fusion, `retrctl fuse`, `retrctl eval --sweep`): RRF and linear fusion against hand-computed
cases (docs missing from one list, ties, weights, each norm, degenerate lists), reproductions of other tools' fusion bugs,
the CLI round trip on TREC and JSONL runs, bad flags exit 2, and sweep rows equal to evaluating each fused run."""

import json
import math

import pytest

from retrctl import fusion, records

# run A ranks a, b, c (c last); run B ranks c, d. Queries: q1 in both, q2 only in A, q3 only in B.
A = {"q1": [("a", 3.0), ("b", 2.0), ("c", 1.0)], "q2": [("a", 5.0)]}
B = {"q1": [("c", 0.9), ("d", 0.5)], "q3": [("z", 0.1)]}


def close(got, want):
    assert [d for d, _ in got] == [d for d, _ in want], (got, want)
    for (_, g), (_, w) in zip(got, want, strict=True):
        assert g == pytest.approx(w, abs=1e-12)


def test_rrf_by_hand_with_missing_docs_and_ties():
    out = fusion.fuse([A, B], "rrf", k=60)
    # c: 1/(60+3) + 1/(60+1); a: 1/61 (B contributes nothing); b and d tie at 1/62 -> doc id descending: d, b
    close(out["q1"], [("c", 1 / 63 + 1 / 61), ("a", 1 / 61), ("d", 1 / 62), ("b", 1 / 62)])
    close(out["q2"], [("a", 1 / 61)])
    close(out["q3"], [("z", 1 / 61)])
    assert list(out) == ["q1", "q2", "q3"]


def test_rrf_ranks_follow_trec_eval_order_not_list_order():
    """Input ties are ranked as trec_eval ranks them (doc id descending), whatever order the list came in."""
    tied = {"q": [("a", 1.0), ("b", 1.0)]}  # trec_eval order: b (rank 1), a (rank 2)
    other = {"q": [("x", 1.0)]}
    out = fusion.fuse([tied, other], "rrf", k=0)
    close(out["q"], [("x", 1.0), ("b", 1.0), ("a", 0.5)])


def test_rrf_weights_and_k():
    out = fusion.fuse([A, B], "rrf", k=1, weights=[2.0, 0.5])
    # A: a 2/(1+1), b 2/(1+2), c 2/(1+3); B: c 0.5/(1+1), d 0.5/(1+2)
    close(out["q1"], [("a", 1.0), ("c", 0.5 + 0.25), ("b", 2 / 3), ("d", 0.5 / 3)])


def test_rrf_agreement_beats_a_single_list_top_hit_at_k60():
    """getzep/graphiti#1847 (and Qdrant's k=2): with k = 60 a doc ranked 3rd by both lists beats either list's own #1."""
    l1 = {"q": [("top1", 9.0), ("x", 8.0), ("both", 7.0)]}
    l2 = {"q": [("top2", 9.0), ("y", 8.0), ("both", 7.0)]}
    assert fusion.fuse([l1, l2], "rrf")["q"][0][0] == "both"
    assert fusion.fuse([l1, l2], "rrf", k=1)["q"][0][0] != "both"  # the small-k failure, for contrast


def test_doc_found_by_both_lists_is_not_buried_by_phantom_ranks():
    """UKPLab/sentence-transformers#3883: absent docs got rank len(list) and the only relevant doc (found by
    both) fell out of the top 3. Absent means no term here."""
    l1 = {"q": [("a", 5), ("rel", 4), ("b", 3), ("c", 2)]}
    l2 = {"q": [("d", 5), ("rel", 4), ("e", 3)]}
    assert fusion.fuse([l1, l2], "rrf")["q"][0][0] == "rel"


def test_linear_minmax_by_hand():
    out = fusion.fuse([A, B], "linear", weights=[0.5, 0.5], norm="minmax")
    # A: a=1, b=.5, c=0; B: c=1, d=0; missing -> 0. c and a tie at 0.5 -> doc id descending: c, a
    close(out["q1"], [("c", 0.5), ("a", 0.5), ("b", 0.25), ("d", 0.0)])
    close(out["q2"], [("a", 0.5)])  # one hit: no range, maps to 1.0; B lacks the query: 0
    close(out["q3"], [("z", 0.5)])


def test_linear_none_missing_doc_gets_the_lists_minimum():
    out = fusion.fuse([A, B], "linear", weights=[1.0, 2.0], norm="none")
    # missing from B -> B's min 0.5; missing from A -> A's min 1.0 (Pyserini's HybridSearcher rule)
    close(out["q1"], [("a", 3.0 + 2 * 0.5), ("b", 2.0 + 2 * 0.5), ("c", 1.0 + 2 * 0.9), ("d", 1.0 + 2 * 0.5)])
    close(out["q2"], [("a", 5.0)])  # a query B lacks entirely contributes 0


def test_linear_zscore_by_hand():
    out = fusion.fuse([A, B], "linear", norm="zscore")
    sa = math.sqrt(2 / 3)  # population std of 3, 2, 1
    za = {"a": 1 / sa, "b": 0.0, "c": -1 / sa}
    zb = {"c": 1.0, "d": -1.0}  # std of 0.9, 0.5 is 0.2
    want = {"a": za["a"] + zb["d"], "b": za["b"] + zb["d"], "c": za["c"] + zb["c"], "d": za["c"] + zb["d"]}
    close(out["q1"], records.trec_order(want))
    close(out["q2"], [("a", 0.0)])  # one hit: std 0 -> 0.0, no division by zero


def test_minmax_all_equal_list_maps_to_one_and_an_empty_list_adds_nothing():
    """A list whose scores are all equal has no range: 1.0 each, never a NaN; an empty list for a query
    (one retriever found nothing) leaves the other list's order intact."""
    flat = {"q": [("a", 2.0), ("b", 2.0)], "r": []}
    other = {"q": [("c", 10.0), ("a", 0.0)], "r": [("x", 3.0), ("y", 1.0)]}
    out = fusion.fuse([flat, other], "linear", norm="minmax")
    # a: 1 + 0 (its minmax score in the other list); b: 1 + missing 0; c: missing 0 + 1 -> all tie, doc id descending
    close(out["q"], [("c", 1.0), ("b", 1.0), ("a", 1.0)])
    close(out["r"], [("x", 1.0), ("y", 0.0)])
    assert all(not math.isnan(s) for lst in out.values() for _, s in lst)


@pytest.mark.parametrize("method", ["linear", "rrf"])
def test_a_list_weighted_0_is_left_out_and_the_fusion_ranks_as_the_others(method):
    """Weighted 0, a list adds no score; kept in, the docs only it found (a, b) would join B's bottom (d, at 0 under
    minmax) and, tied with it, go above it by doc id. Left out, q1 ranks as B alone and q2, which only A has, is empty."""
    out = fusion.fuse([A, B], method, weights=[0, 1])
    assert {q: [d for d, _ in hits] for q, hits in out.items()} == {"q1": ["c", "d"], "q2": [], "q3": ["z"]}
    assert fusion.read_by([0, 1]) == [1] and fusion.read_by(None, 3) == [0, 1, 2]
    three = fusion.fuse([A, B, A], method, weights=[0.5, 0, 0.5])
    assert [d for d, _ in three["q1"]] == ["a", "b", "c"]


def test_depth_and_hits():
    out = fusion.fuse([A, B], "rrf", depth=1, hits=2)
    close(out["q1"], [("c", 1 / 61), ("a", 1 / 61)])  # only a (A's top) and c (B's top) are candidates


def test_equal_weights_default_and_scale_invariance():
    assert fusion.fuse([A, B], "rrf") == fusion.fuse([A, B], "rrf", weights=[1, 1])
    one = fusion.fuse([A, B], "linear", weights=[0.3, 0.7])
    ten = fusion.fuse([A, B], "linear", weights=[3, 7])
    assert [[d for d, _ in v] for v in one.values()] == [[d for d, _ in v] for v in ten.values()]


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"runs": [A]}, "at least 2 runs"),
    ({"runs": [A, B, A], "weights": [1.0]}, "1 weights for 3 runs"),
    ({"weights": [1.5]}, "w must be in"),
    ({"weights": [0, 0]}, "not all 0"),
    ({"weights": [1, -1]}, ">= 0"),
    ({"method": "max"}, "method"),
    ({"norm": "l2"}, "norm"),
])
def test_bad_settings_raise(kwargs, words):
    runs = kwargs.pop("runs", [A, B])
    with pytest.raises(ValueError, match=words):
        fusion.fuse(runs, **kwargs)


def test_one_weight_for_two_runs_is_w_and_one_minus_w():
    assert fusion.check(2, weights=[0.3]) == [0.3, 0.7]  # exactly the pair eval --sweep writes
    assert fusion.fuse([A, B], "linear", weights=[0.3]) == fusion.fuse([A, B], "linear", weights=[0.3, 0.7])
    assert fusion.check(3, weights=[1, 2, 3]) == [1.0, 2.0, 3.0]


def test_parse_weights_and_grid():
    assert fusion.parse_weights("0.3, 0.7") == [0.3, 0.7]
    with pytest.raises(ValueError, match="'x'"):
        fusion.parse_weights("0.3,x")
    assert fusion.parse_grid("0:1:0.1") == [round(i / 10, 10) for i in range(11)]
    assert fusion.parse_grid("0.2:0.5:0.2") == [0.2, 0.4]
    for bad in ("0:1", "1:0:0.1", "0:1:0", "0:2:0.5", "a:b:c"):
        with pytest.raises(ValueError):
            fusion.parse_grid(bad)


# ---------------------------------------------------------------- CLI


def write_trec(path, run, tag="t"):
    with open(path, "w") as f:
        for q, lst in run.items():
            for r, (d, s) in enumerate(lst, 1):
                f.write(f"{q} Q0 {d} {r} {s} {tag}\n")
    return path


def write_jsonl(path, run):
    with open(path, "w") as f:
        for q, lst in run.items():
            for r, (d, s) in enumerate(lst, 1):
                f.write(json.dumps({"query_id": q, "doc_id": d, "score": s, "rank": r}) + "\n")
    return path


@pytest.mark.parametrize("out_name", ["fused.trec", "fused.jsonl"])
def test_cli_round_trip_trec_and_jsonl(runner, tmp_path, out_name):
    a = write_trec(tmp_path / "a.trec", A)
    b = write_jsonl(tmp_path / "b.jsonl", B)
    out = tmp_path / out_name
    res = runner("fuse", a, b, "-o", out, "--fusion", "linear", "--weights", "0.5,0.5", "--norm", "minmax")
    assert res.exit_code == 0, res.output
    got = records.read_run(out)
    want = fusion.fuse([A, B], "linear", weights=[0.5, 0.5], norm="minmax")
    assert got.keys() == want.keys()
    for q in want:
        close(got[q], want[q])
    if out_name.endswith(".trec"):
        assert {line.split()[5] for line in out.read_text().splitlines()} == {"fused-linear"}
    else:  # each input's own score beside the fused one, null where that run missed the doc
        rows = {(r["query_id"], r["doc_id"]): r["run_scores"] for r in map(json.loads, out.read_text().splitlines())}
        assert rows[("q1", "c")] == [1.0, 0.9] and rows[("q1", "a")] == [3.0, None] and rows[("q3", "z")] == [None, 0.1]
    manifest = json.loads((tmp_path / f"{out_name}.manifest.json").read_text())
    assert manifest["stage"] == "fuse"
    assert [r["path"] for r in manifest["runs"]] == [str(a.resolve()), str(b.resolve())]
    assert manifest["settings"] == {"fusion": "linear", "weights": [0.5, 0.5], "depth": None, "hits": 1000, "norm": "minmax"}


def test_cli_rrf_stdout_and_run_tag(runner, tmp_path):
    a = write_trec(tmp_path / "a.trec", A)
    b = write_trec(tmp_path / "b.trec", B)
    res = runner("fuse", a, b, "--fusion", "rrf", "--run-tag", "hyb", "--hits", "1")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["q1", "Q0", "c", "1", f"{1 / 63 + 1 / 61:.6f}", "hyb"]
    assert len(lines) == 3  # one hit per query


def test_one_default_fusion_in_fuse_eval_sweep_and_search(runner, tmp_path):
    """fuse, eval --sweep and search --heads share one declaration of the fusion flags and one default: linear
    fusion of min-max normalised scores (bench/RESULTS.md, "Fusion: BM25 + MiniLM")."""
    import importlib

    a = write_trec(tmp_path / "a.trec", A)
    b = write_trec(tmp_path / "b.trec", B)
    plain, linear = tmp_path / "plain.trec", tmp_path / "linear.trec"
    assert runner("fuse", a, b, "-o", plain).exit_code == 0
    assert runner("fuse", a, b, "-o", linear, "--fusion", "linear", "--norm", "minmax").exit_code == 0
    assert plain.read_text() == linear.read_text() and plain.read_text().split()[5] == "fused-linear"
    qrels = tmp_path / "qrels.txt"
    qrels.write_text(QRELS)
    swept = runner("eval", a, b, "--qrels", qrels, "--sweep", "0:1:0.5", "--json")
    assert swept.exit_code == 0 and {json.loads(r)["settings"]["fusion"] for r in swept.stdout.splitlines()} == {"linear"}
    assert (fusion.METHOD, fusion.NORM, fusion.RRF_K) == ("linear", "minmax", 60.0)
    helps = {}
    for name in ("fuse", "eval", "search"):
        params = {p.name: p for p in importlib.import_module(f"stages.{name}").command.params}
        helps[name] = [(params[n].opts, params[n].help.split(" [default")[0]) for n in ("fusion_method", "norm", "rrf_k", "depth")]
    assert helps["fuse"] == helps["eval"] == helps["search"]


def test_cli_records_the_input_runs_manifests(runner, tmp_path):
    a = write_trec(tmp_path / "a.trec", A)
    b = write_trec(tmp_path / "b.trec", B)
    (tmp_path / "a.trec.manifest.json").write_text(json.dumps({"stage": "search", "run_tag": "bm25", "index": "/x"}))
    out = tmp_path / "f.trec"
    assert runner("fuse", a, b, "-o", out).exit_code == 0
    runs = json.loads((tmp_path / "f.trec.manifest.json").read_text())["runs"]
    assert runs[0] == {"path": str(a.resolve()), "stage": "search", "run_tag": "bm25", "index": "/x"}
    assert runs[1] == {"path": str(b.resolve())}


@pytest.mark.parametrize(("args", "words"), [
    (["--weights", "1.3"], "w must be in [0, 1]"),
    (["--weights", "0.3,x"], "'x'"),
    (["--weights", "1,2,3"], "3 weights for 2 runs"),
    (["--fusion", "max"], "max"),
    (["--norm", "l2"], "l2"),
])
def test_cli_bad_flags_exit_2(runner, tmp_path, args, words):
    a = write_trec(tmp_path / "a.trec", A)
    b = write_trec(tmp_path / "b.trec", B)
    out = tmp_path / "f.trec"
    res = runner("fuse", a, b, "-o", out, *args)
    assert res.exit_code == 2, res.output
    assert words in res.output
    assert not out.exists()


def test_cli_one_run_exits_2(runner, tmp_path):
    a = write_trec(tmp_path / "a.trec", A)
    res = runner("fuse", a)
    assert res.exit_code == 2
    assert "at least 2 runs" in res.output


def test_cli_bad_run_line_names_file_and_line(runner, tmp_path):
    a = write_trec(tmp_path / "a.trec", A)
    bad = tmp_path / "bad.trec"
    bad.write_text("q1 Q0 d 1 0.5 t\nq1 Q0 e 2 oops t\n")
    res = runner("fuse", a, bad, "-o", tmp_path / "f.trec")
    assert res.exit_code == 2
    assert f"{bad}:2" in res.output and "score" in res.output
    assert not (tmp_path / "f.trec").exists()


# ---------------------------------------------------------------- eval --sweep

QRELS = "q1 0 c 1\nq1 0 b 1\nq2 0 a 2\nq4 0 x 1\n"


@pytest.mark.parametrize("method", [["--fusion", "rrf"], ["--fusion", "linear", "--norm", "minmax"],
                                    ["--fusion", "linear", "--norm", "zscore"]])
def test_sweep_rows_equal_evaluating_each_fused_run(runner, tmp_path, method):
    a = write_trec(tmp_path / "a.trec", A)
    b = write_trec(tmp_path / "b.trec", B)
    qrels = tmp_path / "qrels.txt"
    qrels.write_text(QRELS)
    res = runner("eval", a, b, "--qrels", qrels, "--sweep", "0:1:0.25", "-m", "nDCG@10", "-m", "AP", *method)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith("# qrels:") and "sweep:" in lines[0]
    assert lines[1].split("\t") == ["w_a", "w_b", "nDCG@10", "AP", "queries"]
    rows = [line.split("\t") for line in lines[2:]]
    assert [float(r[0]) for r in rows] == [0, 0.25, 0.5, 0.75, 1.0]
    for r in rows:
        fused = tmp_path / f"f{r[0]}.trec"
        assert runner("fuse", a, b, "-o", fused, "--weights", f"{r[0]},{r[1]}", *method).exit_code == 0
        alone = runner("eval", fused, "--qrels", qrels, "-m", "nDCG@10", "-m", "AP", "--json")
        want = json.loads(alone.stdout)
        assert float(r[2]) == pytest.approx(want["nDCG@10"], abs=5e-5)
        assert float(r[3]) == pytest.approx(want["AP"], abs=5e-5)
        assert r[4] == "3"


def test_sweep_json_and_bad_sweeps_exit_2(runner, tmp_path):
    a = write_trec(tmp_path / "a.trec", A)
    b = write_trec(tmp_path / "b.trec", B)
    qrels = tmp_path / "qrels.txt"
    qrels.write_text(QRELS)
    res = runner("eval", a, b, "--qrels", qrels, "--sweep", "0:1:0.5", "--json", "--fusion", "linear")
    assert res.exit_code == 0, res.output
    objs = [json.loads(line) for line in res.stdout.splitlines()]
    assert [o["weights"] for o in objs] == [[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]]
    assert all("p_value" not in o and o["settings"]["fusion"] == "linear" for o in objs)
    for args, words in ((["--sweep", "0:2:0.5"], "LO <= HI <= 1"), (["--sweep", "0:1"], "LO:HI:STEP"),
                        (["--sweep", "0:1:0.5", "--alpha", "0.1"], "--alpha"), (["--sweep", "0:1:0.5", "--per-query"], "--per-query")):
        res = runner("eval", a, b, "--qrels", qrels, *args)
        assert res.exit_code == 2 and words in res.output, (args, res.output)
    res = runner("eval", a, "--qrels", qrels, "--sweep", "0:1:0.5")
    assert res.exit_code == 2 and "2 or more runs" in res.output
    res = runner("eval", a, b, "--qrels", qrels, "--fusion", "linear", "--depth", "5")
    assert res.exit_code == 2 and "--fusion, --depth only apply with --sweep" in res.output, res.output


def test_cli_refuses_to_overwrite_an_input_run_and_reads_stdin(runner, tmp_path):
    a = write_trec(tmp_path / "a.trec", A)
    b = write_trec(tmp_path / "b.trec", B)
    before = a.read_bytes()
    res = runner("fuse", a, b, "-o", a)
    assert res.exit_code == 2 and "destroy the input" in res.output
    assert a.read_bytes() == before
    res = runner("fuse", a, "-", input=b.read_text())
    assert res.exit_code == 0, res.output
    assert records.read_run(b)["q3"] == [("z", 0.1)]
    assert res.stdout.splitlines()[0].split()[:3] == ["q1", "Q0", "c"]


C = {"q1": [("b", 4.0), ("d", 1.0)], "q2": [("x", 2.0), ("a", 1.0)]}


def test_a_sweep_over_three_runs_shares_w_among_all_but_the_last_and_fuse_takes_its_row(runner, tmp_path):
    a, b, c = (write_trec(tmp_path / f"{n}.trec", r) for n, r in (("a", A), ("c", C), ("b", B)))
    qrels = tmp_path / "qrels.txt"
    qrels.write_text(QRELS)
    sweep = tmp_path / "sweep.jsonl"
    res = runner("eval", a, c, b, "--qrels", qrels, "--sweep", "0:1:0.25", "--sweep-prior", "0.5", "--json", "-o", sweep)
    assert res.exit_code == 0, res.output
    rows = [json.loads(r) for r in sweep.read_text().splitlines()]
    assert [r["weights"] for r in rows] == [[0.0, 0.0, 1.0], [0.125, 0.125, 0.75], [0.25, 0.25, 0.5],
                                            [0.375, 0.375, 0.25], [0.5, 0.5, 0.0]]
    assert not any(r["significant"] for r in rows)  # three queries: no row beats the prior's, which is kept
    assert fusion.weights_from(sweep)[0] == [0.25, 0.25, 0.5]
    for r in rows:  # each row is `fuse` of the three runs at its weights, evaluated
        fused = tmp_path / "f.trec"
        assert runner("fuse", a, c, b, "--weights", ",".join(f"{x:g}" for x in r["weights"]), "-o", fused).exit_code == 0
        alone = json.loads(runner("eval", fused, "--qrels", qrels, "-m", "nDCG@10", "--json").stdout)
        assert r["nDCG@10"] == pytest.approx(alone["nDCG@10"], abs=1e-12)
    table = runner("eval", a, c, b, "--qrels", qrels, "--sweep", "0:1:0.5").stdout.splitlines()
    assert table[1].split("\t")[:3] == ["w_a", "w_b", "w_c"] and f"w_c on {b}" in table[0]
    chosen, given = tmp_path / "chosen.trec", tmp_path / "given.trec"
    assert runner("fuse", a, c, b, "--weights-from", sweep, "-o", chosen).exit_code == 0
    best = fusion.weights_from(sweep)[0]
    assert runner("fuse", a, c, b, "--weights", ",".join(f"{x:g}" for x in best), "-o", given).exit_code == 0
    assert chosen.read_text() == given.read_text()
    res = runner("fuse", a, b, "--weights-from", sweep, "-o", tmp_path / "two.trec")
    assert res.exit_code == 2 and "3 weights for 2 runs" in res.output, res.output


def _sweep(runner, tmp_path, *flags):
    a, b = write_trec(tmp_path / "a.trec", A), write_trec(tmp_path / "b.trec", B)
    qrels = tmp_path / "qrels.txt"
    qrels.write_text(QRELS)
    sweep = tmp_path / "sweep.jsonl"
    res = runner("eval", a, b, "--qrels", qrels, "--sweep", "0:1:0.1", "-m", "nDCG@10", "-m", "RR", "--json", "-o", sweep, *flags)
    assert res.exit_code == 0, res.output
    return a, b, sweep, [json.loads(r) for r in sweep.read_text().splitlines()]


def test_weights_from_a_sweep_fuse_at_its_best_row(runner, tmp_path):
    a, b, sweep, rows = _sweep(runner, tmp_path)
    best = max(rows, key=lambda r: (r["nDCG@10"], -abs(r["weights"][0] - 0.5)))["weights"]
    assert fusion.weights_from(sweep)[0] == best
    assert fusion.weights_from(sweep)[1] == {"fusion_method": "linear", "norm": "minmax", "depth": None}
    chosen, given = tmp_path / "chosen.trec", tmp_path / "given.trec"
    res = runner("fuse", a, b, "--weights-from", sweep, "-o", chosen)
    assert res.exit_code == 0, res.output
    assert f"from {sweep}" in res.stderr
    assert runner("fuse", a, b, "--weights", f"{best[0]:g}", "-o", given).exit_code == 0
    assert chosen.read_text() == given.read_text()
    assert json.loads((tmp_path / "chosen.trec.manifest.json").read_text())["settings"]["weights"] == best
    by_rr = max(rows, key=lambda r: (r["RR"], -abs(r["weights"][0] - 0.5)))["weights"]
    assert fusion.weights_from(sweep, "RR")[0] == by_rr


def test_weights_from_ties_go_to_the_weight_nearer_one_half(tmp_path):
    sweep = tmp_path / "s.jsonl"
    sweep.write_text("".join(json.dumps({"weights": [w, round(1 - w, 10)], "nDCG@10": v}) + "\n"
                             for w, v in ((0.2, 0.5), (0.4, 0.7), (0.6, 0.7), (0.7, 0.7))))
    assert fusion.weights_from(sweep) == ([0.4, 0.6], {})  # 0.4 and 0.6 are as near: the earlier row


def test_a_sweep_with_a_prior_tests_every_row_against_it_and_weights_from_keeps_it_without_evidence(runner, tmp_path):
    a, b, sweep, rows = _sweep(runner, tmp_path, "--sweep-prior", "0.3", "--alpha", "0.2")
    assert [r["weights"][0] for r in rows] == [round(i / 10, 1) for i in range(11)]  # grid order kept
    assert all(r["prior"] == 0.3 for r in rows)
    assert rows[0]["settings"]["alpha"] == 0.2 and rows[0]["settings"]["prior"] == 0.3
    prior = next(r for r in rows if r["weights"][0] == 0.3)
    assert "p_value" not in prior and prior["significant"] == []
    # each row's p is eval's paired t-test of its fused run against the prior's fused run
    for x in (0.3, 0.0, 1.0):
        assert runner("fuse", a, b, "--weights", f"{x:g}", "-o", tmp_path / f"w{x}.trec").exit_code == 0
    for w in (0.0, 1.0):
        pair = runner("eval", tmp_path / "w0.3.trec", tmp_path / f"w{w}.trec", "--qrels", tmp_path / "qrels.txt",
                      "-m", "nDCG@10", "-m", "RR", "--json", "--alpha", "0.2")
        want = json.loads(pair.stdout.splitlines()[1])
        row = next(r for r in rows if r["weights"][0] == w)
        assert row["p_value"] == pytest.approx(want["p_value"]) and row["significant"] == want["significant"]
    # three queries: no row is significantly better than the prior, so the prior is kept even where a row is higher
    assert not any("nDCG@10" in r["significant"] and r["nDCG@10"] > prior["nDCG@10"] for r in rows)
    assert fusion.weights_from(sweep)[0] == [0.3, 0.7]
    text = runner("eval", a, b, "--qrels", tmp_path / "qrels.txt", "--sweep", "0:1:0.1", "-m", "nDCG@10",
                  "--sweep-prior", "0.3").stdout.splitlines()
    assert text[1].split("\t") == ["w_a", "w_b", "nDCG@10", "p_nDCG@10", "queries"]
    by_w = {float(line.split("\t")[0]): line.split("\t") for line in text[2:]}
    assert by_w[0.3][3] == "-" and by_w[1.0][3] == f"{rows[-1]['p_value']['nDCG@10']:.2g}"


def test_weights_from_leaves_the_prior_only_for_a_significantly_better_row(runner, tmp_path):
    sweep = tmp_path / "s.jsonl"

    def write(rows):
        sweep.write_text("".join(json.dumps({"weights": [w, round(1 - w, 10)], "nDCG@10": v, "prior": 0.7,
                                             "significant": sig}) + "\n" for w, v, sig in rows))

    write([(0.2, 0.60, ["nDCG@10"]), (0.4, 0.65, []), (0.7, 0.55, []), (0.9, 0.40, ["nDCG@10"])])
    assert fusion.weights_from(sweep)[0] == [0.2, 0.8]  # 0.4 is higher but not significantly better; 0.9 is worse
    write([(0.2, 0.60, ["RR"]), (0.4, 0.65, []), (0.7, 0.55, [])])
    assert fusion.weights_from(sweep)[0] == [0.7, 0.3]  # significant on another measure only
    sweep.write_text(json.dumps({"weights": [0.5, 0.5], "nDCG@10": 0.3, "prior": 0.35, "significant": []}) + "\n")
    a, b = write_trec(tmp_path / "a.trec", A), write_trec(tmp_path / "b.trec", B)
    res = runner("fuse", a, b, "--weights-from", sweep, "-o", tmp_path / "f.trec")
    assert res.exit_code == 2 and "s.jsonl:1: field 'prior': 0.35 is not the weight of any row" in res.stderr, res.stderr


def test_a_sweep_starts_from_the_weight_another_sweep_chose(runner, tmp_path):
    a, b = write_trec(tmp_path / "a.trec", A), write_trec(tmp_path / "b.trec", B)
    qrels = tmp_path / "qrels.txt"
    qrels.write_text(QRELS)
    first = tmp_path / "first.jsonl"
    first.write_text("".join(json.dumps({"weights": [w, round(1 - w, 10)], "nDCG@10": v, "prior": 0.7,
                                         "significant": sig}) + "\n"
                             for w, v, sig in ((0.3, 0.9, ["nDCG@10"]), (0.7, 0.5, []))))
    out = tmp_path / "second.jsonl"
    res = runner("eval", a, b, "--qrels", qrels, "--sweep", "0:1:0.1", "--sweep-prior", first, "--json", "-o", out)
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["prior"] == 0.3 for r in rows) and rows[0]["settings"]["prior_from"] == str(first)
    assert fusion.weights_from(out)[0] == [0.3, 0.7]  # three queries prove nothing: the first sweep's weight stays
    first.write_text('{"weights": "half"}\n')
    res = runner("eval", a, b, "--qrels", qrels, "--sweep", "0:1:0.1", "--sweep-prior", first)
    assert res.exit_code == 2 and "first.jsonl:1: field 'weights'" in res.stderr, res.stderr
    res = runner("eval", a, b, "--qrels", qrels, "--sweep", "0:1:0.1", "--sweep-prior", tmp_path / "none.jsonl")
    assert res.exit_code == 2 and "expected a weight in [0, 1] or a file of `eval --sweep --json`" in res.output, res.output
    res = runner("eval", a, b, "--qrels", qrels, "--sweep", "0:1:0.1", "--sweep-prior", "1.5")
    assert res.exit_code == 2 and "1.5 is not in the range 0 to 1" in res.output, res.output


def _known_item_runs(tmp_path, dense_rank):
    """Runs over the sweep's queries (A and B's) and four known items k1..k4 (crops, each judging its own document
    d1..d4): BM25 ranks each item's document first, the dense run at ``dense_rank`` (None: never)."""
    crops = tmp_path / "crops.jsonl"
    crops.write_text("".join(json.dumps({"query_id": f"k{i}", "query_text": "a sentence", "source_docid": f"d{i}"}) + "\n"
                             for i in range(1, 5)))
    fillers = [("x", 0.9), ("y", 0.8), ("z", 0.7), ("w", 0.6)]
    dense, bm25 = dict(A), dict(B)
    for i in range(1, 5):
        bm25[f"k{i}"] = [(f"d{i}", 9.0), ("x", 5.0)]
        hits = list(fillers)
        if dense_rank:
            hits.insert(dense_rank - 1, (f"d{i}", 0.95 - 0.1 * (dense_rank - 1) + 0.01))
        dense[f"k{i}"] = hits
    return write_trec(tmp_path / f"dense{dense_rank}.trec", dense), write_trec(tmp_path / "bm25.trec", bm25), crops


def test_known_items_move_the_prior_to_the_last_run_where_the_dense_side_cannot_read(runner, tmp_path):
    qrels = tmp_path / "qrels.txt"
    qrels.write_text(QRELS)

    def swept(dense_rank, known, out):
        dense, bm25, crops = _known_item_runs(tmp_path, dense_rank)
        res = runner("eval", dense, bm25, "--qrels", qrels, "--sweep", "0:1:0.1", "--sweep-prior", "0.7",
                     "--known-items", known or crops, "-m", "nDCG@10", "--json", "-o", out)
        assert res.exit_code == 0, res.output
        return res, [json.loads(line) for line in out.read_text().splitlines()]

    # a known item's document at rank 3 scores 1/log2(4) = 0.5, exactly half of BM25's 1.0: the dense side reads
    res, rows = swept(3, None, tmp_path / "reads.jsonl")
    assert rows[0]["settings"]["known_items"]["dense"] == pytest.approx(0.5, abs=1e-12)
    assert rows[0]["settings"]["known_items"]["reads"] is True and rows[0]["settings"]["known_items"]["queries"] == 4
    assert all(r["prior"] == 0.7 for r in rows) and fusion.weights_from(tmp_path / "reads.jsonl")[0] == [0.7, 0.3]
    # at rank 4 it is 1/log2(5) = 0.43: below half, the prior is 0 (BM25 alone) and the other rows are tested against it
    res, rows = swept(4, None, tmp_path / "blind.jsonl")
    verdict = rows[0]["settings"]["known_items"]
    assert verdict["reads"] is False and verdict["dense"] == pytest.approx(1 / math.log2(5), abs=1e-12)
    assert verdict["last"] == 1.0 and rows[0]["settings"]["prior"] == 0.0 and all(r["prior"] == 0.0 for r in rows)
    assert "cannot read the corpus: the prior is 0" in res.stderr
    assert fusion.weights_from(tmp_path / "blind.jsonl")[0] == [0.0, 1.0]
    # another sweep takes the first's verdict, whatever its own dense run does on the known items
    res, rows = swept(1, tmp_path / "blind.jsonl", tmp_path / "carried.jsonl")
    assert rows[0]["settings"]["known_items"] == {**verdict, "from": str(tmp_path / "blind.jsonl")}
    assert rows[0]["settings"]["prior"] == 0.0
    res, rows = swept(None, tmp_path / "reads.jsonl", tmp_path / "carried.jsonl")
    assert rows[0]["settings"]["prior"] == 0.7


def test_known_items_without_a_prior_or_a_zero_weight_or_a_verdict_exit_2(runner, tmp_path):
    dense, bm25, crops = _known_item_runs(tmp_path, 4)
    qrels = tmp_path / "qrels.txt"
    qrels.write_text(QRELS)
    res = runner("eval", dense, bm25, "--qrels", qrels, "--sweep", "0:1:0.1", "--known-items", crops)
    assert res.exit_code == 2 and "--known-items moves --sweep-prior's weight: give both" in res.output, res.output
    res = runner("eval", dense, bm25, "--qrels", qrels, "--known-items", crops)
    assert res.exit_code == 2 and "--known-items only apply with --sweep" in res.output, res.output
    res = runner("eval", dense, bm25, "--qrels", qrels, "--sweep", "0.5:1:0.1", "--sweep-prior", "0.7", "--known-items", crops)
    assert res.exit_code == 2 and "lacks the weight 0 that --known-items" in res.output, res.output
    plain = tmp_path / "plain.jsonl"
    assert runner("eval", dense, bm25, "--qrels", qrels, "--sweep", "0:1:0.1", "--json", "-o", plain).exit_code == 0
    out = tmp_path / "out.jsonl"
    res = runner("eval", dense, bm25, "--qrels", qrels, "--sweep", "0:1:0.1", "--sweep-prior", "0.7", "--known-items", plain,
                 "--json", "-o", out)
    assert res.exit_code == 2 and "plain.jsonl is a sweep made without --known-items" in res.output, res.output
    assert not out.exists()
    elsewhere = tmp_path / "elsewhere.jsonl"  # known items that the runs never searched
    elsewhere.write_text(json.dumps({"query_id": "k9", "query_text": "a sentence", "source_docid": "d9"}) + "\n")
    res = runner("eval", dense, bm25, "--qrels", qrels, "--sweep", "0:1:0.1", "--sweep-prior", "0.7", "--known-items",
                 elsewhere, "--json", "-o", out)
    assert res.exit_code == 2 and "elsewhere.jsonl: none of its queries is in the last run" in res.output, res.output
    assert not out.exists()


def test_sweep_prior_off_the_grid_or_without_a_sweep_exits_2(runner, tmp_path):
    a, b = write_trec(tmp_path / "a.trec", A), write_trec(tmp_path / "b.trec", B)
    qrels = tmp_path / "qrels.txt"
    qrels.write_text(QRELS)
    res = runner("eval", a, b, "--qrels", qrels, "--sweep", "0:1:0.5", "--sweep-prior", "0.3")
    assert res.exit_code == 2 and "0.3 is not a weight of --sweep 0:1:0.5" in res.output, res.output
    res = runner("eval", a, b, "--qrels", qrels, "--sweep-prior", "0.5")
    assert res.exit_code == 2 and "--sweep-prior only apply with --sweep" in res.output, res.output


def test_weights_from_an_rrf_sweep_fuses_by_rrf_and_refuses_another_fusion(runner, tmp_path):
    a, b, sweep, _ = _sweep(runner, tmp_path, "--fusion", "rrf")
    out = tmp_path / "f.trec"
    res = runner("fuse", a, b, "--weights-from", sweep, "-o", out)
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "f.trec.manifest.json").read_text())["settings"]["fusion"] == "rrf"
    out.unlink()
    res = runner("fuse", a, b, "--weights-from", sweep, "--fusion", "linear", "-o", out)
    assert res.exit_code == 2 and "--fusion linear: the weights in" in res.stderr and "--fusion rrf" in res.stderr
    assert not out.exists()


@pytest.mark.parametrize(("content", "words"), [
    ("", "no sweep rows"),
    ('{"weights": [0.5, 0.5], "R@100": 0.3}\n', "sweep.jsonl:1: field 'nDCG@10': missing or not a number (this row has R@100"),
    ('{"weights": [0.5, 0.5], "nDCG@10": 0.3}\n{"run": "x.trec", "nDCG@10": 0.4}\n', "sweep.jsonl:2: field 'weights'"),
    ('{"weights": [0.5, 0.5], "nDCG@10": 0.3}\nnot json\n', "sweep.jsonl:2: invalid JSON"),
])
def test_weights_from_bad_input_exits_2_naming_file_line_field(runner, tmp_path, content, words):
    a, b = write_trec(tmp_path / "a.trec", A), write_trec(tmp_path / "b.trec", B)
    sweep = tmp_path / "sweep.jsonl"
    sweep.write_text(content)
    out = tmp_path / "f.trec"
    res = runner("fuse", a, b, "--weights-from", sweep, "-o", out)
    assert res.exit_code == 2 and words in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not out.exists()
    res = runner("fuse", a, b, "--weights-from", sweep, "--weights", "0.5", "-o", out)
    assert res.exit_code == 2 and "not both" in res.stderr and not out.exists()
