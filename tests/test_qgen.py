"""qgen: InPars/chat prompts, cleaning, every filter removing rows with counts equal to the rows written, per-doc
seeding, resume after an interrupt, re-filtering without regenerating, the manifest, the openai backend, bad input."""

import json
import math
import re

import pytest
from conftest import DOCS, shared_data
from openai_server import OpenAIServer

from retrctl import records
from retrctl.crops import count_words, cut_words
from retrctl.llm import LLM, Checkpoint, load_llm
from stages.qgen import build_prompt, clean, document_text, qgen

EXAMPLES = [{"document": "Aspirin lowers the risk of heart attacks.", "query": "does aspirin prevent heart attacks"},
            {"document": "Vitamin D is made in the skin under sunlight.", "query": "how is vitamin d produced"}]


def test_prompts_follow_inpars_and_chat_formats():
    assert build_prompt("Cats purr.", [], chat=False) == "Document: Cats purr.\nRelevant Query:"
    assert build_prompt("Cats purr.", EXAMPLES, chat=False) == (
        "Example 1:\nDocument: Aspirin lowers the risk of heart attacks.\nRelevant Query: does aspirin prevent heart "
        "attacks\n\nExample 2:\nDocument: Vitamin D is made in the skin under sunlight.\nRelevant Query: how is vitamin"
        " d produced\n\nExample 3:\nDocument: Cats purr.\nRelevant Query:")
    msgs = build_prompt("Cats purr.", EXAMPLES, chat=True)
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
    assert msgs[1]["content"] == EXAMPLES[0]["query"] and msgs[-1]["content"].endswith("Document: Cats purr.")


@pytest.mark.parametrize("raw, want", [('Query: "what makes cats purr?"', "what makes cats purr?"),
                                       ("1. cats purr", "cats purr"), ("Relevant Query: - tea  leaves", "tea leaves"),
                                       ("«café au lait»", "café au lait"), ("plain query", "plain query"),
                                       ("Document: Cats purr", "Cats purr")])
def test_clean_strips_labels_markers_and_quotes(raw, want):
    assert clean(raw) == want


class ScriptLLM(LLM):
    """Answers per document title (tests filters exactly; generation itself is tested on real models)."""

    backend = "script"

    def __init__(self, answers):
        super().__init__("script")
        self.answers, self.seen = answers, {}

    def describe(self):
        return {"backend": "script", "model": "script"}

    def generate(self, prompts, *, details=False, **kw):
        out = []
        for p in prompts:
            title = re.search(r"Document: (\w+)\.", p).group(1)
            k = self.seen.get(title, 0)
            self.seen[title] = k + 1
            text, lp = self.answers[title][k]
            out.append({"text": text, "logprob": lp, "tokens": len(text.split())})
        return out


ANSWERS = {"Cats": [("which animals purr", -1.0)], "Dogs": [("Which animals PURR?", -0.5)],
           "Python": [("python", -0.1)], "Rust": [("memory safe systems language", -3.0)],
           "Tea": [("Query: tea leaves hot water drink", -0.2)], "Coffee": [("coffee " * 40, -0.3)],
           "Milk": [("Milk is a white liquid produced by mammals", -0.01)]}  # copied from its doc
MILK = {"docid": "d7", "title": "Milk", "text": "Milk is a white liquid produced by mammals. It feeds the young."}


def test_words_are_counted_across_scripts():
    tea = {"docid": "z1", "title": "茶", "text": "绿茶是未经发酵的茶，保留了鲜叶的天然物质。" * 30}
    text, cut = document_text(tea, 20)  # the title's character, then 19 of the text's: punctuation is no word
    assert cut and text == "茶. 绿茶是未经发酵的茶，保留了鲜叶的天然物质" and count_words(text) == 20
    english = "  A cat — the\tsmall one —  naps.  "
    assert cut_words(english, 4) == (" ".join(english.split()[:4]), True)  # spaced scripts: str.split()'s words
    assert cut_words(english, 8) == (" ".join(english.split()), False) and count_words(english) == 8  # dashes too
    answers = {"茶": [("绿茶怎么泡", -0.5)], "Cats": [("猫" * 40, -0.5)]}
    stats = {}
    rows = list(qgen([tea, DOCS[0]], ScriptLLM(answers), min_words=2, max_words=32, stats=stats))
    assert [r["query_text"] for r in rows] == ["绿茶怎么泡"]  # five words, not one (too short)
    assert stats["counts"]["too_long"] == 1  # forty characters are forty words


