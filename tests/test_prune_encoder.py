"""prune for BERT-family encoders: Block Influence by hand, the ranking, whole layers removed, the stock
sentence-transformers output (loads and encodes as the pruned model did), its size, refusals, and
prune → index → search on the CLI. A tiny random 4-layer BERT (hidden 32) with the MiniLM tokenizer."""

import json

import numpy as np
import pytest
import torch
from conftest import DOCS, GAP_ABS, _minilm_dir, with_large_gaps

from retrctl.prune import anatomy, importance, surgery
from stages.prune import prune

TEXTS = [d["title"] + " " + d["text"] for d in DOCS]


@pytest.fixture(scope="module")
def bert4(tmp_path_factory):
    """A 4-layer, hidden-32 BERT with mean pooling saved as a sentence-transformers dir by retrctl."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from retrctl.models import Encoder

    torch.manual_seed(0)
    raw = tmp_path_factory.mktemp("bert4_raw")
    tok = AutoTokenizer.from_pretrained(str(_minilm_dir()))
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    BertModel(cfg).save_pretrained(raw)
    tok.save_pretrained(raw)
    out = tmp_path_factory.mktemp("bert4")
    Encoder.load(raw, device="cpu", pooling="mean", normalize=True).save(out)
    return out


def _base(path):
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(path)).eval()


def _gap(a, b):
    return (1 - torch.nn.functional.cosine_similarity(a, b, dim=-1)).mean().item()


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- importance and the plan


def test_encoder_layers_are_found_and_block_influence_is_computed_by_hand(bert4):
    from transformers import AutoTokenizer

    model, tok = with_large_gaps(_base(bert4)), AutoTokenizer.from_pretrained(str(bert4))
    found = anatomy.stack(model)
    assert found.kind == anatomy.ENCODER and found.layers is model.encoder.layer
    text = "cats purr when they are content"
    got = importance.importance(model, tok, [text])
    batch = tok([text], return_tensors="pt")
    with torch.no_grad():  # the layer written out: x -> h = LN_a(x + Attn(x)) -> y = LN_m(h + MLP(h)); no padding
        states = model(**batch, output_hidden_states=True).hidden_states
        for i, layer in enumerate(model.encoder.layer):
            x, y = states[i], states[i + 1]
            h = layer.attention(x)[0]
            assert torch.allclose(layer.output(layer.intermediate(h), h), y, atol=1e-5)
            assert got["attention"][i] == pytest.approx(_gap(x, h), rel=1e-5, abs=GAP_ABS)
            assert got["mlp"][i] == pytest.approx(_gap(h, y), rel=1e-5, abs=GAP_ABS)
            assert got["block"][i] == pytest.approx(_gap(x, y), rel=1e-5, abs=GAP_ABS)
    assert got["tokens"] == batch["input_ids"].shape[1] and len(got["block"]) == 4


def test_encoder_importance_masks_padding(bert4):
    """A padded batch gives the token-weighted mean of the texts scored one by one."""
    from transformers import AutoTokenizer

    model, tok = with_large_gaps(_base(bert4)), AutoTokenizer.from_pretrained(str(bert4))
    texts = ["a short one", "a much longer text that forces the first one to be padded on the right side"]
    both = importance.importance(model, tok, texts, batch_size=2)
    alone = [importance.importance(model, tok, [t]) for t in texts]
    for kind in importance.KINDS:
        for i in range(4):
            want = sum(a[kind][i] * a["tokens"] for a in alone) / sum(a["tokens"] for a in alone)
            assert both[kind][i] == pytest.approx(want, rel=1e-4, abs=GAP_ABS)
    # the texts score apart, so a mean weighted otherwise (or one that counted padding) fails the check above
    assert max(abs(alone[0][k][i] - alone[1][k][i]) for k in importance.KINDS for i in range(4)) > 1e-2


def test_calibration_texts_are_cut_at_the_position_table(bert4, tmp_path):
    """A calibration text longer than the model's 128 positions is cut there (--max-length 256 would crash)."""
    calib = tmp_path / "long.jsonl"
    calib.write_text(json.dumps({"docid": "d", "text": "word " * 400}) + "\n")
    out = prune(str(bert4), output=tmp_path / "small", calibration=str(calib), drop_layers=1)
    assert json.loads((out / "prune.json").read_text())["calibration"]["tokens"] == 128


