"""prune: importance by hand, masked == removed, stock reload, layer_idx and the cache, budgets, refusals, and
prune → index → search → train on the CLI. Tiny random Llama and Qwen2 decoders (4 blocks, hidden 32)."""

import json

import numpy as np
import pytest
import torch
from conftest import DOCS, GAP_ABS, _minilm_dir, with_large_gaps
from trainkit import FAST, write_jsonl
from trainkit import corpus as _corpus
from trainkit import groups as _groups

from retrctl.models.skipping import Skipped
from retrctl.prune import importance, surgery
from stages.prune import prune

TEXTS = [d["title"] + " " + d["text"] for d in DOCS]


def _decoder(family, out, layers=4):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(_minilm_dir()))
    tok.eos_token, tok.padding_side = "[SEP]", "left"
    config, model = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[family]
    cfg = config(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id)
    model(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def decoder(request, tmp_path_factory):
    return _decoder(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def llama4(tmp_path_factory):
    return _decoder("llama", tmp_path_factory.mktemp("llama4"))


def _base(path):
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(path)).eval()


def _hidden(model, path, texts=TEXTS, **kw):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, **kw).last_hidden_state
    return out[batch["attention_mask"].bool()]


# ---------------------------------------------------------------- importance


def test_importance_by_hand_on_two_blocks(tiny_llama):
    from transformers import AutoTokenizer

    model, tok = with_large_gaps(_base(tiny_llama)), AutoTokenizer.from_pretrained(str(tiny_llama))
    text = "cats purr when they are content"
    got = importance.importance(model, tok, [text])
    ids = tok([text], return_tensors="pt")["input_ids"]
    gap = lambda a, b: (1 - torch.nn.functional.cosine_similarity(a, b, dim=-1)).mean().item()  # noqa: E731
    with torch.no_grad():  # the block written out: x -> h = x + attn(norm(x)) -> y = h + mlp(norm(h)); causal, no padding
        x = model.embed_tokens(ids)
        rope = model.rotary_emb(x, torch.arange(ids.shape[1])[None])
        for i, layer in enumerate(model.layers):
            h = x + layer.self_attn(layer.input_layernorm(x), position_embeddings=rope, attention_mask=None)[0]
            y = h + layer.mlp(layer.post_attention_layernorm(h))
            assert got["attention"][i] == pytest.approx(gap(x, h), rel=1e-5, abs=GAP_ABS)
            assert got["mlp"][i] == pytest.approx(gap(h, y), rel=1e-5, abs=GAP_ABS)
            assert got["block"][i] == pytest.approx(gap(x, y), rel=1e-5, abs=GAP_ABS)
            x = y
    assert got["tokens"] == ids.shape[1] and len(got["mlp"]) == 2


def test_importance_masks_padding(tiny_llama):
    """A padded batch gives the token-weighted mean of the texts scored one by one: padding counts for nothing."""
    from transformers import AutoTokenizer

    model, tok = with_large_gaps(_base(tiny_llama)), AutoTokenizer.from_pretrained(str(tiny_llama))
    texts = ["a short one", "a much longer text that forces the first one to be padded on the left side"]
    both = importance.importance(model, tok, texts, batch_size=2)
    alone = [importance.importance(model, tok, [t]) for t in texts]
    for kind in importance.KINDS:
        for i in range(2):
            want = sum(a[kind][i] * a["tokens"] for a in alone) / sum(a["tokens"] for a in alone)
            assert both[kind][i] == pytest.approx(want, rel=1e-4, abs=GAP_ABS)
    # the texts score apart, so a mean weighted otherwise (or one that counted padding) fails the check above
    assert max(abs(alone[0][k][i] - alone[1][k][i]) for k in importance.KINDS for i in range(2)) > 1e-2


# ---------------------------------------------------------------- surgery


