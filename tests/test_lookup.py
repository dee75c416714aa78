"""LightRetriever's token-lookup query encoder (retrctl/models/lookup.py): the per-token mask, the table, serving
without a transformer, the joint loss, and train → index → search on the CLI. Tiny random BERT and Llama."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from trainkit import FAST, write_jsonl
from trainkit import corpus as _corpus
from trainkit import groups as _groups

from retrctl.models import Encoder, lookup
from retrctl.models.layout import StepOutputs
from retrctl.train import losses


def test_mask_lets_a_query_token_see_the_prefix_and_itself_only():
    batch, real = lookup.masked_batch([1, 2], [[5, 6, 7], [8]], pad_id=0, full_prefix=False, dtype=torch.float32, device="cpu")
    allowed = batch["attention_mask"][0, 0] == 0
    expect = torch.tensor([[1, 0, 0, 0, 0],   # prefix: causal among itself
                           [1, 1, 0, 0, 0],
                           [1, 1, 1, 0, 0],   # each query token: prefix + itself
                           [1, 1, 0, 1, 0],
                           [1, 1, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(allowed, expect)
    assert batch["attention_mask"].shape == (2, 1, 5, 5)
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 2, 2]  # every query token right after the prefix
    assert batch["input_ids"].tolist() == [[1, 2, 5, 6, 7], [1, 2, 8, 0, 0]]
    assert real.tolist() == [[True, True, True], [True, False, False]]
    full, _ = lookup.masked_batch([1, 2], [[5]], pad_id=0, full_prefix=True, dtype=torch.float32, device="cpu")
    assert bool((full["attention_mask"][0, 0, :2, :2] == 0).all())


@pytest.fixture(params=["bert", "llama", "llama-bidirectional"])
def enc(request, tiny_bert, tiny_llama):
    path = tiny_bert if request.param == "bert" else tiny_llama
    e = Encoder.load(path, device="cpu", pooling="last" if "llama" in request.param else "mean",
                     bidirectional=request.param == "llama-bidirectional", query_prompt="find: ")
    e.eval()
    return e


def test_a_token_vector_is_the_token_encoded_alone_with_the_prefix(enc):
    prefix = lookup.query_prefix(enc)
    assert prefix  # [CLS] + "find :"
    full = lookup.prefix_sees_itself(enc.model, enc.config.bidirectional)
    tokens = [2003, 1037, 3231, 7592]
    with torch.inference_mode():
        b, _ = lookup.masked_batch(prefix, [tokens], enc.tokenizer.pad_token_id, full, torch.float32, "cpu")
        together = lookup.token_vectors(enc.model, b, len(prefix))[0]
        for i, t in enumerate(tokens):
            b1, _ = lookup.masked_batch(prefix, [[t]], enc.tokenizer.pad_token_id, full, torch.float32, "cpu")
            alone = lookup.token_vectors(enc.model, b1, len(prefix))[0, 0]
            assert torch.allclose(together[i], alone, atol=1e-5)
            if not full:  # a causal decoder: exactly the plain forward of [prefix, token], its last state
                plain = enc.model(input_ids=torch.tensor([prefix + [t]])).last_hidden_state[0, -1]
                assert torch.allclose(alone, plain, atol=1e-5)


def test_table_serves_the_vectors_of_the_masked_forward(enc, tmp_path):
    enc.save(tmp_path / "m")
    lookup.save_table(enc, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / lookup.TABLE_DIR / "config.json").read_text())
    assert cfg["vocab"] == len(enc.tokenizer) and cfg["prefix_ids"] == lookup.query_prefix(enc)
    texts = ["what is a protein", "cells", "", "the role of [SEP] tokens in BERT models", "word " * 300]
    with torch.inference_mode():
        raw = lookup.lookup_forward(enc, enc.tokenize(texts, "query"))
        want = enc.head.finish(raw).numpy()
    served = lookup.TokenLookupEncoder.load(tmp_path / "m")
    got = served.encode(texts)
    assert got.shape == (5, enc.dim)
    assert np.abs(got - want).max() < 1e-5
    one_by_one = np.vstack([served.encode([t]) for t in texts])  # the single-query path
    assert np.abs(one_by_one - got).max() < 1e-5
    assert np.allclose(got[2], 0) and np.allclose(one_by_one[2], 0)  # no tokens: a zero vector, not NaN
    with pytest.raises(ValueError, match="queries only"):
        served.encode(texts, kind="passage")
    with pytest.raises(ValueError, match="built with query prompt"):
        lookup.TokenLookupEncoder.load(tmp_path / "m", query_prompt="search: ")


def test_a_model_with_a_table_saves_all_of_itself(tiny_bert, tmp_path):
    enc = Encoder.load(tiny_bert, device="cpu", query_prompt="find: ")
    enc.token_lookup = lookup.TokenLookup(enc)
    enc.save(tmp_path / "a")  # Encoder.save writes the table: no caller has to remember it
    assert lookup.has_table(tmp_path / "a")
    again = Encoder.load(tmp_path / "a", device="cpu")
    assert again.token_lookup
    again.save(tmp_path / "b")  # unchanged weights: the same table, byte for byte
    table = f"{lookup.TABLE_DIR}/{lookup.TABLE_FILE}"
    assert (tmp_path / "a" / table).read_bytes() == (tmp_path / "b" / table).read_bytes()
    with torch.no_grad():  # changed weights: the table follows them, never a stale copy
        again.model.get_input_embeddings().weight.mul_(2.0)
    again.save(tmp_path / "c")
    served = lookup.TokenLookupEncoder.load(tmp_path / "c").encode(["a protein"])
    with torch.inference_mode():
        want = again.head.finish(lookup.lookup_forward(again, again.tokenize(["a protein"], "query"))).numpy()
    assert np.abs(served - want).max() < 1e-5
    assert not np.array_equal(served, lookup.TokenLookupEncoder.load(tmp_path / "a").encode(["a protein"]))
    assert not Encoder.load(tiny_bert, device="cpu").token_lookup  # a model without a table saves none


def test_token_ids_read_from_the_rust_tokenizer_equal_the_batch_encoding(tiny_bert):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    texts = ["find: what is a protein", "find: ", "find: [SEP] inside", "find: " + "word " * 40]
    want = tok(texts, truncation=True, max_length=12)["input_ids"]
    assert lookup.token_ids(tok, texts, 12) == want  # the first call sets the backend up through __call__

    class Counting:  # then the backend is read directly
        def __init__(self, backend):
            self.backend, self.calls = backend, 0

        def encode_batch_fast(self, texts):
            self.calls += 1
            return self.backend.encode_batch_fast(texts)

        def __getattr__(self, name):
            return getattr(self.backend, name)

    tok._tokenizer = spy = Counting(tok._tokenizer)
    assert lookup.token_ids(tok, texts, 12) == want and spy.calls == 1
    tok._tokenizer = spy.backend
    tok(texts, padding=True)  # another caller leaves padding and no truncation set: back through __call__, same ids
    assert lookup.token_ids(tok, texts, 12) == want
    assert lookup.token_ids(tok, texts, 7) == tok(texts, truncation=True, max_length=7)["input_ids"]


def test_joint_loss_by_hand():
    torch.manual_seed(0)
    full, light, p = torch.randn(2, 4), torch.randn(2, 4), torch.randn(4, 4)  # 2 queries, groups of 2
    base = lambda x, y: losses.group_loss(x, y, group_size=2, temperature=0.1)  # noqa: E731
    total, parts = losses.joint_lookup_loss(StepOutputs({"dense": full, "lookup": light}, {"dense": p}), loss=base,
                                            kl_weight=0.5, temperature=0.1)
    norm = torch.nn.functional.normalize
    s_full = norm(full, dim=-1) @ norm(p, dim=-1).T / 0.1
    s_light = norm(light, dim=-1) @ norm(p, dim=-1).T / 0.1
    labels = torch.tensor([0, 2])
    ce = torch.nn.functional.cross_entropy
    pt, log_pt, log_ps = s_full.softmax(-1), s_full.log_softmax(-1), s_light.log_softmax(-1)
    kl = (pt * (log_pt - log_ps)).sum(-1).mean()
    want = ce(s_full, labels) + ce(s_light, labels) + 0.5 * kl
    assert torch.allclose(total, want, atol=1e-5)
    assert torch.allclose(parts["kl_lookup"], kl, atol=1e-6) and torch.allclose(parts["ce_lookup"], ce(s_light, labels), atol=1e-6)
    full.requires_grad_(True)
    light.requires_grad_(True)
    losses.joint_lookup_loss(StepOutputs({"dense": full, "lookup": light}, {"dense": p}), loss=base, kl_weight=0.5,
                             temperature=0.1)[0].backward()
    assert full.grad.abs().sum() > 0 and light.grad.abs().sum() > 0


def test_cli_train_then_search_by_token_lookup(runner, tiny_bert, corpus_file, queries_file, tmp_path):
    groups = write_jsonl(tmp_path / "g.jsonl", _groups(4, negatives=2))
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    fast = [f"--{k.replace('_', '-')}={v}" for k, v in FAST.items() if k != "train_group_size"]
    model = tmp_path / "light"
    r = runner("train", groups, "--corpus", corpus, "--model", tiny_bert, "-o", model, "--max-steps", 2,
               "--train-group-size", 2, "--query-encoder", "token-lookup", *fast)
    assert r.exit_code == 0, r.stderr
    assert lookup.has_table(model)
    metrics = [json.loads(line) for line in (model / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and metrics[-1]["kl_lookup"] >= 0 and metrics[-1]["ce_lookup"] > 0
    from sentence_transformers import SentenceTransformer

    assert SentenceTransformer(str(model), device="cpu").encode(["a"]).shape[-1] == 32  # the full model, stock

    assert runner("index", corpus_file, "--model", model, "-o", tmp_path / "idx").exit_code == 0
    light = runner("search", tmp_path / "idx", queries_file, "--hits", 3, "-o", tmp_path / "light.trec")
    assert light.exit_code == 0, light.stderr
    full = runner("search", tmp_path / "idx", queries_file, "--hits", 3, "--query-encoder", "full", "-o", tmp_path / "full.trec")
    assert full.exit_code == 0, full.stderr
    m_light = json.loads((tmp_path / "light.trec.manifest.json").read_text())
    m_full = json.loads((tmp_path / "full.trec.manifest.json").read_text())
    assert m_light["settings"]["query_encoder"] == "token-lookup" and m_full["settings"]["query_encoder"] == "full"
    assert (tmp_path / "light.trec").read_text() != (tmp_path / "full.trec").read_text()

    # the table ships with the export (one length cap for both sides: a stock sentence-transformers dir has one)
    r = runner("export", model, "--format", "st", "--query-max-len", 24, "-o", tmp_path / "dist")
    assert r.exit_code == 0, r.stderr
    assert np.array_equal(lookup.TokenLookupEncoder.load(tmp_path / "dist").encode(["a protein"]),
                          lookup.TokenLookupEncoder.load(model).encode(["a protein"]))


def test_token_lookup_search_without_a_table_exits_2(runner, tiny_bert, corpus_file, queries_file, tmp_path):
    assert runner("index", corpus_file, "--model", tiny_bert, "-o", tmp_path / "idx").exit_code == 0
    r = runner("search", tmp_path / "idx", queries_file, "--query-encoder", "token-lookup")
    assert r.exit_code == 2 and "no token-lookup table" in r.stderr, r.stderr
    r = runner("train", "-", "--model", tiny_bert, "-o", tmp_path / "m", "--query-encoder", "lookup")
    assert r.exit_code == 2 and "--query-encoder" in r.stderr


@pytest.mark.parametrize("extra", [["--grad-cache", "on", "--chunk-size", "2"], ["--lora-r", "4"]])
def test_joint_training_under_grad_cache_and_lora(runner, tiny_llama, tmp_path, extra):
    """GradCache caches the [full | lookup] query vectors like one vector: the same step-1 loss as plain steps."""
    groups = write_jsonl(tmp_path / "g.jsonl", _groups(4, negatives=2))
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    fast = [f"--{k.replace('_', '-')}={v}" for k, v in FAST.items() if k != "train_group_size"]
    losses_at_1 = []
    for name, more in (("plain", ["--grad-cache", "off"]), ("other", extra)):
        out = tmp_path / name
        r = runner("train", groups, "--corpus", corpus, "--model", tiny_llama, "-o", out, "--max-steps", 2,
                   "--train-group-size", 2, "--query-encoder", "token-lookup", "--pooling", "last", *fast, *more)
        assert r.exit_code == 0, r.stderr[-2000:]
        assert lookup.has_table(out)
        losses_at_1.append(json.loads((out / "metrics.jsonl").read_text().splitlines()[0]))
    for key in ("loss", "ce", "ce_lookup", "kl_lookup"):
        assert losses_at_1[0][key] == pytest.approx(losses_at_1[1][key], abs=1e-5)


@pytest.mark.real
def test_minilm_table_with_a_prompt_serves_the_masked_forward(tmp_path):
    """The shipped all-MiniLM-L6-v2 with a query prompt: table → served vector == the masked forward (1e-5), and
    each untrained token-lookup vector is nearer its own query's full vector than the other query's."""
    enc = Encoder.load("minilm", device="cpu", query_prompt="query: ")
    enc.eval()
    enc.save(tmp_path / "m")
    lookup.save_table(enc, tmp_path / "m")
    texts = ["0-dimensional biomaterials lack inductive properties.", "What causes cancer cells to spread?"]
    with torch.inference_mode():
        want = enc.head.finish(lookup.lookup_forward(enc, enc.tokenize(texts, "query"))).numpy()
    got = lookup.TokenLookupEncoder.load(tmp_path / "m").encode(texts)
    assert np.abs(got - want).max() < 1e-5
    sims = got @ enc.encode(texts, "query").T
    assert sims[0, 0] > sims[0, 1] and sims[1, 1] > sims[1, 0]


def test_token_lookup_training_refuses_queries_with_no_prefix(tiny_llama):
    """SmolLM2's tokenizer adds no BOS: with no prompt each query token is encoded alone (position 0), which a
    decoder makes nearly the same vector for every token; training refuses instead of learning a useless table."""
    enc = Encoder.load(tiny_llama, device="cpu")
    lookup.check_prefix(enc)  # [CLS] as BOS: a prefix

    class NoSpecials:  # the tokenizer as SmolLM2's behaves: no special tokens around a text
        def __init__(self, tok):
            self.tok = tok

        def __call__(self, texts, **kw):
            return self.tok(texts, add_special_tokens=False, **kw)

        def __getattr__(self, name):
            return getattr(self.tok, name)

    enc._tok.tokenizer = NoSpecials(enc._tok.tokenizer)
    with pytest.raises(ValueError, match="no prefix"):
        lookup.check_prefix(enc)
    enc.config.query_prompt = "Find documents for: "
    lookup.check_prefix(enc)
