"""BGE-M3's heads on one backbone: the colbert (multi-vector) head, the lexical head, their saving and
loading, and the self-distillation objective. Tiny random BERT and Llama; the real-model numbers are bench/m3.py's."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from retrctl.models import Encoder
from retrctl.models.colbert import maxsim, maxsim_numpy
from retrctl.models.layout import StepOutputs

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


# ---------------------------------------------------------------- the objective


def _ce(logits, label):
    return -(logits[label] - np.log(np.exp(logits).sum()))


def test_m3_loss_matches_a_hand_computation():
    """Two queries, group size 2: dense (2 dims), term weights (vocab 3), colbert blocks (cap 2 × dim 2)."""
    from retrctl.train import losses

    g = torch.Generator().manual_seed(3)
    unit = lambda *s: torch.nn.functional.normalize(torch.randn(*s, generator=g), dim=-1)  # noqa: E731
    qd, pd = torch.randn(2, 2, generator=g), torch.randn(4, 2, generator=g)
    qs, ps = torch.rand(2, 3, generator=g), torch.rand(4, 3, generator=g)
    qc, pc = unit(2, 2, 2), unit(4, 2, 2)
    qc[1, 1] = 0  # the second query has one token
    out = StepOutputs({"dense": qd, "sparse": qs, "colbert": qc}, {"dense": pd, "sparse": ps, "colbert": pc})
    tau, w, lam = 0.5, (1.0, 0.3, 1.0), (1.0, 0.1, 1.0)
    dense = functools.partial(losses.dense_loss, loss=lambda a, b: losses.group_loss(a, b, group_size=2, temperature=tau))
    got, parts = losses.m3_loss(out, loss=dense, group_size=2, temperature=tau, weights=w, lambdas=lam, self_distill=True)
    # by hand, one query and one candidate at a time
    n = lambda v: v / np.linalg.norm(v)  # noqa: E731
    total_l, total_d = 0.0, 0.0
    for i in range(2):
        sd = np.array([n(qd[i].numpy()) @ n(pd[j].numpy()) for j in range(4)]) / tau
        sl = np.array([qs[i].numpy() @ ps[j].numpy() for j in range(4)]) / tau
        toks = qc[i].numpy()[: 2 - i]
        sm = np.array([np.mean([max(t @ pc[j, k].numpy() for k in range(2)) for t in toks]) for j in range(4)]) / tau
        inter = w[0] * sd + w[1] * sl + w[2] * sm
        label = 2 * i
        heads = [sd, sl, sm]
        total_l += (sum(lam[h] * _ce(s, label) for h, s in enumerate(heads)) + _ce(inter, label)) / 4
        t = np.exp(inter - inter.max()) / np.exp(inter - inter.max()).sum()
        total_d += sum(lam[h] * -(t * (s - np.log(np.exp(s).sum()))).sum() for h, s in enumerate(heads)) / 3
    want = (total_l / 2 + total_d / 2) / 2
    assert float(got) == pytest.approx(want, rel=1e-5)
    assert {"ce", "ce_sparse", "ce_colbert", "ce_inter", "self_distill"} <= set(parts)
    plain, _ = losses.m3_loss(out, loss=dense, group_size=2, temperature=tau, weights=w, lambdas=lam, self_distill=False)
    assert float(plain) == pytest.approx(total_l / 2, rel=1e-5)


def test_self_distill_gradients_reach_every_head(tiny_bert):
    from retrctl.train import TrainConfig
    from retrctl.train.loop import build_encoder

    cfg = TrainConfig(model=str(tiny_bert), heads="dense,lexical,colbert", colbert_dim=8, device="cpu",
                      query_max_len=16, passage_max_len=24)
    cfg.check()
    enc = build_encoder(cfg, "cpu")
    assert enc.sparse.weights == "lexical" and enc.sparse.query == "encoder" and enc.train_colbert
    qb = enc.tokenize(["tea and coffee", "rust memory"], "query")
    pb = enc.tokenize(["tea coffee water", "a dog", "rust memory safety", "purr"], "passage")
    from retrctl.train import losses

    q, p = enc(qb, raw=True), enc(pb, raw=True)
    assert q.shape[1] == 32 + enc.sparse.vocab + 16 * 8 and p.shape[1] == 32 + enc.sparse.vocab + 24 * 8
    dense = functools.partial(losses.dense_loss, loss=lambda a, b: losses.group_loss(a, b, group_size=2, temperature=0.05))
    loss, _ = losses.m3_loss(enc.layout.split(q, p), loss=dense, group_size=2, temperature=0.05, self_distill=True)
    loss.backward()
    for name, param in (("lexical", enc.sparse.linear.weight), ("colbert", enc.colbert.linear.weight),
                        ("backbone", enc.model.embeddings.word_embeddings.weight)):
        assert param.grad is not None and float(param.grad.abs().sum()) > 0, name


def test_train_three_heads_saves_a_model_that_reloads_them(tiny_bert, tmp_path):
    from trainkit import FAST, write_jsonl
    from trainkit import corpus as _corpus
    from trainkit import groups as _groups

    from retrctl.train import TrainConfig
    from stages.train import train

    corpus = write_jsonl(tmp_path / "corpus.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    groups = write_jsonl(tmp_path / "groups.jsonl", _groups())
    runs = {}
    for cache in ("off", "on"):
        cfg = TrainConfig(model=str(tiny_bert), **FAST, heads="dense,lexical,colbert", colbert_dim=8, max_steps=3,
                          grad_cache=cache, chunk_size=3, device="cpu")
        out = tmp_path / f"m-{cache}"
        train(str(groups), output=out, corpus=str(corpus), config=cfg)
        runs[cache] = Encoder.load(out, device="cpu").encode_heads(TEXTS, "passage")
    enc = Encoder.load(tmp_path / "m-on", device="cpu")
    assert enc.sparse.weights == "lexical" and enc.colbert.out_dim == 8
    # GradCache (chunks of 3) trains the same weights as plain steps
    np.testing.assert_allclose(runs["on"]["dense"], runs["off"]["dense"], atol=2e-4)
    for a, b in zip(runs["on"]["colbert"], runs["off"]["colbert"], strict=True):
        np.testing.assert_allclose(a, b, atol=2e-4)


@pytest.mark.parametrize("heads, match", [("dense,sparse,lexical", "choose one"), ("lexical,colbert", "dense plus"),
                                          ("dense,bm25", "dense plus")])
def test_bad_train_heads_are_refused(heads, match):
    from retrctl.train import TrainConfig

    with pytest.raises(ValueError, match=match):
        TrainConfig(model="x", heads=heads).check()


def test_colbert_head_exports_as_a_stock_multi_vector_encoder(tiny_bert, tmp_path, runner):
    import json

    from sentence_transformers import MultiVectorEncoder
    from trainkit import FAST, write_jsonl
    from trainkit import corpus as _corpus
    from trainkit import groups as _groups

    groups = write_jsonl(tmp_path / "g.jsonl", _groups(4, negatives=2))
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    fast = [f"--{k.replace('_', '-')}={v}" for k, v in FAST.items() if k != "train_group_size"]
    r = runner("train", groups, "--corpus", corpus, "--model", tiny_bert, "-o", tmp_path / "m", "--max-steps", 2,
               "--train-group-size", 2, "--heads", "dense,lexical,colbert", "--colbert-dim", 8, "--no-self-distill",
               "--query-prompt", "query: ", "--query-max-len", 12, *fast)
    assert r.exit_code == 0, r.stderr
    assert json.loads((tmp_path / "m" / "train_config.json").read_text())["self_distill"] is False
    r = runner("export", tmp_path / "m", "-o", tmp_path / "dist", "--format", "st,multi-vector-encoder")
    assert r.exit_code == 0, r.stderr
    stock = MultiVectorEncoder(str(tmp_path / "dist" / "multi-vector-encoder"), device="cpu")  # no retrctl code
    enc = Encoder.load(tmp_path / "m", device="cpu")
    texts = ["rust memory safety without a garbage collector", "cats purr", "a longer passage " * 10]
    for kind, encode in (("query", stock.encode_query), ("passage", stock.encode_document)):
        for ours, theirs in zip(enc.encode_colbert(texts, kind), encode(texts), strict=True):
            assert ours.shape == tuple(theirs.shape)
            assert np.abs(ours - theirs.float().numpy()).max() <= 1e-4
    report = json.loads((tmp_path / "dist" / "export.json").read_text())
    assert report["formats"]["multi-vector-encoder"]["max_abs_diff"] <= 1e-4
    # the lexical head has no stock module: refused with the reason, nothing written
    r = runner("export", tmp_path / "m", "-o", tmp_path / "d2", "--format", "sparse-encoder")
    assert r.exit_code == 2 and "lexical" in r.stderr and not (tmp_path / "d2").exists()
    r = runner("export", tiny_bert, "-o", tmp_path / "d3", "--format", "multi-vector-encoder")
    assert r.exit_code == 2 and "no colbert head" in r.stderr and not (tmp_path / "d3").exists()


# ---------------------------------------------------------------- MCLS


def test_mcls_inserts_a_cls_every_n_tokens_and_averages_their_states(tiny_bert):
    text = "one two three four five six seven"
    enc = Encoder.load(tiny_bert, device="cpu", pooling="cls", mcls=3)
    cls, sep = enc.tokenizer.cls_token_id, enc.tokenizer.sep_token_id
    ids = enc.tokenize([text], "passage")["input_ids"][0].tolist()
    words = enc.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == [cls, *words[:3], cls, *words[3:6], cls, *words[6:], sep]
    batch = enc.tokenize([text], "passage")
    with torch.no_grad():
        hidden = enc.model(**batch).last_hidden_state[0]
        want = hidden[[0, 4, 8]].mean(0)
        got = enc(batch, raw=True)[0]
    torch.testing.assert_close(got, want)
    # the inserted tokens count in the cap; a text shorter than N is plain CLS pooling
    enc.config.passage_max_len = 6
    assert enc.tokenize([text], "passage")["input_ids"].size(1) == 6
    plain = Encoder.load(tiny_bert, device="cpu", pooling="cls")
    np.testing.assert_allclose(enc.encode(["one two"]), plain.encode(["one two"]), atol=1e-6)


def test_three_heads_under_zero2_grad_cache_and_lora_match_one_plain_process(no_dropout_bert, tmp_path):
    """ZeRO-2 on 2 gloo processes with GradCache (chunks of 3) and LoRA: the three-head, self-distilled losses of one
    plain process with the whole batch (the colbert blocks and term weights are gathered across processes)."""
    from test_train import _files, _free_port, _torchrun
    from trainkit import losses as _losses

    from stages.train import train

    corpus_file, groups_file = _files(tmp_path, 24)
    heads = ["--heads", "dense,lexical,colbert", "--colbert-dim", 8]
    lora = ["--lora-r", 4, "--lora-dropout", 0, "--lora-check-steps", 2]
    common = [groups_file, "--corpus", corpus_file, "--model", no_dropout_bert, "--train-group-size", 3, "--lr", 1e-3,
              "--max-steps", 4, "--query-max-len", 16, "--passage-max-len", 24, *heads, *lora]
    r = _torchrun(2, [*common, "--train-batch-size", 2, "--zero-stage", 2, "--grad-cache", "--chunk-size", 3, "-o", tmp_path / "two"],
                  tmp_path, _free_port())
    assert r.returncode == 0, r.stderr[-3000:]
    one = train(str(groups_file), corpus=str(corpus_file), output=tmp_path / "one", model=str(no_dropout_bert),
                train_group_size=3, lr=1e-3, max_steps=4, query_max_len=16, passage_max_len=24, batch_size=4,
                heads="dense,lexical,colbert", colbert_dim=8, lora_r=4, lora_dropout=0.0, lora_check_steps=2)
    assert np.allclose(_losses(one), _losses(tmp_path / "two"), atol=1e-3)
    enc = Encoder.load(tmp_path / "two", device="cpu")
    assert enc.colbert is not None and enc.sparse.weights == "lexical"


def test_a_checkpoint_naming_the_old_default_sparse_query_still_resumes():
    from retrctl.train.config import TrainConfig, resume_conflicts

    assert resume_conflicts({"heads": "dense,sparse", "sparse_query": "tokens"}, TrainConfig(heads="dense,sparse")) == []
    assert resume_conflicts({"heads": "dense,lexical,colbert"}, TrainConfig(heads="dense,lexical,colbert")) == []
    assert resume_conflicts({"heads": "dense,sparse", "sparse_query": "encoder"}, TrainConfig(heads="dense,sparse"))