def test_zeroed_sublayers_equal_skipped_and_dropped(decoder):
    """The stock form (zeros) and real removal give the same hidden states (1e-5), for sub-layers and blocks."""
    zeroed = _base(decoder)
    surgery.apply(zeroed, surgery.Plan(mlp=[0, 2], attention=[3]))
    skipped = _base(decoder)
    surgery.apply(skipped, surgery.Plan(mlp=[0, 2], attention=[3]))
    surgery.skip_removed(skipped)
    assert isinstance(skipped.layers[2].mlp, Skipped) and isinstance(skipped.layers[3].self_attn, Skipped)
    assert not isinstance(zeroed.layers[2].mlp, Skipped)
    assert torch.allclose(_hidden(zeroed, decoder), _hidden(skipped, decoder), atol=1e-5)
    assert not torch.allclose(_hidden(zeroed, decoder), _hidden(_base(decoder), decoder), atol=1e-3)

    masked = _base(decoder)  # a block masked (both sub-layers zero) == the block taken out
    surgery.apply(masked, surgery.Plan(mlp=[1], attention=[1]))
    dropped = _base(decoder)
    surgery.apply(dropped, surgery.Plan(blocks=[1]))
    assert len(dropped.layers) == 3 and dropped.config.num_hidden_layers == 3
    assert torch.allclose(_hidden(masked, decoder), _hidden(dropped, decoder), atol=1e-5)


def test_layer_idx_contiguous_and_cache_forward_works(decoder):
    model = _base(decoder)
    surgery.apply(model, surgery.Plan(blocks=[0, 2]))
    assert [layer.self_attn.layer_idx for layer in model.layers] == [0, 1]
    if getattr(model.config, "layer_types", None):
        assert len(model.config.layer_types) == 2
    ids = torch.tensor([[101, 2000, 2001, 2002]])
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        assert out.past_key_values.get_seq_length() == 4
        nxt = model(input_ids=torch.tensor([[2003]]), past_key_values=out.past_key_values, use_cache=True)
    assert nxt.last_hidden_state.shape == (1, 1, 32)

    naive = _base(decoder)  # the bug it guards against (transformers#28462): blocks out, layer_idx left as it was
    naive.layers = torch.nn.ModuleList([naive.layers[1], naive.layers[3]])
    naive.config.num_hidden_layers = 2
    with pytest.raises(IndexError), torch.no_grad():
        naive(input_ids=ids, use_cache=True)


