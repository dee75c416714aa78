"""crop: language-agnostic sentence splitting, bounds, offsets, determinism (seed, docid), sharding, CLI, bad input."""

import json
import logging

import pytest
from conftest import DOCS, shared_data

from retrctl import records
from stages.crop import crop, sentences, units

LANGS = ["ar", "de", "el", "en", "es", "hi", "ro", "ru", "th", "tr", "vi", "zh"]


def _split(text):
    return [text[s:e] for s, e in sentences(text)]


def test_sentence_rules_latin_abbreviations_and_decimals():
    text = "\ufeffJ. Smith moved to the U.S. Army in 3.5 years. He said e.g. it works! Did he? Yes.\nNew line here"
    assert _split(text) == [
        "J. Smith moved to the U.S. Army in 3.5 years.",
        "He said e.g. it works!",
        "Did he?",
        "Yes.",
        "New line here",
    ]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("黑豹队丢了308分。他们排名第六！真的吗？是的", ["黑豹队丢了308分。", "他们排名第六！", "真的吗？", "是的"]),
        ("यह पहला वाक्य है। यह दूसरा है॥ तीसरा", ["यह पहला वाक्य है।", "यह दूसरा है॥", "तीसरा"]),
        ("هل هذا سؤال؟ نعم هذا جواب.", ["هل هذا سؤال؟", "نعم هذا جواب."]),
        ("မြန်မာစာ ပထမ။ဒုတိယ စာကြောင်း။", ["မြန်မာစာ ပထမ။", "ဒုတိယ စာကြောင်း။"]),
        ("«Он сказал: „Да.“» Потом ушёл.", ["«Он сказал: „Да.“»", "Потом ушёл."]),
    ],
)
def test_sentence_rules_non_latin_terminators(text, expected):
    assert _split(text) == expected


def test_units_count_han_characters_and_thai_graphemes():
    assert len(units("黑豹队，丢了")) == 5  # punctuation is not a unit
    assert len(units("the cat, sat .")) == 3
    thai = "ทีมรับของแพนเธอร์ส"  # no spaces: counted by ~4 graphemes
    assert 2 <= len(units(thai)) <= 5
    assert "".join(thai[s:e] for s, e in units(thai)) == thai


def _docs(lang, n=6):
    path = shared_data(f"xquad/{lang}")
    return list(records.read(path, "doc"))[:n]


@pytest.mark.real
@pytest.mark.parametrize("lang", LANGS)
def test_xquad_every_language_offsets_and_bounds(lang):
    docs = _docs(lang)
    qs = list(crop(docs, per_doc=2, min_words=4, max_words=24, seed=3))
    by_id = {d["docid"]: d for d in docs}
    assert {q["source_docid"] for q in qs} == set(by_id)  # every (long) XQuAD paragraph gives crops
    for q in qs:
        text = by_id[q["source_docid"]]["text"]
        assert text[q["start"] : q["end"]] == q["query_text"]
        assert q["query_text"] == q["query_text"].strip().lstrip("\ufeff")
        assert 4 <= len(units(q["query_text"])) <= 24, q
    # multi-sentence paragraphs (Thai: clauses) give two distinct crops; one-sentence paragraphs give one
    counts = []
    for d in docs:
        mine = [q for q in qs if q["source_docid"] == d["docid"]]
        counts.append(len(mine))
        assert len({q["start"] for q in mine}) == len(mine)
    assert max(counts) == 2 and min(counts) >= 1


def test_seed_per_docid_independent_of_other_docs():
    alone = list(crop(DOCS[3:4], per_doc=1, min_words=2, seed=7))
    together = [q for q in crop(DOCS, per_doc=1, min_words=2, seed=7) if q["source_docid"] == DOCS[3]["docid"]]
    assert alone == together
    seeds = {tuple(q["query_text"] for q in crop(DOCS, min_words=2, seed=s)) for s in range(8)}
    assert len(seeds) > 1  # the seed matters


def test_long_sentence_is_windowed_flagged_and_counted(caplog):
    caplog.set_level(logging.INFO, logger="retrctl.crop")
    doc = {"docid": "long", "title": "", "text": " ".join(f"w{i}" for i in range(100)) + ". Short one here ok."}
    qs = list(crop([doc], per_doc=2, min_words=3, max_words=10, seed=0))
    cut = [q for q in qs if q["truncated"]]
    assert len(cut) == 1 and len(units(cut[0]["query_text"])) == 10
    assert "1 crops cut to 10 words" in caplog.text


def test_span_mode_within_bounds():
    qs = list(crop(DOCS, unit="span", per_doc=3, min_words=2, max_words=5, seed=1))
    assert qs and all(2 <= len(units(q["query_text"])) <= 5 for q in qs)
    assert len({(q["source_docid"], q["start"], q["end"]) for q in qs}) == len(qs)


