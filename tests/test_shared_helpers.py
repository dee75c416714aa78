"""Helpers written once for logic several stages need: one LO-HI range parser (mine --negative-range, rerank
--negative-ranks), one pad-token fix, one id padder, one stdout guard."""

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


@pytest.mark.parametrize("left", [True, False])
def test_pad_ids_places_rows_on_the_side_and_masks_the_pad(left):
    from retrctl.models import pad_ids

    batch = pad_ids([[5, 6, 7], [8]], pad_id=0, left=left)
    want = [[5, 6, 7], [0, 0, 8]] if left else [[5, 6, 7], [8, 0, 0]]
    assert batch["input_ids"].tolist() == want
    assert batch["attention_mask"].tolist() == [[int(t != 0) for t in row] for row in want]
    wide = pad_ids([[5, 6, 7], [8]], pad_id=9, left=left, width=5)  # a longer width pads further; a shorter one is ignored
    assert wide["input_ids"].shape == (2, 5) and wide["attention_mask"].sum().item() == 4
    assert pad_ids([[5, 6, 7]], pad_id=9, left=left, width=2)["input_ids"].tolist() == [[5, 6, 7]]


def test_tokenize_to_a_width_equals_padding_afterwards(tiny_llama):
    """The trainer's pad-to-max-length step (first step measures the worst case) now asks tokenize for the width."""
    import torch

    from retrctl.models import Encoder

    enc = Encoder.load(str(tiny_llama))
    short = enc.tokenize(["a b c", "a"])
    wide = enc.tokenize(["a b c", "a"], width=short["input_ids"].size(1) + 3)
    left = enc.tokenizer.padding_side == "left"
    pad = (3, 0) if left else (0, 3)
    assert torch.equal(wide["input_ids"], torch.nn.functional.pad(short["input_ids"], pad, value=enc.tokenizer.pad_token_id))
    assert torch.equal(wide["attention_mask"], torch.nn.functional.pad(short["attention_mask"], pad, value=0))


def test_ensure_pad_token_uses_eos_then_unk_and_keeps_an_existing_one():
    from types import SimpleNamespace

    from retrctl.models import ensure_pad_token

    class Tok(SimpleNamespace):
        @property
        def pad_token_id(self):
            return None if self.pad_token is None else 0

    assert ensure_pad_token(Tok(pad_token=None, eos_token="</s>", unk_token="<unk>")).pad_token == "</s>"
    assert ensure_pad_token(Tok(pad_token=None, eos_token=None, unk_token="<unk>")).pad_token == "<unk>"
    assert ensure_pad_token(Tok(pad_token="<pad>", eos_token="</s>", unk_token="<unk>")).pad_token == "<pad>"


def test_stdout_to_stderr_keeps_stdout_for_data(capsys):
    from retrctl.models import stdout_to_stderr

    with stdout_to_stderr():
        print("DeepSpeed banner")
    print("data")
    out, err = capsys.readouterr()
    assert out == "data\n" and err == "DeepSpeed banner\n"