def test_zeroed_sublayers_stay_zero_under_training(decoder):
    """All-zero is a fixed point: the gradients of a removed sub-layer are exactly zero, so `train` keeps it removed."""
    model = _base(decoder).train()
    surgery.apply(model, surgery.Plan(mlp=[1], attention=[2]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ids = torch.tensor([[101, 2000, 2001, 2002, 102]])
    for _ in range(2):
        model(input_ids=ids).last_hidden_state.mean(1).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    for p in [*model.layers[1].mlp.parameters(), *model.layers[2].self_attn.parameters()]:
        assert torch.count_nonzero(p) == 0
    assert torch.count_nonzero(model.layers[0].mlp.down_proj.weight) > 0


def test_plan_ranks_groups_apart_and_meets_budgets():
    scores = {"attention": [0.5, 0.1, 0.3, 0.4], "mlp": [0.2, 0.05, 0.01, 0.3], "block": [0.6, 0.12, 0.31, 0.5]}
    sizes = {"attention": [10] * 4, "mlp": [30] * 4, "block": [41] * 4, "total": 165}
    p = surgery.plan(scores, sizes, drop_mlp=2, drop_attn=1)
    assert (p.mlp, p.attention, p.blocks) == ([1, 2], [1], [])
    p = surgery.plan(scores, sizes, drop_layers=1, drop_mlp=1)
    assert (p.blocks, p.mlp) == ([1], [2])  # block 1 (least influence) out; then the least MLP among the rest
    p = surgery.plan(scores, sizes, target_params=0.7)  # 165 -> <= 115.5: two MLPs (60) suffice
    assert (p.mlp, p.blocks) == ([1, 2], [])
    p = surgery.plan(scores, sizes, target_params=0.55)  # <= 90.75: MLPs capped at half (2: 105), then blocks 1, 2 (83)
    assert p.blocks == [1, 2] and p.mlp == [] and p.masks(4)["mlp"] == [1, 0, 0, 1]
    with pytest.raises(surgery.PruneError, match="--drop-layers 4"):
        surgery.plan(scores, sizes, drop_layers=4)
    with pytest.raises(surgery.PruneError, match="--drop-mlp 4"):
        surgery.plan(scores, sizes, drop_layers=1, drop_mlp=4)
    with pytest.raises(surgery.PruneError, match="alone"):
        surgery.plan(scores, sizes, target_params=0.5, drop_mlp=1)
    with pytest.raises(surgery.PruneError, match="already|left"):
        surgery.plan(scores, sizes, drop_mlp=4, already={"mlp": [0]})


# ---------------------------------------------------------------- saved output


def test_prune_saves_what_stock_loaders_reload(decoder, corpus_file, tmp_path):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    out = prune(str(decoder), output=tmp_path / "small", calibration=corpus_file, drop_mlp=2, drop_layers=1)
    report = json.loads((out / "prune.json").read_text())
    assert len(report["scores"]["mlp"]) == 4 and report["calibration"]["texts"] == len(DOCS)
    assert report["params"]["after"] < report["params"]["before"]
    assert sum(report["masks"]["block"]) == 3 and sum(report["masks"]["mlp"]) == 1
    assert (out / "importance.png").read_bytes()[:4] == b"\x89PNG" and "Pruned from" in (out / "README.md").read_text()

    want = _base(decoder)  # the same plan applied in memory to the source
    surgery.apply(want, surgery.Plan(report["removed"]["blocks"], report["removed"]["mlp"], report["removed"]["attention"]))
    stock = AutoModel.from_pretrained(str(out)).eval()
    assert type(stock).__module__.startswith("transformers.models.")  # no remote code without the user's flag
    assert torch.allclose(_hidden(stock, out), _hidden(want, decoder), atol=1e-5)
    assert not list(out.glob("*.py")) and "auto_map" not in json.loads((out / "config.json").read_text())  # no code
    fast = AutoModel.from_pretrained(str(out)).eval()
    surgery.skip_removed(fast)  # the zeroed sub-layers really skipped, in memory
    assert sum(type(layer.mlp).__name__ == "Skipped" for layer in fast.layers) == 2
    assert torch.allclose(_hidden(fast, out), _hidden(stock, out), atol=1e-5)
    assert SentenceTransformer(str(out), device="cpu").encode(["cats"]).shape == (1, 32)
    assert surgery.non_embedding_params(stock) == report["params"]["after"]


def test_resaving_a_pruned_model_keeps_its_removals_and_ships_no_code(llama4, corpus_file, tmp_path):
    from retrctl.models import Encoder

    out = prune(str(llama4), output=tmp_path / "small", calibration=corpus_file, drop_mlp=1)
    Encoder.load(out, device="cpu").save(tmp_path / "again")  # what train writes with
    config = json.loads((tmp_path / "again" / "config.json").read_text())
    assert config["retrctl_pruned"] == json.loads((out / "config.json").read_text())["retrctl_pruned"]
    assert "auto_map" not in config and not list((tmp_path / "again").glob("*.py"))


def test_inference_loads_skip_removed_sublayers_with_the_same_vectors(runner, llama4, corpus_file, tmp_path):
    from retrctl.indexes import open_index
    from retrctl.models import Encoder
    from retrctl.models.runtime import load_encoder

    small = prune(str(llama4), output=tmp_path / "small", calibration=corpus_file, drop_mlp=1, drop_attn=1)
    removed = json.loads((small / "config.json").read_text())["retrctl_pruned"]
    computed = Encoder.load(small, device="cpu")
    skipped = load_encoder(str(small), device="cpu")  # what index and search use
    layers = skipped.model.layers
    assert all(isinstance(layers[i].mlp, Skipped) for i in removed["mlp"])
    assert all(isinstance(layers[i].self_attn, Skipped) for i in removed["attention"])
    assert not any(isinstance(m, Skipped) for m in computed.model.modules())
    texts = [json.loads(line)["text"] for line in corpus_file.read_text().splitlines()]
    assert abs(computed.encode(texts) - skipped.encode(texts)).max() < 1e-5
    with pytest.raises(ValueError, match="inference"):
        skipped.save(tmp_path / "resaved")

    assert runner("index", corpus_file, "--model", small, "-o", tmp_path / "idx").exit_code == 0
    idx = open_index(tmp_path / "idx")
    assert any(isinstance(m, Skipped) for m in idx.encoder.model.modules())


def test_whole_blocks_give_a_plain_stock_model(llama4, corpus_file, tmp_path):
    out = prune(str(llama4), output=tmp_path / "small", calibration=corpus_file, drop_layers=2)
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and "auto_map" not in config and "retrctl_pruned" not in config
    assert not (out / "modeling_pruned.py").exists()


def test_target_params_met_and_scores_reused(llama4, corpus_file, tmp_path):
    a = prune(str(llama4), output=tmp_path / "a", calibration=corpus_file, target_params=0.5)
    ra = json.loads((a / "prune.json").read_text())
    assert ra["params"]["after"] <= 0.5 * ra["params"]["before"] and ra["removed"]["mlp"] + ra["removed"]["blocks"]
    b = prune(str(llama4), output=tmp_path / "b", scores=a / "prune.json", drop_layers=1)  # no calibration pass
    rb = json.loads((b / "prune.json").read_text())
    assert rb["scores"] == ra["scores"] and rb["calibration"] == ra["calibration"]
    assert rb["removed"]["blocks"] == [min(range(4), key=lambda i: ra["scores"]["block"][i])]


# ---------------------------------------------------------------- CLI


def _refused(r, out):
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 or "Error:" in r.stderr
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()


def test_bad_flags_exit_2_and_leave_nothing(runner, tiny_llama, tiny_bert, llama4, corpus_file, tmp_path):
    out = tmp_path / "small"
    r = runner("prune", tiny_llama, "-o", out, "--calibration", corpus_file, "--drop-layers", 5)
    _refused(r, out)
    assert "--drop-layers 5" in r.stderr and "2 blocks" in r.stderr
    r = runner("prune", tiny_bert, "-o", out, "--calibration", corpus_file, "--drop-mlp", 1)
    _refused(r, out)
    assert "encoder-only" in r.stderr
    _refused(r := runner("prune", tiny_llama, "-o", out, "--calibration", corpus_file), out)
    assert "nothing to do" in r.stderr
    _refused(runner("prune", tiny_llama, "-o", out, "--calibration", corpus_file, "--target-params", 0.5, "--drop-mlp", 1), out)
    _refused(runner("prune", tiny_llama, "-o", out, "--calibration", corpus_file, "--target-params", 1.5), out)
    _refused(runner("prune", tiny_llama, "-o", out, "--drop-mlp", 1), out)  # no calibration, no scores
    other = prune(str(llama4), output=tmp_path / "other", calibration=corpus_file, drop_mlp=1)
    r = runner("prune", tiny_llama, "-o", out, "--scores", other / "prune.json", "--drop-mlp", 1)
    _refused(r, out)
    assert "another model" in r.stderr


def test_output_that_is_not_ours_is_refused_and_kept(runner, tiny_llama, corpus_file, tmp_path):
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    r = runner("prune", tiny_llama, "-o", mine, "--calibration", corpus_file, "--drop-mlp", 1)
    assert r.exit_code == 2 and "not a retrctl prune output" in r.stderr
    assert (mine / "notes.txt").read_text() == "keep me"
    out = prune(str(tiny_llama), output=tmp_path / "small", calibration=corpus_file, drop_layers=1)
    assert not (out / "modeling_pruned.py").exists()
    again = prune(str(tiny_llama), output=out, calibration=corpus_file, drop_mlp=1)  # an earlier output is replaced
    assert json.loads((again / "prune.json").read_text())["removed"]["mlp"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".small", "small."))]  # no temp left beside it


