"""rerank: the total permutation parser (unit + hypothesis), sliding windows, listwise/pointwise on tiny models and
an oracle LLM, DRAMA relabelling, CLI run and group modes, dry run, resume, the openai backend, bad input."""

import json
import random
import re
from pathlib import Path

import pytest
from conftest import DOCS, QUERIES, shared_data
from hypothesis import given, settings
from hypothesis import strategies as st
from openai_server import OpenAIServer

from retrctl import records
from retrctl.llm import LLM, load_llm
from stages.rerank import (
    TEMPLATES,
    parse_permutation,
    passage_content,
    plan,
    pointwise_prompt,
    relabel,
    rerank,
    template_for,
    windows,
)

# ---------------------------------------------------------------- parser


@pytest.mark.parametrize("text, n, perm, status", [
    ("[2] > [1] > [3]", 3, [1, 0, 2], "ok"),
    ("[11] > [2] > [1]", 12, [10, 1, 0, 2, 3, 4, 5, 6, 7, 8, 9, 11], "repaired"),  # FlashRank#33: [11] is not 1
    ("<think>[3] > [1] > [2]</think>\n[2] > [1] > [3]", 3, [1, 0, 2], "ok"),
    ("so [3] then [1]</think>[2] > [3] > [1]", 3, [1, 2, 0], "ok"),  # template opened the think block
    ("<think>I should rank [3] first", 3, [0, 1, 2], "failed"),  # reasoning never ended: no answer
    ("Passage 3 is the most relevant, then 1.", 3, [2, 0, 1], "repaired"),
    ("¹ > ③ > ２", 3, [0, 2, 1], "ok"),  # superscript, circled, full-width
    ("①② > ③", 3, [0, 1, 2], "ok"),  # circled digits stay apart
    ("[１０] > [２]", 10, [9, 1, 0, 2, 3, 4, 5, 6, 7, 8], "repaired"),
    ("٣ > ١ > ٢", 3, [2, 0, 1], "ok"),  # Arabic-Indic digits
    ("[1] > [1] > [2] > [7] > [0]", 3, [0, 1, 2], "repaired"),  # duplicate, out of range, zero
    ("I cannot rank these passages.", 4, [0, 1, 2, 3], "failed"),
    ("", 2, [0, 1], "failed"),
    ("9" * 5000 + " [2]", 2, [1, 0], "repaired"),  # int() of a huge digit run would raise
    ("anything", 1, [0], "ok"),
    ("[1]", 0, [], "ok"),
])
def test_parser_cases(text, n, perm, status):
    assert parse_permutation(text, n) == (perm, status)


def _is_perm(p, n):
    return sorted(p) == list(range(n))


@settings(max_examples=300, deadline=None)
@given(st.text(), st.integers(0, 40))
def test_parser_is_total_on_arbitrary_text(text, n):
    perm, status = parse_permutation(text, n)
    assert _is_perm(perm, n) and status in ("ok", "repaired", "failed")


