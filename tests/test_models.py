"""Model loading, pooling under both padding sides, EOS handling, truncation counts, save/reload."""

import json

import numpy as np
import pytest
import torch

from retrctl.models import Encoder, pool

TEXTS = ["a short one", "a somewhat longer sentence about cats and dogs", "x", "retrieval " * 30]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("pooling", ["mean", "cls", "eos", "last"])
def test_batched_equals_single_under_both_padding_sides(tiny_llama, side, pooling):
    enc = Encoder.load(tiny_llama, pooling=pooling, device="cpu")
    enc.tokenizer.padding_side = side
    batched = enc.encode(TEXTS, batch_size=4)
    single = np.stack([enc.encode([t], batch_size=1)[0] for t in TEXTS])
    cos = (batched * single).sum(1)
    assert (cos > 0.9999).all(), cos


def test_pool_positions_from_mask():
    hidden = torch.arange(2 * 4, dtype=torch.float).view(2, 4, 1)
    left = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]])
    assert pool(hidden, left, "cls").flatten().tolist() == [1.0, 6.0]
    assert pool(hidden, left, "last").flatten().tolist() == [3.0, 7.0]
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    assert pool(hidden, right, "last").flatten().tolist() == [1.0, 6.0]
    assert pool(hidden, right, "mean").flatten().tolist() == [0.5, 5.0]


def test_eos_pooling_appends_eos_to_every_row(tiny_llama):
    enc = Encoder.load(tiny_llama, pooling="eos", passage_max_len=8, device="cpu")
    batch = enc.tokenize(TEXTS)
    last = batch["attention_mask"].size(1) - 1 - batch["attention_mask"].flip(1).argmax(1)
    rows = batch["input_ids"][torch.arange(len(TEXTS)), last]
    assert (rows == enc.tokenizer.eos_token_id).all()
    assert enc.truncated["passage"] == 2  # the two long texts


def test_truncation_counted_and_special_tokens_kept(tiny_bert):
    enc = Encoder.load(tiny_bert, passage_max_len=6, device="cpu")
    batch = enc.tokenize(["one two three four five six seven eight", "short"])
    ids = batch["input_ids"][0].tolist()
    assert len(ids) == 6 and ids[-1] == enc.tokenizer.sep_token_id
    assert enc.truncated["passage"] == 1


def test_bidirectional_changes_decoder_attention(tiny_llama):
    causal = Encoder.load(tiny_llama, pooling="cls", device="cpu")
    bidir = Encoder.load(tiny_llama, pooling="cls", bidirectional=True, device="cpu")
    a = causal.encode(["alpha beta", "alpha gamma"])
    b = bidir.encode(["alpha beta", "alpha gamma"])
    assert np.allclose(a[0], a[1], atol=1e-5)  # causal: the first token cannot see the rest
    assert not np.allclose(b[0], b[1], atol=1e-5)


def test_save_reload_and_stock_sentence_transformers(tiny_bert, tmp_path):
    enc = Encoder.load(tiny_bert, pooling="cls", query_prompt="query: ", device="cpu")
    before = enc.encode(TEXTS)
    enc.save(tmp_path / "m")
    again = Encoder.load(tmp_path / "m", device="cpu")
    assert again.config == enc.config
    assert np.allclose(before, again.encode(TEXTS), atol=1e-6)
    saved = json.loads((tmp_path / "m" / "retrctl.json").read_text())
    assert saved["pooling"] == "cls" and saved["query_prompt"] == "query: "

    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(tmp_path / "m"), device="cpu")
    st_vecs = st.encode(TEXTS, convert_to_numpy=True)
    assert np.allclose(before, st_vecs, atol=1e-5)
    q = st.encode(["cats"], prompt_name="query")
    assert np.allclose(q, enc.encode(["cats"], kind="query"), atol=1e-5)


def test_unknown_model_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        Encoder.load(tmp_path / "nope")


@pytest.mark.real
def test_minilm_matches_sentence_transformers():
    from sentence_transformers import SentenceTransformer

    from retrctl.models import locate_shipped

    enc = Encoder.load("minilm", device="cpu")
    st = SentenceTransformer(str(locate_shipped("minilm")), device="cpu")
    texts = ["Cats purr.", "A study of protein folding in yeast cells under heat stress."]
    assert np.allclose(enc.encode(texts), st.encode(texts), atol=1e-5)


@pytest.mark.parametrize("fixture", ["tiny_bert", "tiny_llama"])
def test_backbone_loads_without_transformers_warnings(fixture, request, caplog):
    """A single-process load has nothing to report: no load table, no "layers were not sharded" (transformers 5.24
    checks a tensor-parallel plan whenever its load report is silenced), so a CLI error stays one line."""
    import logging

    from retrctl.models.loading import load_backbone

    with caplog.at_level(logging.WARNING):
        load_backbone(request.getfixturevalue(fixture), None)
    assert not [r for r in caplog.records if r.name.startswith("transformers")], caplog.text