def test_cli_prune_then_index_search_and_train(runner, llama4, corpus_file, queries_file, tmp_path):
    small = tmp_path / "small"
    r = runner("prune", llama4, "-o", small, "--calibration", corpus_file, "--drop-mlp", 1, "--drop-layers", 1,
               "--bidirectional", "--pooling", "mean")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "" and json.loads((small / "retrctl.json").read_text())["bidirectional"] is True
    r = runner("index", corpus_file, "--model", small, "-o", tmp_path / "idx")
    assert r.exit_code == 0, r.stderr
    r = runner("search", tmp_path / "idx", queries_file, "--hits", 2)
    assert r.exit_code == 0, r.stderr
    assert len([line for line in r.stdout.splitlines() if line.strip()]) == 6

    groups = write_jsonl(tmp_path / "g.jsonl", _groups(4, negatives=2))
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    fast = [f"--{k.replace('_', '-')}={v}" for k, v in FAST.items() if k != "train_group_size"]
    r = runner("train", groups, "--corpus", corpus, "--model", small, "-o", tmp_path / "healed", "--max-steps", 1,
               "--train-group-size", 2, *fast)
    assert r.exit_code == 0, r.stderr
    from transformers import AutoModel

    healed = AutoModel.from_pretrained(str(tmp_path / "healed"))
    removed = json.loads((small / "config.json").read_text())["retrctl_pruned"]["mlp"]
    assert removed and all(torch.count_nonzero(p) == 0 for i in removed for p in healed.layers[i].mlp.parameters())


# ---------------------------------------------------------------- self-slimming (EffiR's fine step)