def test_filters_remove_rows_and_the_counts_equal_the_rows():
    stats = {}
    rows = list(qgen(DOCS + [MILK], ScriptLLM(ANSWERS), min_words=2, max_words=32, keep_top=0.5, stats=stats))
    assert rows == [{"query_id": "d1#qgen0", "query_text": "which animals purr", "source_docid": "d1"},
                    {"query_id": "d5#qgen0", "query_text": "tea leaves hot water drink", "source_docid": "d5"}]
    c = stats["counts"]
    assert c == {"generated": 7, "too_short": 1, "too_long": 1, "duplicate": 1, "copied": 1, "chatter": 0, "low_score": 1,
                 "kept": 2}
    assert c["generated"] - sum(v for k, v in c.items() if k not in ("generated", "kept")) == c["kept"] == len(rows)
    assert stats["score_threshold"] == -1.0
    kept = list(qgen(DOCS + [MILK], ScriptLLM(ANSWERS), keep_top=0.5, drop_copies=False))
    assert [r["source_docid"] for r in kept] == ["d5", "d7"]  # a copy has the best log-prob: why copies go first


def test_chatter_filter_drops_outputs_that_talk_to_the_user_or_copy_a_passage():
    long_doc = {"docid": "d8", "title": "Fort", "text": "After Washington had returned to Williamsburg, Dinwiddie ordered "
                "him to lead a larger force to assist Trent in his work. While en route, Washington learned of it."}
    answers = {"Cats": [("i am sure that the document is here.", -1.0)], "Dogs": [("Sure! Here is a query: dogs", -1.0)],
               "Python": [("here is the answer to your question.", -1.0)], "Rust": [("see https://rust-lang.org", -1.0)],
               "Tea": [("which leaves make tea", -1.0)], "Coffee": [("what does this text say about beans", -1.0)],
               "Fort": [("After Washington had returned to Williamsburg, Dinwiddie ordered him to lead a larger force to "
                         "assist Trent in his work, and while en route", -1.0)],
               "Milk": [("I like milk", -1.0)]}
    stats = {}
    rows = list(qgen(DOCS + [MILK, long_doc], ScriptLLM(answers), stats=stats))
    assert [r["query_text"] for r in rows] == ["which leaves make tea", "I like milk"]  # a user may write "I"
    assert stats["counts"]["chatter"] == 6 and stats["counts"]["copied"] == 0
    kept = list(qgen(DOCS + [MILK, long_doc], ScriptLLM(answers), drop_chatter=False))
    assert len(kept) == 8


def test_copies_and_copied_passages_are_found_in_scripts_written_without_spaces():
    """A Chinese run taken from the middle of its sentence is a copy (six characters, six words), five characters
    are not; a Thai run counts four letters a word (27 letters, its marks aside: a copy); a query holding a ten-word run of its document copied a passage."""
    zh = {"docid": "z1", "title": "茶", "text": "绿茶是未经发酵的茶，保留了鲜叶的天然物质。"}
    th = {"docid": "t1", "title": "ชา", "text": "ชาเขียวเป็นชาที่ไม่ผ่านการหมักและยังคงรักษาสารธรรมชาติของใบชาสดไว้"}
    zh_long = {"docid": "z2", "title": "史", "text": "一七九四年至一八零九年之间发生了许多重要的历史事件。"}
    answers = {"茶": [("未经发酵的茶", -1.0)], "ชา": [("การหมักและยังคงรักษาสารธรรมชาติ", -1.0)],
               "史": [("一七九四年至一八零九年之间发生了什么", -1.0)]}
    stats = {}
    rows = list(qgen([zh, th, zh_long], ScriptLLM(answers), min_words=1, max_words=64, drop_chatter=False, stats=stats))
    assert stats["counts"]["copied"] == 2 and [r["source_docid"] for r in rows] == ["z2"]
    stats = {}
    rows = list(qgen([zh_long], ScriptLLM(answers), min_words=1, max_words=64, stats=stats))
    assert rows == [] and stats["counts"]["chatter"] == 1  # twelve characters of its sentence, then a question
    short = {"茶": [("发酵的茶", -1.0)], "ชา": [("การหมักและ", -1.0)]}
    assert len(list(qgen([zh, th], ScriptLLM(short), min_words=1, max_words=64))) == 2  # four words; nine letters