def test_bad_arguments():
    with pytest.raises(ValueError):
        list(crop(DOCS, min_words=10, max_words=5))


def _write(tmp_path, docs, name="corpus.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    return p


def test_cli_stdout_records_stderr_logs_and_skips(runner, tmp_path):
    docs = DOCS + [{"docid": "tiny", "title": "", "text": "Hi."}]
    res = runner("crop", _write(tmp_path, docs), "--min-words", "3", "--seed", "1")
    assert res.exit_code == 0, res.stderr
    qs = [records.normalize_query(json.loads(line)) for line in res.stdout.splitlines()]
    assert len(qs) == len(DOCS) and all(q["query_id"].startswith(q["source_docid"] + "#crop") for q in qs)
    assert "1 docs skipped" in res.stderr and "{" not in res.stderr


def test_old_flag_name_max_tokens_still_works_with_a_warning(runner, tmp_path):
    """--max-tokens counted words, so it is --max-words now; the old name stays for one release."""
    corpus = _write(tmp_path, DOCS)
    new = runner("crop", corpus, "--max-words", "5", "--min-words", "2", "--seed", "1")
    old = runner("crop", corpus, "--max-tokens", "5", "--min-words", "2", "--seed", "1")
    assert new.exit_code == old.exit_code == 0, old.stderr
    assert old.stdout == new.stdout != runner("crop", corpus, "--min-words", "2", "--seed", "1").stdout
    assert "--max-tokens is now --max-words" in old.stderr and "--max-tokens" not in new.stderr
    both = runner("crop", corpus, "--max-tokens", "5", "--max-words", "6")
    assert both.exit_code == 2 and "--max-tokens is the old name of --max-words" in both.stderr
    assert runner("crop", corpus, "--max-tokens", "0").exit_code == 2  # checked as the new name is
    assert "--max-tokens" not in runner("crop", "--help").stdout


@pytest.mark.real
def test_cli_byte_identical_and_shards_concatenate(runner, tmp_path):
    docs = []
    for lang in ("en", "zh", "th", "hi"):
        docs += [{**d, "docid": f"{lang}-{d['docid']}"} for d in _docs(lang, 8)]
    corpus = _write(tmp_path, docs)
    args = ("crop", corpus, "--per-doc", "2", "--seed", "5", "-q")
    a, b = runner(*args), runner(*args)
    assert a.exit_code == 0 and a.stdout_bytes == b.stdout_bytes and a.stdout
    shards = [runner(*args, "--shard-id", i, "--shard-num", 3) for i in range(3)]
    assert all(s.exit_code == 0 for s in shards) and all(s.stdout for s in shards)
    assert sorted("".join(s.stdout for s in shards).splitlines()) == sorted(a.stdout.splitlines())
    two = runner(*args, "--shard-id", "1-2", "--shard-num", 3)
    assert sorted(two.stdout.splitlines()) == sorted("".join(s.stdout for s in shards[1:]).splitlines())
    assert runner(*args[:-2], "6", "-q").stdout != a.stdout


def test_bad_input_exit_2_no_output_file(runner, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(DOCS[0]) + "\n" + json.dumps({"docid": "x", "text": None}) + "\n")
    out = tmp_path / "out.jsonl"
    res = runner("crop", bad, "-o", out)
    assert res.exit_code == 2
    assert "bad.jsonl:2: field 'text'" in res.stderr
    assert not out.exists() and not list(tmp_path.glob(".out.jsonl*"))


def test_sample_takes_the_same_docs_in_any_order_from_this_shard(runner, tmp_path):
    from retrctl.hashing import shard

    docs = [{"docid": f"d{i}", "title": "", "text": f"Sentence number {i} is here. Another one for doc {i}."}
            for i in range(60)]
    corpus, reverse = _write(tmp_path, docs), _write(tmp_path, docs[::-1], "reverse.jsonl")

    def sources(*args):
        res = runner("crop", *args, "--seed", 3, "--shard-id", 0, "--shard-num", 2, "-q")
        assert res.exit_code == 0, res.stderr
        return [json.loads(line)["source_docid"] for line in res.stdout.splitlines()]

    taken = sources(corpus, "--sample", 7)
    assert len(taken) == 7 and sorted(sources(reverse, "--sample", 7)) == sorted(taken)
    assert taken == [d["docid"] for d in docs if d["docid"] in taken]  # in the input's order
    assert set(taken) <= {d["docid"] for d in shard(docs, 0, 2, "docid")}
    assert set(taken) < set(sources(corpus, "--sample", 12))  # a larger sample keeps the smaller one
    assert len(sources(corpus, "--sample", 1000)) == len(list(shard(docs, 0, 2, "docid")))
    out = tmp_path / "out.jsonl"
    res = runner("crop", corpus, "--sample", 0, "-o", out)
    assert res.exit_code == 2 and "--sample" in res.stderr and not out.exists()