def test_gates_at_one_change_nothing_and_fold_into_stock_weights(decoder):
    from retrctl.prune import slimming

    model = _base(decoder)
    want = _hidden(model, decoder)
    slimming.add_gates(model.model if hasattr(model, "model") else model, lr=0.1)
    assert torch.allclose(_hidden(model, decoder), want, atol=1e-6)  # z = 1: the model unchanged
    gates = [m.parametrizations.weight[0].z for m in model.modules() if hasattr(m, "parametrizations")]
    assert gates and all(g.lr == 0.1 for g in gates)
    with torch.no_grad():
        for g in gates:
            g.uniform_(-0.5, 1.5)
    gated = _hidden(model, decoder)
    mlp = model.layers[0].mlp
    x = torch.randn(3, mlp.gate_proj.in_features)
    z = torch.relu(mlp.down_proj.parametrizations.weight[0].z)
    by_hand = (mlp.act_fn(x @ mlp.gate_proj.weight.T) * (x @ mlp.up_proj.weight.T) * z) @ mlp.down_proj.parametrizations.weight.original.T
    assert torch.allclose(mlp(x), by_hand, atol=1e-5)  # MLP(x) = W_down(ReLU(z) ⊙ Act(W_gate x) ⊙ W_up x)
    slimming.fold(model)
    assert not any(hasattr(m, "parametrizations") for m in model.modules())
    assert torch.allclose(_hidden(model, decoder), gated, atol=1e-5)


def test_relaxed_l0_and_the_global_choice():
    from retrctl.prune import slimming

    values = {0: torch.tensor([0.9, 0.1, 0.5, 0.0]), 1: torch.tensor([0.8, 0.7, 0.2, 0.3]), 2: torch.tensor([0.0, 0.0, 0.05, 0.01])}
    masks = slimming.choose(values, 0.5)  # 6 of 12 kept, ranked across blocks: 0.9 0.8 0.7 0.5 0.3 0.2
    assert masks[0].tolist() == [True, False, True, False] and masks[1].tolist() == [True, True, True, True]
    assert masks[2].tolist() == [False, False, True, False]  # a block whose gates all lost keeps its best neuron
    with pytest.raises(surgery.PruneError, match="--slim-mlp"):
        slimming.choose(values, 1.0)
    model = _base_llama_with_gates()
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "parametrizations"):
                m.parametrizations.weight[0].z.copy_(torch.linspace(-1, 2, m.in_features))
    zs = torch.cat([m.parametrizations.weight[0].z for m in model.modules() if hasattr(m, "parametrizations")])
    want = (2 * torch.sigmoid(torch.relu(zs) / slimming.RELAX) - 1).mean()
    assert torch.allclose(slimming.l0(model), want) and float(slimming.l0(model).detach()) > 0


def _base_llama_with_gates():
    from transformers import LlamaConfig, LlamaModel

    from retrctl.prune import slimming

    torch.manual_seed(0)
    model = LlamaModel(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=8, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1))
    slimming.add_gates(model)
    return model


def test_zeroed_neurons_are_sliced_exactly_and_stay_zero_under_training(decoder):
    from retrctl.models import skipping
    from retrctl.prune import slimming

    model = _base(decoder)
    masks = {i: torch.rand(layer.mlp.down_proj.in_features) < 0.5 for i, layer in enumerate(model.layers)}
    slimming.zero_neurons(model, masks)
    want = _hidden(model, decoder)
    model.config.retrctl_pruned = {"mlp_width": slimming.widths(model, masks)}
    before = surgery.non_embedding_params(model)
    full = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)
    hidden = model.config.hidden_size
    assert before == full - sum(int((~m).sum()) * 3 * hidden for m in masks.values())
    skipping.skip_removed(model)
    assert [layer.mlp.down_proj.in_features for layer in model.layers] == [int(m.sum()) for m in masks.values()]
    assert skipping.has_skipped(model)  # an inference-only form: Encoder.save refuses it
    assert torch.allclose(_hidden(model, decoder), want, atol=1e-5)

    trained = _base(decoder).train()
    slimming.zero_neurons(trained, masks)
    opt = torch.optim.AdamW(trained.parameters(), lr=1e-2, weight_decay=0.1)
    from transformers import AutoTokenizer

    batch = AutoTokenizer.from_pretrained(str(decoder))(TEXTS, padding=True, return_tensors="pt")
    for _ in range(2):
        trained(**batch).last_hidden_state.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    for i, m in masks.items():
        mlp = trained.layers[i].mlp
        assert torch.count_nonzero(mlp.gate_proj.weight[~m]) == 0 and torch.count_nonzero(mlp.down_proj.weight[:, ~m]) == 0