def test_a_word_keeps_its_combining_marks_in_the_copy_checks():
    """Devanagari's vowel signs are marks: dropped as punctuation, a four-word Hindi run of its document would be
    fourteen fragments, a copy of six words and more; kept, it is four words, a query."""
    doc = {"docid": "h1", "title": "History", "text": "ब्रैंडेनबर्ग के निर्वाचक फ्रेडरिक विलियम ने शरणार्थियों को बुलाया।"}
    stats = {}
    rows = list(qgen([doc], ScriptLLM({"History": [("ब्रैंडेनबर्ग के निर्वाचक फ्रेडरिक", -1.0)]}), min_words=1, stats=stats))
    assert stats["counts"]["copied"] == 0 and len(rows) == 1


def test_sample_generates_for_the_sampled_docs_only():
    from retrctl.hashing import sample

    llm = ScriptLLM(ANSWERS)
    rows = list(qgen(DOCS + [MILK], llm, sample=3, seed=4, dedupe=False, drop_copies=False, min_words=0))
    chosen = [d["docid"] for d in sample(DOCS + [MILK], 3, 4, "docid")]
    assert [r["source_docid"] for r in rows] == chosen and len(llm.seen) == 3


def test_consistency_filter_keeps_queries_whose_source_ranks_in_top_k():
    from retrctl.indexes import BM25Index

    answers = {**ANSWERS, "Rust": [("coffee beans caffeine", -1.0)], "Coffee": [("roasted coffee beans caffeine", -1.0)]}

    def build(docs):
        index = BM25Index()
        index.build(docs)
        return index

    stats = {}
    rows = list(qgen(DOCS, ScriptLLM(answers), retriever=build, consistency_k=1, stats=stats))
    assert [r["source_docid"] for r in rows] == ["d1", "d5", "d6"]  # d4's query retrieves d6: inconsistent
    assert stats["counts"]["inconsistent"] == 1 and stats["counts"]["kept"] == 3


def test_generation_is_seeded_per_doc_not_per_batch(tiny_llama):
    llm = load_llm(tiny_llama)
    kw = dict(per_doc=2, max_new_tokens=6, min_words=0, max_words=100, dedupe=False)
    one = list(qgen(DOCS, llm, seed=1, batch_size=1, **kw))
    four = list(qgen(DOCS, llm, seed=1, batch_size=4, **kw))
    assert one == four and len(one) == 12
    assert [r["query_id"] for r in one[:2]] == ["d1#qgen0", "d1#qgen1"] and one[0]["query_text"] != one[1]["query_text"]
    assert list(qgen(DOCS, llm, seed=2, **kw)) != one


def test_keep_top_keeps_the_best_scored_candidates(tiny_llama, tmp_path):
    llm = load_llm(tiny_llama)
    cp = Checkpoint(tmp_path / "c.jsonl")
    rows = list(qgen(DOCS, llm, per_doc=2, max_new_tokens=5, min_words=0, max_words=100, keep_top=0.25, checkpoint=cp))
    cp.close()
    cands = [json.loads(x) for x in (tmp_path / "c.jsonl").read_text().splitlines()[1:]]
    assert len(cands) == 12 and all(c["score"] < 0 for c in cands)
    best = sorted(cands, key=lambda c: -c["score"])[: math.ceil(0.25 * 12)]
    assert {r["query_id"] for r in rows} == {c["query_id"] for c in best}


# ---------------------------------------------------------------- CLI


def _args(tiny_llama, corpus, out, *extra):
    return ("qgen", corpus, "--llm", tiny_llama, "--max-new-tokens", 5, "--min-words", 1, "-o", out, *extra)


def _kept(stderr):
    return int(re.search(r"kept (\d+)", stderr).group(1))