PIECES = st.one_of(
    st.sampled_from(["[", "]", " > ", ">", " ", "\n", "<think>", "</think>", "Passage", "①", "⑳", "¹", "２", "٣", "[[",
                     "]]", "-", "[ 3 ]", "\x00", "\ufeff"]),
    st.integers(-5, 10**12).map(str),
    st.integers(0, 45).map(lambda i: f"[{i}]"),
    st.text(max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(PIECES, max_size=60).map("".join), st.integers(0, 40))
def test_parser_is_total_on_adversarial_rankings(text, n):
    perm, _ = parse_permutation(text, n)
    assert _is_perm(perm, n)


def test_parser_never_raises_on_non_strings():
    assert parse_permutation(None, 3)[0] == [0, 1, 2]


@pytest.mark.parametrize("n, expected", [
    (100, [(80, 100), (70, 90), (60, 80), (50, 70), (40, 60), (30, 50), (20, 40), (10, 30), (0, 20)]),
    (20, [(0, 20)]), (25, [(5, 25), (0, 15)]), (5, [(0, 5)]), (0, []),
])
def test_sliding_windows_bottom_up_like_rank_llm(n, expected):
    assert windows(n, 20, 10) == expected


# ---------------------------------------------------------------- method


class OracleLLM(LLM):
    """Ranks the passages of a window by the number in their text, highest first (tests the window mechanics)."""

    backend = "oracle"

    def __init__(self):
        super().__init__("oracle-smollm2")  # name matches the smollm2 template: no warning

    def count_tokens(self, text):
        return len(self.render(text).split())

    def describe(self):
        return {"backend": "oracle", "model": self.name}

    def generate(self, prompts, **kw):
        out = []
        for p in prompts:
            body = p[-1]["content"]
            vals = [int(v) for v in re.findall(r"^\[\d+\] value (\d+)$", body, re.M)]
            order = sorted(range(len(vals)), key=lambda i: -vals[i])
            out.append(" > ".join(f"[{i + 1}]" for i in order))
            self._count(calls=1)
        return out


def _items(values, qid="q"):
    return [{"query_id": qid, "query_text": "highest", "docs": [{"docid": f"d{v}", "title": "", "text": f"value {v}"}
                                                              for v in values]}]


def test_listwise_sliding_window_bubbles_the_top_up():
    rng = random.Random(0)
    values = rng.sample(range(1000), 40)
    llm = OracleLLM()
    stats = {}
    out = list(rerank(_items(values), llm, window=20, stride=10, top_k=30, stats=stats))[0]
    head, tail = out["docids"][:30], out["docids"][30:]
    assert head[:10] == [f"d{v}" for v in sorted(values[:30], reverse=True)[:10]]  # top window - stride are exact
    assert sorted(head) == sorted(f"d{v}" for v in values[:30])
    assert tail == [f"d{v}" for v in values[30:]]  # below top-k: input order
    assert llm.usage["calls"] == len(windows(30, 20, 10)) == stats["windows"]["ok"] == 2
    assert out["scores"] == [1.0 / r for r in range(1, 31)]


def test_listwise_on_a_random_model_falls_back_and_counts(tiny_llama):
    llm = load_llm(tiny_llama)
    items = _items([3, 1, 2, 5, 4]) + _items([7, 8], qid="q2")
    stats = {}
    out = list(rerank(items, llm, window=3, stride=2, passage_max_words=3, stats=stats, template="rank_llm"))
    for it, res in zip(items, out, strict=True):
        assert sorted(res["docids"]) == sorted(d["docid"] for d in it["docs"])
    assert sum(stats["windows"].values()) == len(windows(5, 3, 2)) + len(windows(2, 3, 2)) == llm.usage["calls"]


def test_pointwise_scores_are_yes_logprobs(tiny_llama):
    llm = load_llm(tiny_llama)
    items = [{"query_id": q["query_id"], "query_text": q["query_text"], "docs": DOCS} for q in QUERIES[:2]]
    out = list(rerank(items, llm, mode="pointwise", top_k=4, passage_max_words=8))
    tmpl = TEMPLATES["yes_no"]
    for it, res in zip(items, out, strict=True):
        prompts = [pointwise_prompt(tmpl, it["query_text"], passage_content(d, 8), False) for d in DOCS[:4]]
        want = llm.logprobs([p for p, _ in prompts], [a for _, a in prompts])
        ranked = sorted(range(4), key=lambda i: (-want[i], i))
        assert res["docids"][:4] == [DOCS[i]["docid"] for i in ranked]
        assert res["scores"] == pytest.approx([want[i] for i in ranked], abs=1e-5)
        assert res["docids"][4:] == ["d5", "d6"]


def test_relabel_like_drama():
    result = {"docids": [f"d{i}" for i in range(1, 26)], "scores": [1.0 / r for r in range(1, 26)]}
    g = relabel({"query_id": "q", "query_text": "t"}, result, (10, 20))
    assert g["positive_document_ids"] == ["d1"]
    assert g["negative_document_ids"] == [f"d{i}" for i in range(10, 21)]
    assert g["positive_scores"] == [1.0] and g["negative_scores"][0] == pytest.approx(0.1)


def test_unknown_model_warns_about_the_generic_template(tiny_llama, caplog):
    llm = load_llm(tiny_llama, tokenizer_only=True)
    with caplog.at_level("WARNING", logger="retrctl.rerank"):
        p = plan(_items([1, 2, 3]), llm, window=2, stride=1)
    assert "generic" in caplog.text
    assert p["llm_calls"] == len(windows(3, 2, 1)) and p["prompt_tokens"] > 0
    with pytest.raises(ValueError, match="pointwise"):
        plan(_items([1]), llm, mode="pointwise", template="rank_llm")


# ---------------------------------------------------------------- CLI


@pytest.fixture
def run_file(tmp_path):
    p = tmp_path / "run.trec"
    lines = [f"{q['query_id']} Q0 {d['docid']} {r} {10 - r} bm25" for q in QUERIES for r, d in enumerate(DOCS, 1)]
    p.write_text("\n".join(lines) + "\n")
    return p


def _cli(tiny_llama, run_file, queries_file, corpus_file, *extra):
    return ("rerank", run_file, "--queries", queries_file, "--corpus", corpus_file, "--llm", tiny_llama, "--window", 3,
            "--stride", 2, "--passage-max-words", 4, "--template", "rank_llm", *extra)


def test_cli_reranks_a_run_keeping_its_docs(runner, tiny_llama, run_file, queries_file, corpus_file, tmp_path):
    res = runner(*_cli(tiny_llama, run_file, queries_file, corpus_file, "--top-k", 4))
    assert res.exit_code == 0, res.stderr
    out = tmp_path / "out.trec"
    out.write_text(res.stdout)
    run = records.read_run(out)
    assert set(run) == {q["query_id"] for q in QUERIES}
    for ranked in run.values():
        docs = [d for d, _ in ranked]
        assert sorted(docs) == sorted(d["docid"] for d in DOCS) and docs[4:] == ["d5", "d6"]
    assert "windows:" in res.stderr and "parse-failure rate" in res.stderr and "LLM calls" in res.stderr
    assert "retrctl" not in res.stdout.replace("retrctl-rerank", "")


def test_cli_groups_relabelled_pointwise(runner, tiny_llama, corpus_file, tmp_path):
    groups = tmp_path / "groups.jsonl"
    ids = [d["docid"] for d in DOCS]
    groups.write_text("".join(json.dumps({"query_id": q["query_id"], "query_text": q["query_text"],
                                          "positive_document_ids": ids[:1], "negative_document_ids": ids[1:]}) + "\n"
                              for q in QUERIES))
    out = tmp_path / "relabelled.jsonl"
    res = runner("rerank", groups, "--corpus", corpus_file, "--llm", tiny_llama, "--mode", "pointwise",
                 "--negative-ranks", "3-5", "--passage-max-words", 4, "-o", out)
    assert res.exit_code == 0, res.stderr
    assert res.stdout == ""
    got = list(records.read(out, "group"))
    assert len(got) == 3
    for g in got:
        assert len(g["positive_document_ids"]) == 1 and len(g["negative_document_ids"]) == 3
        assert not set(g["positive_document_ids"]) & set(g["negative_document_ids"])
        assert g["positive_scores"][0] >= max(g["negative_scores"])
    manifest = json.loads((tmp_path / "relabelled.jsonl.manifest.json").read_text())
    assert manifest["settings"]["mode"] == "pointwise" and manifest["llm"]["versions"]["torch"]
    assert not (tmp_path / "relabelled.jsonl.partial.jsonl").exists()


def test_cli_keep_labels_scores_the_groups_as_they_are(runner, tiny_llama, corpus_file, tmp_path):
    """GPL's pseudo-labels: positives and negatives stay where they were, the scores are the LLM's query likelihood."""
    groups = tmp_path / "groups.jsonl"
    ids = [d["docid"] for d in DOCS]
    rows = [{"query_id": q["query_id"], "query_text": q["query_text"], "positive_document_ids": ids[-1:],
             "negative_document_ids": ids[:3]} for q in QUERIES]
    groups.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "scored.jsonl"
    res = runner("rerank", groups, "--corpus", corpus_file, "--llm", tiny_llama, "--mode", "qlm", "--keep-labels",
                 "--passage-max-words", 4, "-o", out)
    assert res.exit_code == 0, res.stderr
    got = list(records.read(out, "group"))
    llm = load_llm(tiny_llama)
    tmpl = TEMPLATES["upr"]
    for g, want in zip(got, rows, strict=True):
        assert g["positive_document_ids"] == want["positive_document_ids"]
        assert g["negative_document_ids"] == want["negative_document_ids"]
        docs = {d["docid"]: d for d in DOCS}
        prompts = [pointwise_prompt(tmpl, g["query_text"], passage_content(docs[d], 4), False)
                   for d in g["positive_document_ids"] + g["negative_document_ids"]]
        scores = llm.logprobs([p for p, _ in prompts], [a for _, a in prompts])
        assert g["positive_scores"] + g["negative_scores"] == pytest.approx(scores, abs=1e-5)
    assert json.loads((tmp_path / "scored.jsonl.manifest.json").read_text())["negative_ranks"] is None
    # a group longer than --top-k, listwise ranks, or DRAMA's ranks with it: exit 2, nothing written
    for extra, flag in ((["--mode", "qlm", "--top-k", "2"], "--top-k"), (["--mode", "listwise"], "--keep-labels"),
                        (["--mode", "qlm", "--negative-ranks", "2-3"], "--keep-labels")):
        bad = tmp_path / "bad.jsonl"
        res = runner("rerank", groups, "--corpus", corpus_file, "--llm", tiny_llama, "--keep-labels", *extra, "-o", bad)
        assert res.exit_code == 2 and flag in res.stderr, (extra, res.stderr)
        assert not list(tmp_path.glob("bad.jsonl*")), extra


def test_cli_dry_run_counts_without_loading_weights(runner, tiny_llama, run_file, queries_file, corpus_file, monkeypatch):
    import transformers

    def boom(*a, **k):
        raise AssertionError("dry run loaded the weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    res = runner(*_cli(tiny_llama, run_file, queries_file, corpus_file, "--dry-run"))
    assert res.exit_code == 0, res.stderr
    assert res.stdout == ""
    calls = int(re.search(r"LLM calls \(windows\)\s+(\d+)", res.stderr).group(1))
    assert calls == len(QUERIES) * len(windows(len(DOCS), 3, 2))
    assert int(re.search(r"prompt tokens.*?\s([\d,]+)\n", res.stderr).group(1).replace(",", "")) > 0


def test_cli_resumes_per_query(runner, tiny_llama, run_file, queries_file, corpus_file, tmp_path, monkeypatch):
    from retrctl.llm import HFLLM

    full = tmp_path / "full.trec"
    assert runner(*_cli(tiny_llama, run_file, queries_file, corpus_file, "--batch-size", 1, "-o", full)).exit_code == 0
    real, calls = HFLLM.generate, []

    def flaky(self, prompts, **kw):
        calls.append(len(prompts))
        if len(calls) == len(windows(len(DOCS), 3, 2)) + 1:  # the first query's windows done, then killed
            raise KeyboardInterrupt
        return real(self, prompts, **kw)

    monkeypatch.setattr(HFLLM, "generate", flaky)
    out = tmp_path / "out.trec"
    res = runner(*_cli(tiny_llama, run_file, queries_file, corpus_file, "--batch-size", 1, "-o", out))
    assert res.exit_code == 130 and not out.exists()
    partial = tmp_path / "out.trec.partial.jsonl"
    assert len(partial.read_text().splitlines()) == 2  # settings + one query
    monkeypatch.setattr(HFLLM, "generate", real)
    res = runner(*_cli(tiny_llama, run_file, queries_file, corpus_file, "--batch-size", 1, "-o", out))
    assert res.exit_code == 0, res.stderr
    assert "resumed: 1 of 3 queries" in res.stderr
    assert out.read_text() == full.read_text() and not partial.exists()
    # window outcomes cover every query, the resumed one included; LLM usage only what this run called
    whole, resumed = (json.loads(Path(f"{f}.manifest.json").read_text()) for f in (full, out))
    assert resumed["windows"] == whole["windows"] and sum(whole["windows"].values()) == 3 * len(windows(len(DOCS), 3, 2))
    assert (resumed["queries"], resumed["resumed"]) == (3, 1)
    assert resumed["usage"]["calls"] == 2 * len(windows(len(DOCS), 3, 2)) < whole["usage"]["calls"]


def test_cli_openai_backend_pointwise_matches_hf(runner, tiny_llama, run_file, queries_file, corpus_file):
    args = _cli(tiny_llama, run_file, queries_file, corpus_file, "--mode", "pointwise", "--template", "yes_no", "--top-k", 4)
    hf = runner(*args)
    with OpenAIServer(tiny_llama) as srv:
        oa = runner(*args, "--llm-backend", "openai", "--base-url", srv.url, "--concurrency", 2)
        assert len(srv.requests) == len(QUERIES) * 4
    assert hf.exit_code == oa.exit_code == 0, oa.stderr
    assert oa.stdout == hf.stdout


def test_cli_bad_input_exits_2_without_output(runner, tiny_llama, run_file, queries_file, corpus_file, tmp_path):
    bad = tmp_path / "bad.trec"
    bad.write_text(run_file.read_text() + "q1 Q0 nosuchdoc 7 0.5 bm25\n")
    out = tmp_path / "out.trec"
    res = runner(*_cli(tiny_llama, bad, queries_file, corpus_file, "-o", out))
    assert res.exit_code == 2
    assert "bad.trec: field 'doc_id': doc 'nosuchdoc'" in res.stderr
    assert not out.exists()
    res = runner("rerank", run_file, "--corpus", corpus_file, "--llm", tiny_llama, "-o", out)  # a run without --queries
    assert res.exit_code == 2 and "give --queries" in res.stderr and not out.exists()
    res = runner("rerank", run_file, "--corpus", corpus_file, "--queries", queries_file, "--negative-ranks", "5-2")
    assert res.exit_code == 2


@pytest.mark.real
def test_smollm2_listwise_on_scifact():
    data = shared_data("scifact")
    q = next(records.read(data, "query"))
    docs = [d for _, d in zip(range(5), records.read(data, "doc"), strict=False)]
    stats = {}
    out = list(rerank([{"query_id": q["query_id"], "query_text": q["query_text"], "docs": docs}], "smollm2", window=5,
                      stride=5, passage_max_words=40, stats=stats))
    assert sorted(out[0]["docids"]) == sorted(d["docid"] for d in docs)
    assert sum(stats["windows"].values()) == 1


def test_qlm_scores_are_query_logprobs_given_the_passage(tiny_llama):
    llm = load_llm(tiny_llama)
    items = [{"query_id": q["query_id"], "query_text": q["query_text"], "docs": DOCS} for q in QUERIES[:2]]
    out = list(rerank(items, llm, mode="qlm", top_k=4, passage_max_words=8))
    tmpl = TEMPLATES["upr"]
    for it, res in zip(items, out, strict=True):
        prompt, answer = pointwise_prompt(tmpl, it["query_text"], passage_content(DOCS[0], 8), False)
        assert answer == " " + it["query_text"] and "Please write a question" in prompt
        want = llm.logprobs([pointwise_prompt(tmpl, it["query_text"], passage_content(d, 8), False)[0] for d in DOCS[:4]],
                            [answer] * 4)
        ranked = sorted(range(4), key=lambda i: (-want[i], i))
        assert res["docids"][:4] == [DOCS[i]["docid"] for i in ranked]
        assert res["scores"] == pytest.approx([want[i] for i in ranked], abs=1e-5)
    assert template_for("anything", "qlm") == "upr"
    with pytest.raises(ValueError, match="qlm"):
        template_for("smollm2", "qlm", override="yes_no")
