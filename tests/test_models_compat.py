"""Models saved by the retrctl whose models.py was one module load and encode as they did: the fixtures
under tests/fixtures/compat were written by ``Encoder.save`` at commit f32c50e, with their embeddings
(tests/fixtures/compat/make.py); models with sparse and colbert heads and a token-lookup table, written by
``Encoder.save`` at 3eaacfc (make_heads.py), load and encode as they did too. Also: the package's interfaces (heads,
sides, one forward pass)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from retrctl.models import DenseHead, Encoder, EncoderConfig

COMPAT = Path(__file__).parent / "fixtures" / "compat"
EXPECTED = json.loads((COMPAT / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED["models"]))
def test_a_model_saved_by_the_previous_layout_loads_and_encodes_identically(name):
    want = EXPECTED["models"][name]
    enc = Encoder.load(COMPAT / name, device="cpu")
    assert EncoderConfig(**want["config"]) == enc.config
    for kind in ("query", "passage"):
        got = enc.encode(EXPECTED["texts"], kind=kind)
        assert np.allclose(got, np.array(want[kind], dtype=np.float32), atol=1e-6, rtol=0), (name, kind)


@pytest.mark.parametrize("name", sorted(EXPECTED["models"]))
def test_saving_again_writes_the_same_files(name, tmp_path):
    """The layout is unchanged: every settings file a re-save writes is byte-identical to the old one."""
    Encoder.load(COMPAT / name, device="cpu").save(tmp_path / "m")
    old = sorted(str(p.relative_to(COMPAT / name)) for p in (COMPAT / name).rglob("*"))
    new = sorted(str(p.relative_to(tmp_path / "m")) for p in (tmp_path / "m").rglob("*"))
    # git keeps no empty folder: the fixture lost its (empty) 2_Normalize, which stock loaders do not need
    assert [p for p in new if p != "2_Normalize"] == [p for p in old if p != "2_Normalize"]
    for rel in ("modules.json", "retrctl.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                "1_Pooling/config.json"):
        assert (tmp_path / "m" / rel).read_text() == (COMPAT / name / rel).read_text(), rel


def test_stock_sentence_transformers_reads_the_old_and_new_layout_alike(tmp_path):
    from sentence_transformers import SentenceTransformer

    shutil.copytree(COMPAT / "bert_cls", tmp_path / "old")
    Encoder.load(COMPAT / "bert_cls", device="cpu").save(tmp_path / "new")
    old, new = (SentenceTransformer(str(tmp_path / d), device="cpu") for d in ("old", "new"))
    for prompt in ("query", "document"):
        a, b = (m.encode(EXPECTED["texts"], prompt_name=prompt) for m in (old, new))
        assert a.shape == (5, 8) and np.array_equal(a, b), prompt


def test_forward_raw_is_what_training_takes_and_finish_gives_encode(tiny_bert):
    enc = Encoder.load(tiny_bert, device="cpu", dims=8)
    texts = ["cats purr", "rust is memory safe"]
    tokens = enc.tokenize(texts, "query")
    assert tokens.kind == "query"
    raw = enc(tokens, raw=True)
    assert raw.shape == (2, 32)  # pooled, neither truncated nor normalized
    finished = enc.head.finish(raw)
    assert finished.shape == (2, 8) and torch.allclose(finished.norm(dim=-1), torch.ones(2))
    assert np.allclose(enc.encode(texts, kind="query"), finished.detach().numpy(), atol=1e-6)
    q, p = enc.encode(texts, kind="query"), enc.encode(texts)
    assert np.allclose(enc.similarity(torch.from_numpy(q), torch.from_numpy(p)).numpy(), q @ p.T)


def test_the_sides_share_the_backbone_and_read_their_own_settings(tiny_bert):
    enc = Encoder.load(tiny_bert, device="cpu", query_prompt="q: ", query_max_len=5, passage_max_len=9)
    q, p = enc.sides["query"], enc.sides["passage"]
    assert (q.prompt, q.max_len, p.prompt, p.max_len) == ("q: ", 5, "", 9)
    assert q.head is p.head and isinstance(q.head, DenseHead) and q.head.keys == ("pooling", "normalize", "dims", "mcls")
    enc.config.query_max_len = 7  # a side reads the shared config: a later change applies
    assert q.max_len == 7 and enc.tokenize(["one two three four five six seven eight"], "query")["input_ids"].size(1) == 7


def test_a_side_with_its_own_head_is_used_for_that_side(tiny_bert):
    class First(DenseHead):
        def forward(self, hidden_states, attention_mask, input_ids=None):
            return hidden_states[:, 0].float() * 0 + 1.0

    enc = Encoder.load(tiny_bert, device="cpu", normalize=False)
    enc.sides["query"].head = First(enc.config)
    assert np.allclose(enc.encode(["cats"], kind="query"), 1.0)
    assert not np.allclose(enc.encode(["cats"], kind="passage"), 1.0)


# ---------------------------------------------------------------- settings declared once

OLD_FLAGS = {  # the shared encoder flags as stage.py spelled them out by hand at f32c50e: (declaration, type, help)
    "pooling": ("--pooling", "choice(['mean', 'cls', 'eos', 'last'])", "Pooling (default: the model's own)."),
    "bidirectional": ("--bidirectional", "boolean", "Bidirectional attention for decoders (default: the model's own)."),
    "query_prompt": ("--query-prompt", "text", "Prefix for queries, e.g. 'query: '."),
    "passage_prompt": ("--passage-prompt", "text", "Prefix for passages, e.g. 'passage: '."),
    "query_max_len": ("--query-max-len", "integer range", "Query length cap in tokens (default: the model's own)."),
    "passage_max_len": ("--passage-max-len", "integer range", "Passage length cap in tokens (default: the model's own)."),
    "dtype": ("--dtype", "choice(['fp32', 'bf16', 'fp16'])", "Compute dtype."),
    "device": ("--device", "text", "Device (default: cuda when present, else cpu)."),
}


@pytest.mark.parametrize("name", ["index", "search", "mine", "train"])
def test_the_encoder_flags_derived_from_the_declaration_are_the_old_ones(name):
    import importlib

    command = importlib.import_module(f"stages.{name}").command
    params = {p.name: p for p in command.params}
    for key, (flag, kind, help) in OLD_FLAGS.items():
        p = params[key]
        unset = (None, getattr(__import__("click").core, "UNSET", None))
        assert (p.opts[0], p.type.name, p.help, p.default in unset) == (flag, kind.split("(")[0], help, True), key
        if "(" in kind:
            assert str(list(p.type.choices)) == kind[kind.index("(") + 1 : -1], key
        if kind == "integer range":
            assert (p.type.min, p.type.max) == (1, None), key
    assert params["bidirectional"].secondary_opts == ["--causal"]


def test_train_config_and_the_index_keys_derive_from_the_declaration():
    import dataclasses

    from retrctl.indexes import dense
    from retrctl.models.config import ENCODER_FLAGS
    from retrctl.options import encoder_overrides
    from retrctl.train.config import TrainConfig

    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    assert all(fields[k].default is None for k in ENCODER_FLAGS)
    assert list(fields)[:11] == ["model", "pooling", "query_prompt", "passage_prompt", "query_max_len", "passage_max_len",
                                 "bidirectional", "mcls", "dtype", "device", "batch_size"]
    cfg = TrainConfig(model="m", pooling="cls", query_max_len=9, dtype="bf16")
    assert cfg.encoder_overrides() == {"pooling": "cls", "query_max_len": 9}  # dtype/device say how to run, not what
    opts = {"pooling": "cls", "device": "cpu", "query_prompt": None, "top_k": 3}
    assert encoder_overrides(opts) == {"pooling": "cls", "device": "cpu"} and opts == {"top_k": 3}
    assert dense.ENCODER_KEYS == ("pooling", "normalize", "query_prompt", "passage_prompt", "query_max_len",
                                  "passage_max_len", "bidirectional", "mcls", "dims", "temperature")
    assert dense.PASSAGE_KEYS == ("pooling", "normalize", "passage_prompt", "passage_max_len", "bidirectional", "mcls", "dims")


# ---------------------------------------------------------------- heads beside the dense one

HEADS_EXPECTED = json.loads((COMPAT / "expected_heads.json").read_text())


def _terms(terms, weights) -> dict:
    """A sparse row as {term: weight}, zero weights left out (their order among ties is the kernel's)."""
    return {int(t): float(w) for t, w in zip(terms, weights, strict=True) if w > 0}


@pytest.mark.parametrize("name", sorted(HEADS_EXPECTED["models"]))
def test_a_model_with_heads_saved_before_their_shared_pair_loads_and_encodes_identically(name):
    """tests/fixtures/compat/make_heads.py wrote these at 3eaacfc: a sparse, a colbert head, a token-lookup table."""
    from retrctl.models import lookup

    want, texts = HEADS_EXPECTED["models"][name], HEADS_EXPECTED["texts"]
    enc = Encoder.load(COMPAT / name, device="cpu")
    assert bool(enc.token_lookup) == ("lookup" in want) and (enc.colbert is not None) == ("colbert" in want["query"])
    for kind in ("query", "passage"):
        got = enc.encode_heads(texts, kind)
        assert np.allclose(got["dense"], np.array(want[kind]["dense"], dtype=np.float32), atol=1e-6, rtol=0), kind
        terms, weights = enc.encode_sparse(texts, kind)
        for row in range(len(texts)):
            old = _terms(want[kind]["sparse_terms"][row], want[kind]["sparse_weights"][row])
            assert _terms(terms[row], weights[row]) == pytest.approx(old, abs=1e-6), (kind, row)
        for vecs, old in zip(got.get("colbert", ()), want[kind].get("colbert", ()), strict=True):
            assert np.allclose(vecs, np.array(old, dtype=np.float32).reshape(vecs.shape), atol=1e-6, rtol=0), kind
    if "lookup" in want:
        served = lookup.TokenLookupEncoder.load(COMPAT / name).encode(texts)
        assert np.allclose(served, np.array(want["lookup"], dtype=np.float32), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", sorted(HEADS_EXPECTED["models"]))
def test_saving_a_model_with_heads_again_writes_the_same_head_files(name, tmp_path):
    Encoder.load(COMPAT / name, device="cpu").save(tmp_path / "m")
    old = sorted(str(p.relative_to(COMPAT / name)) for p in (COMPAT / name).rglob("*") if p.is_file())
    new = sorted(str(p.relative_to(tmp_path / "m")) for p in (tmp_path / "m").rglob("*") if p.is_file())
    assert new == old
    heads = [rel for rel in old if rel.split("/")[0] in ("sparse", "colbert", "token_lookup")]
    for rel in ["modules.json", "retrctl.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                "1_Pooling/config.json", *heads]:
        a, b = (tmp_path / "m" / rel).read_bytes(), (COMPAT / name / rel).read_bytes()
        if rel == "token_lookup/config.json":  # "seconds" says how long the table took
            a, b = ({k: v for k, v in json.loads(x).items() if k != "seconds"} for x in (a, b))
        if rel == "token_lookup/table.npy":  # computed by a forward pass: another CPU's kernels round otherwise
            new_table, old_table = np.load(tmp_path / "m" / rel), np.load(COMPAT / name / rel)
            assert new_table.shape == old_table.shape and new_table.dtype == old_table.dtype == np.float32
            # float32 sums in another order: a few units of 2^-24 per layer, relative to the table's scale
            assert np.allclose(new_table, old_table, rtol=0, atol=1e-5 * np.abs(old_table).max()), rel
            continue
        assert a == b, rel