def test_dropping_encoder_layers_equals_running_the_kept_layers(bert4):
    """Whole layers out: the pruned model is the source with those layers skipped, config and layer_idx renumbered."""
    from transformers import AutoTokenizer

    model = _base(bert4)
    kept = surgery.drop_blocks(model, [0, 2])
    assert kept == [1, 3] and model.config.num_hidden_layers == 2 and len(model.encoder.layer) == 2
    assert [layer.attention.self.layer_idx for layer in model.encoder.layer] == [0, 1]
    source = _base(bert4)  # the source with layers 0 and 2 made the identity: their output is their input
    for i in (0, 2):
        source.encoder.layer[i].register_forward_hook(lambda m, args, kwargs, out: args[0] if args else kwargs["hidden_states"],
                                                      with_kwargs=True)
    batch = AutoTokenizer.from_pretrained(str(bert4))(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        got, want = model(**batch).last_hidden_state, source(**batch).last_hidden_state
    m = batch["attention_mask"].bool()
    assert torch.allclose(got[m], want[m], atol=1e-5)


def test_encoder_plans_whole_layers_only():
    scores = {"attention": [0.5, 0.1, 0.3, 0.4], "mlp": [0.2, 0.05, 0.01, 0.3], "block": [0.6, 0.12, 0.31, 0.5]}
    sizes = {"attention": [10] * 4, "mlp": [30] * 4, "block": [41] * 4, "total": 165}
    p = surgery.plan(scores, sizes, target_params=0.55, max_mlp_share=0.0)  # <= 90.75: blocks 1, 2 (least influence)
    assert p.blocks == [1, 2] and p.mlp == [] and p.attention == []


# ---------------------------------------------------------------- the saved output


def test_pruned_encoder_is_a_stock_sentence_transformers_dir_encoding_as_the_pruned_model(bert4, corpus_file, tmp_path):
    from safetensors import safe_open
    from sentence_transformers import SentenceTransformer

    from retrctl.models import Encoder

    out = prune(str(bert4), output=tmp_path / "small", calibration=corpus_file, drop_layers=2)
    report = json.loads((out / "prune.json").read_text())
    scores = report["scores"]
    least = sorted(sorted(range(4), key=lambda i: (scores["block"][i], i))[:2])
    assert report["removed"] == {"blocks": least, "mlp": [], "attention": []}  # the two of least Block Influence
    assert report["architecture"] == "encoder" and "Block Influence" in report["method"]
    assert report["masks"]["block"] == [int(i not in least) for i in range(4)]
    assert report["calibration"]["texts"] == len(DOCS)

    source = _base(bert4)
    block = _params(source.encoder.layer[0])
    stock = _base(out)
    assert stock.config.num_hidden_layers == 2 and len(stock.encoder.layer) == 2
    assert _params(stock) == _params(source) - 2 * block  # exactly two layers smaller
    assert report["params"]["before"] - report["params"]["after"] == 2 * block
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        layers = {k.split(".")[2] for k in f.keys() if k.startswith("encoder.layer.")}
    assert layers == {"0", "1"}
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2

    want = Encoder.load(bert4, device="cpu")  # the same removal in memory, on the source
    surgery.apply(want.model, surgery.Plan(blocks=least))
    expected = want.encode(TEXTS)
    st = SentenceTransformer(str(out), device="cpu")
    assert np.abs(st.encode(TEXTS) - expected).max() < 1e-5
    assert np.abs(Encoder.load(out, device="cpu").encode(TEXTS) - expected).max() < 1e-5
    assert np.abs(expected - Encoder.load(bert4, device="cpu").encode(TEXTS)).max() > 1e-3  # pruning did change it
    assert [type(m).__name__ for m in st] == ["Transformer", "Pooling", "Normalize"]
    card = (out / "README.md").read_text()
    assert "Block Influence" in card and (out / "importance.png").read_bytes()[:4] == b"\x89PNG"


def test_target_params_on_an_encoder_removes_whole_layers(bert4, corpus_file, tmp_path):
    out = prune(str(bert4), output=tmp_path / "small", calibration=corpus_file, target_params=0.6)
    report = json.loads((out / "prune.json").read_text())
    assert report["removed"]["mlp"] == [] and report["removed"]["attention"] == []
    assert len(report["removed"]["blocks"]) == 2 and report["params"]["after"] <= 0.6 * report["params"]["before"]
    assert "retrctl_pruned" not in json.loads((out / "config.json").read_text())


def test_encoder_scores_are_reused(bert4, corpus_file, tmp_path):
    a = prune(str(bert4), output=tmp_path / "a", calibration=corpus_file, drop_layers=1)
    b = prune(str(bert4), output=tmp_path / "b", scores=a / "prune.json", drop_layers=3)
    ra, rb = (json.loads((d / "prune.json").read_text()) for d in (a, b))
    assert rb["scores"] == ra["scores"] and len(rb["removed"]["blocks"]) == 3
    assert set(ra["removed"]["blocks"]) <= set(rb["removed"]["blocks"])


# ---------------------------------------------------------------- CLI


def _refused(r, out):
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 or "Error:" in r.stderr
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()


def test_encoder_refusals_exit_2_and_leave_nothing(runner, bert4, corpus_file, tmp_path):
    out = tmp_path / "small"
    r = runner("prune", bert4, "-o", out, "--calibration", corpus_file, "--drop-layers", 4)
    _refused(r, out)
    assert "--drop-layers 4" in r.stderr and "4 blocks" in r.stderr
    for named, flags in (("--drop-mlp", ["--drop-mlp", 1]), ("--drop-attn", ["--drop-attn", 1]),
                         ("--drop-mlp", ["--drop-layers", 1, "--drop-mlp", 1]),
                         ("--slim-mlp", ["--slim-mlp", 0.5, "--groups", corpus_file]),
                         ("--target-shape", ["--target-shape", "layers=2"])):
        r = runner("prune", bert4, "-o", out, "--calibration", corpus_file, *flags)
        _refused(r, out)
        assert "encoder-only" in r.stderr and named in r.stderr, (flags, r.stderr)


def test_cli_prune_an_encoder_then_index_and_search(runner, bert4, corpus_file, queries_file, tmp_path):
    small = tmp_path / "small"
    r = runner("prune", bert4, "-o", small, "--calibration", corpus_file, "--drop-layers", 1)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == ""
    r = runner("index", corpus_file, "--model", small, "-o", tmp_path / "idx")
    assert r.exit_code == 0, r.stderr
    r = runner("search", tmp_path / "idx", queries_file, "--hits", 2)
    assert r.exit_code == 0, r.stderr
    assert len([line for line in r.stdout.splitlines() if line.strip()]) == 6