def test_cli_writes_queries_counts_and_manifest(runner, tiny_llama, corpus_file, tmp_path):
    out = tmp_path / "q.jsonl"
    res = runner(*_args(tiny_llama, corpus_file, out, "--per-doc", 2, "--keep-top", 0.5, "--seed", 3))
    assert res.exit_code == 0, res.stderr
    assert res.stdout == ""
    rows = list(records.read(out, "query"))
    assert len(rows) == _kept(res.stderr) == 6
    assert all(r["source_docid"] == r["query_id"].split("#")[0] for r in rows)
    assert re.search(r"queries/s, \d+ tokens, [\d.]+ tok/s", res.stderr)
    m = json.loads((tmp_path / "q.jsonl.manifest.json").read_text())
    assert m["settings"]["temperature"] == 0.8 and m["settings"]["top_p"] == 0.9 and m["settings"]["seed"] == 3
    assert m["template"]["sha"] == m["settings"]["template_sha"] and m["template"]["style"] == "plain"
    assert m["counts"]["kept"] == 6 and m["filters"]["keep_top"] == 0.5 and m["llm"]["revision"]
    assert len((tmp_path / "q.jsonl.candidates.jsonl").read_text().splitlines()) == 1 + 12
    res = runner(*_args(tiny_llama, corpus_file, tmp_path / "s.jsonl", "--sample", 2, "--seed", 3))
    assert res.exit_code == 0, res.stderr
    assert json.loads((tmp_path / "s.jsonl.manifest.json").read_text())["sample"] == 2
    generated = (tmp_path / "s.jsonl.candidates.jsonl").read_text().splitlines()[1:]  # after the settings line
    assert len({json.loads(line)["source_docid"] for line in generated}) == 2


def test_cli_stdout_is_records_and_logs_go_to_stderr(runner, tiny_llama, corpus_file):
    res = runner(*_args(tiny_llama, corpus_file, "-"))
    assert res.exit_code == 0, res.stderr
    rows = [json.loads(x) for x in res.stdout.splitlines()]
    assert len(rows) == _kept(res.stderr) and all(set(r) == {"query_id", "query_text", "source_docid"} for r in rows)
    assert "retrctl.qgen" in res.stderr and "retrctl" not in res.stdout


def test_cli_resumes_after_an_interrupt(runner, tiny_llama, corpus_file, tmp_path, monkeypatch):
    from retrctl.llm import HFLLM

    full = tmp_path / "full.jsonl"
    assert runner(*_args(tiny_llama, corpus_file, full, "--batch-size", 1)).exit_code == 0
    real, calls, killed = HFLLM.generate, [], []

    def interrupted(self, prompts, **kw):
        calls.append(len(prompts))
        if len(calls) == 3 and not killed:  # killed after 2 docs
            killed.append(True)
            raise KeyboardInterrupt
        return real(self, prompts, **kw)

    monkeypatch.setattr(HFLLM, "generate", interrupted)
    out = tmp_path / "q.jsonl"
    res = runner(*_args(tiny_llama, corpus_file, out, "--batch-size", 1))
    assert res.exit_code == 130 and not out.exists()
    cands = tmp_path / "q.jsonl.candidates.jsonl"
    assert len(cands.read_text().splitlines()) == 1 + 2
    calls.clear()
    res = runner(*_args(tiny_llama, corpus_file, out, "--batch-size", 1))
    assert res.exit_code == 0, res.stderr
    assert len(calls) == len(DOCS) - 2 and "resumed: 2 of 6 docs" in res.stderr
    assert out.read_text() == full.read_text()


def test_cli_refilters_from_the_candidates_and_refuses_other_generation_settings(runner, tiny_llama, corpus_file,
                                                                              tmp_path, monkeypatch):
    from retrctl.llm import HFLLM

    out = tmp_path / "q.jsonl"
    first = runner(*_args(tiny_llama, corpus_file, out))
    assert first.exit_code == 0, first.stderr

    def no_generation(self, prompts, **kw):
        raise AssertionError("re-filtering regenerated")

    monkeypatch.setattr(HFLLM, "generate", no_generation)
    res = runner(*_args(tiny_llama, corpus_file, out, "--keep-top", 0.5))
    assert res.exit_code == 0, res.stderr
    assert len(list(records.read(out, "query"))) == _kept(res.stderr) == math.ceil(0.5 * _kept(first.stderr))
    res = runner(*_args(tiny_llama, corpus_file, out, "--sampling-temperature", 0.5))
    assert res.exit_code == 2 and "differ in: temperature" in res.stderr


