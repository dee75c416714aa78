"""BGE-M3's heads on one backbone (issue 17): the colbert (multi-vector) head, the lexical head, their saving and
loading, and the self-distillation objective. Tiny random BERT and Llama; the real-model numbers are bench/m3.py's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from retrctl.models import Encoder
from retrctl.models.colbert import maxsim, maxsim_numpy

TEXTS = ["cat dog tea", "python rust memory safety language", "bean", "tea tea tea coffee water"]


@pytest.fixture(params=["bert", "llama"])
def m3(request, tiny_bert, tiny_llama):
    e = Encoder.load(tiny_bert if request.param == "bert" else tiny_llama, device="cpu")
    torch.manual_seed(0)
    e.add_sparse_head(top_k=0, query="encoder", weights="lexical")
    e.add_colbert_head(dim=8)
    return e.eval()


def test_maxsim_matches_numpy_reference_with_padding():
    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(3, 5, 4, generator=g), dim=-1)
    p = torch.nn.functional.normalize(torch.randn(6, 7, 4, generator=g), dim=-1)
    q[0, 3:] = 0  # padding rows
    q[2, 1:] = 0
    p[1, 2:] = 0
    p[4, :] = 0  # a passage with no real token
    got = maxsim(q, p, chunk=4).numpy()
    for i in range(3):
        qi = q[i][q[i].norm(dim=-1) > 0].numpy()
        want = maxsim_numpy(qi, [pj[pj.norm(dim=-1) > 0].numpy() for pj in p])
        np.testing.assert_allclose(got[i], want, atol=1e-6)
    assert got[0, 4] == 0


def test_lexical_weights_take_the_max_per_repeated_term(m3):
    batch = m3.tokenize(["tea tea coffee"], "query")
    with torch.no_grad():
        hidden = m3.model(**batch).last_hidden_state
        per_token = torch.relu(m3.sparse.linear(hidden)).squeeze(-1)[0]
        weights = m3.sparse(hidden, batch["attention_mask"], batch["input_ids"])[0]
    ids = batch["input_ids"][0]
    keep = m3.sparse.term_mask(batch["input_ids"], batch["attention_mask"])[0]
    tea = m3.tokenizer.convert_tokens_to_ids("tea")
    assert float(weights[tea]) == pytest.approx(float(per_token[(ids == tea) & keep].max()))
    assert int((weights > 0).sum()) <= len(set(ids[keep].tolist()))  # no expansion: only the text's own terms
    assert all(float(weights[s]) == 0 for s in m3.sparse.special_ids)


def test_colbert_tokens_skip_padding_and_special_tokens(m3):
    out = m3.encode_heads(TEXTS, "passage", batch_size=2)
    for text, vecs in zip(TEXTS, out["colbert"], strict=True):
        ids = m3.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert vecs.shape == (len(ids), 8)
        np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    # one pass gives the same as each head alone, whatever the batch
    alone = m3.encode_colbert(TEXTS[1:2], "passage")
    np.testing.assert_allclose(alone[0], out["colbert"][1], atol=1e-5)
    assert out["dense"].shape == (4, m3.dim) and out["sparse"][0].shape[0] == 4


def test_heads_save_and_load_give_the_same_outputs(m3, tmp_path):
    with torch.no_grad():
        m3.sparse.linear.weight.add_(0.5)
        m3.colbert.linear.bias.add_(0.1)
    before = m3.encode_heads(TEXTS, "passage")
    m3.save(tmp_path / "m")
    again = Encoder.load(tmp_path / "m", device="cpu")
    assert again.sparse.weights == "lexical" and again.sparse.query == "encoder" and again.colbert.out_dim == 8
    after = again.encode_heads(TEXTS, "passage")
    np.testing.assert_allclose(after["dense"], before["dense"], atol=1e-5)
    np.testing.assert_allclose(after["sparse"][1], before["sparse"][1], atol=1e-5)
    for a, b in zip(after["colbert"], before["colbert"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    q = torch.from_numpy(np.stack([np.pad(v, ((0, 20 - len(v)), (0, 0))) for v in again.encode_colbert(TEXTS, "query")]))
    p = torch.from_numpy(np.stack([np.pad(v, ((0, 20 - len(v)), (0, 0))) for v in after["colbert"]]))
    np.testing.assert_allclose(again.colbert.similarity(q, p).numpy()[1, 1], 1.0, atol=1e-5)  # itself