def test_self_slimming_trains_gates_keeps_the_fraction_heals_and_saves_a_stock_model(runner, llama4, tmp_path):
    from transformers import AutoModel

    from retrctl.models import Encoder

    groups = write_jsonl(tmp_path / "g.jsonl", _groups(8, negatives=2))
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    small = tmp_path / "small"
    r = runner("prune", llama4, "-o", small, "--slim-mlp", 0.5, "--groups", groups, "--corpus", corpus,
               "--slim-steps", 2, "--heal-steps", 1, "--train-batch-size", 4, "--lr", 1e-3, "--gate-lr", 0.5,
               "--bidirectional", "--pooling", "mean", "--passage-max-len", 24, "--query-max-len", 16)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == ""
    report = json.loads((small / "prune.json").read_text())
    slim = report["slimming"]
    assert sum(slim["widths"]) == round(0.5 * 4 * 64) and slim["full_width"] == 64
    assert slim["metrics"]["slim"]["penalty"] > 0 and slim["metrics"]["heal"]["step"] == 1
    assert report["params"]["after"] < report["params"]["before"]
    config = json.loads((small / "config.json").read_text())
    assert config["retrctl_pruned"]["mlp_width"] == slim["widths"] and config["intermediate_size"] == 64
    gates = np.load(small / "slim_gates.npz")
    assert sorted(gates.files) == [f"block_{i}" for i in range(4)]
    stock = AutoModel.from_pretrained(str(small))  # no retrctl code, no trust_remote_code
    for i, w in enumerate(slim["widths"]):
        mlp = stock.layers[i].mlp
        assert int(mlp.down_proj.weight.ne(0).any(0).sum()) == w
    full = Encoder.load(small, device="cpu")
    sliced = Encoder.load(small, device="cpu", inference=True)
    assert [layer.mlp.down_proj.in_features for layer in sliced.model.layers] == slim["widths"]
    assert np.allclose(full.encode(TEXTS), sliced.encode(TEXTS), atol=1e-5)
    assert "Self-slimmed" in (small / "README.md").read_text()
    assert not (tmp_path / "small.partial").exists()  # the phases' work is removed with the .partial


def test_slimming_refusals_exit_2_and_leave_nothing(runner, llama4, tiny_bert, corpus_file, tmp_path):
    out = tmp_path / "small"
    r = runner("prune", llama4, "-o", out, "--slim-mlp", 0.5)
    _refused(r, out)
    assert "--groups" in r.stderr
    groups = write_jsonl(tmp_path / "g.jsonl", _groups(4, negatives=2))
    r = runner("prune", llama4, "-o", out, "--slim-mlp", 1.5, "--groups", groups)
    _refused(r, out)
    assert "(0, 1)" in r.stderr


def test_self_slimming_resumes_without_training_a_finished_phase_again(runner, monkeypatch, llama4, tmp_path):
    from safetensors.torch import load_file

    from retrctl.prune import slimming
    from retrctl.train import loop

    groups = write_jsonl(tmp_path / "g.jsonl", _groups(8, negatives=2))
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    flags = ["--slim-mlp", 0.5, "--groups", groups, "--corpus", corpus, "--slim-steps", 2, "--heal-steps", 1,
             "--train-batch-size", 4, "--lr", 1e-3, "--gate-lr", 0.5, "--bidirectional", "--pooling", "mean"]
    whole = tmp_path / "whole"
    assert runner("prune", llama4, "-o", whole, *flags).exit_code == 0
    real_choose, real_fit, fits = slimming.choose, loop.Trainer.fit, []

    def dies(*a, **kw):  # after the gates were trained and saved: a kill between the two phases
        raise KeyboardInterrupt

    monkeypatch.setattr(slimming, "choose", dies)
    out = tmp_path / "small"
    assert runner("prune", llama4, "-o", out, *flags).exit_code != 0 and not out.exists()
    monkeypatch.setattr(slimming, "choose", real_choose)
    monkeypatch.setattr(loop.Trainer, "fit", lambda self: fits.append(self.output.name) or real_fit(self))
    r = runner("prune", llama4, "-o", out, *flags, "--resume")
    assert r.exit_code == 0, r.stderr
    assert fits == ["healed"]  # the finished gates phase was not trained again
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