def test_cli_openai_backend_greedy_matches_hf(runner, tiny_llama, corpus_file, tmp_path):
    hf = runner(*_args(tiny_llama, corpus_file, "-", "--sampling-temperature", 0))
    with OpenAIServer(tiny_llama) as srv:
        oa = runner(*_args(tiny_llama, corpus_file, "-", "--sampling-temperature", 0, "--llm-backend", "openai", "--base-url", srv.url))
        assert {r["path"] for r in srv.requests} == {"/v1/completions"} and len(srv.requests) == len(DOCS)
    assert hf.exit_code == oa.exit_code == 0, oa.stderr
    assert oa.stdout == hf.stdout


def test_cli_bad_input_exits_2_without_output(runner, tiny_llama, corpus_file, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(DOCS[0]) + "\n" + json.dumps({"docid": "x", "title": "no text"}) + "\n")
    out = tmp_path / "q.jsonl"
    res = runner(*_args(tiny_llama, bad, out))
    assert res.exit_code == 2 and "bad.jsonl:2:" in res.stderr and '"text"' in res.stderr
    assert not out.exists()
    ex = tmp_path / "examples.jsonl"
    ex.write_text(json.dumps({"document": "a doc"}) + "\n")
    res = runner(*_args(tiny_llama, corpus_file, out, "--examples", ex))
    assert res.exit_code == 2 and "examples.jsonl:1: field 'query'" in res.stderr and not out.exists()
    res = runner(*_args(tiny_llama, corpus_file, out, "--consistency-k", 3))
    assert res.exit_code == 2 and "--retriever" in res.stderr
    res = runner(*_args(tiny_llama, corpus_file, out, "--consistency-k", 3, "--retriever", tmp_path / "nowhere"))
    assert res.exit_code == 2 and "nowhere" in res.stderr and "generated" not in res.stderr  # refused before generating


def test_cli_consistency_filter_with_a_retriever_built_over_the_docs(runner, tiny_llama, corpus_file, tmp_path):
    out = tmp_path / "q.jsonl"
    res = runner(*_args(tiny_llama, corpus_file, out, "--retriever", "bm25", "--consistency-k", 1, "--sampling-temperature", 0))
    assert res.exit_code == 0, res.stderr
    m = re.search(r"(\d+) generated, dropped (.*); kept (\d+)", res.stderr)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert m and len(rows) == int(m.group(3)) and "inconsistent" in m.group(2)


@pytest.mark.real
def test_smollm2_writes_queries_for_scifact_docs(tmp_path):
    docs = [d for _, d in zip(range(2), records.read(shared_data("scifact"), "doc"), strict=False)]
    stats = {}
    rows = list(qgen(docs, "smollm2", examples=EXAMPLES, shots=1, seed=1, max_new_tokens=16, doc_max_words=60,
                     stats=stats))
    assert stats["template"]["style"] == "chat" and stats["llm"]["chat_template"]
    assert stats["counts"]["generated"] == 2 and len(rows) == stats["counts"]["kept"]
    assert all(r["query_text"] and "\n" not in r["query_text"] for r in rows)


@pytest.mark.parametrize("stage", ["qgen", "rerank"])
def test_cli_backend_is_the_encoder_runtime_not_the_llm_client(runner, tiny_llama, corpus_file, tmp_path, stage):
    """--backend means the encoder runtime (index, search); qgen and rerank refuse it, naming --llm-backend."""
    out = tmp_path / "out.jsonl"
    res = runner(stage, corpus_file, "--llm", tiny_llama, "--backend", "openai", "-o", out)
    assert res.exit_code == 2 and "--llm-backend hf|openai" in res.stderr and not out.exists(), res.stderr
    assert len(res.stderr.strip().splitlines()[-1].split("Error: ")) == 2


def test_a_base_url_alone_chooses_the_openai_client():
    from retrctl.llm.flags import chosen_backend

    assert chosen_backend({"base_url": "http://h/v1"}) == ("openai", "http://h/v1")
    assert chosen_backend({}) == ("hf", None)
    assert chosen_backend({"llm_backend": "hf", "base_url": "http://h/v1"}) == ("hf", "http://h/v1")
