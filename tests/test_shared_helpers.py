"""The helpers issue 13 made out of logic that was written several times in different words: one LO-HI range
parser (mine --negative-range, rerank --negative-ranks), one pad-token fix, one id padder, one stdout guard."""

import pytest

from retrctl.stage import parse_range


@pytest.mark.parametrize("text, want", [("30-100", (30, 100)), (" 1 - 1 ", (1, 1)), ("10-20", (10, 20))])
def test_parse_range_accepts_lo_hi(text, want):
    assert parse_range(text) == want


@pytest.mark.parametrize("text", ["abc", "9-3", "0-5", "-5-10", "5", "1-2-3", ""])
def test_parse_range_refuses_with_the_name(text):
    with pytest.raises(ValueError, match="negative range"):
        parse_range(text, "negative range")


@pytest.mark.parametrize("stage, flag", [("mine", "--negative-range"), ("rerank", "--negative-ranks")])
def test_both_range_flags_refuse_alike(runner, tmp_path, stage, flag):
    inp = tmp_path / "in.jsonl"
    inp.write_text("")
    res = runner(stage, str(inp), flag, "9-3")
    assert res.exit_code == 2 and f"'{flag}'" in res.stderr and "1 <= LO <= HI" in res.stderr and not res.stdout
