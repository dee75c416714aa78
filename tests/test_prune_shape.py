"""prune --target-shape (Sheared-LLaMA): hard-concrete masks, the Lagrangian, masked == removed, the exact target
shape, stock reload, both objectives on the CLI, prune → train → index → search, refusals. Tiny random Llama and
Qwen2 decoders with grouped-query attention (4 blocks, hidden 32, 4 query heads sharing 2 KV heads)."""

import json

import numpy as np
import pytest
import torch
from conftest import DOCS, _minilm_dir
from trainkit import corpus as _corpus
from trainkit import groups as _groups
from trainkit import write_jsonl

from retrctl.prune import shaping
from retrctl.prune.surgery import PruneError

TEXTS = [d["title"] + " " + d["text"] for d in DOCS]
TARGET = {"layers": 3, "hidden": 24, "heads": 2, "intermediate": 32}
TARGET_FLAG = "layers=3,hidden=24,heads=2,intermediate=32"


def _config(family, **kw):
    from transformers import LlamaConfig, Qwen2Config

    config = {"llama": LlamaConfig, "qwen2": Qwen2Config}[family]
    return config(vocab_size=120, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=128, **kw)


def _decoder_dir(family, out, tied):
    from transformers import AutoTokenizer, LlamaForCausalLM, Qwen2ForCausalLM

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(_minilm_dir()))
    tok.eos_token, tok.padding_side = "[SEP]", "left"
    cfg = _config(family, tie_word_embeddings=tied, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                  bos_token_id=tok.cls_token_id)
    cfg.vocab_size = tok.vocab_size
    {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM}[family](cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module", params=[("llama", True), ("qwen2", False)], ids=["llama-tied", "qwen2-untied"])
def gqa_decoder(request, tmp_path_factory):
    family, tied = request.param
    return _decoder_dir(family, tmp_path_factory.mktemp(family), tied)


def _masked_model(family, seed=0, **kw):
    from transformers import LlamaModel, Qwen2Model

    torch.manual_seed(seed)
    model = {"llama": LlamaModel, "qwen2": Qwen2Model}[family](_config(family, **kw)).eval()
    masks = shaping.ShapeMasks(model.config, shaping.check_target(model, TARGET), lr=0.1)
    with torch.no_grad():  # masks as training might leave them: every unit's log α different
        for m in masks.masks.values():
            m.log_alpha.normal_(0, 2)
    shaping.attach(model, masks)
    return model, masks


def _ids():
    torch.manual_seed(1)
    ids = torch.randint(0, 120, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a padded row
    return ids, mask


@pytest.mark.parametrize("family,kw", [("llama", {}), ("qwen2", {}), ("llama", {"attention_bias": True, "mlp_bias": True})],
                         ids=["llama", "qwen2", "llama-biases"])
def test_masked_model_equals_the_removed_model_of_exactly_the_target_shape(family, kw):
    model, masks = _masked_model(family, **kw)
    ids, mask = _ids()
    masks.eval()
    with torch.no_grad():
        masked = model(input_ids=ids, attention_mask=mask).last_hidden_state
    kept = masks.kept(model.config)
    assert [int(kept["heads"][i].sum()) for i in range(4)] == [1] * 4  # the same top-k in every block: uniform
    assert [int(kept["intermediate"][i].sum()) for i in range(4)] == [32] * 4
    shaping.fold(model)
    with torch.no_grad():
        folded = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.equal(folded, masked)  # folding the binary masks in changes nothing
    assert masked[..., ~kept["hidden"]].abs().max() == 0  # a pruned hidden dim is 0 in the whole stream
    assert shaping.reshape(model, kept) == TARGET
    with torch.no_grad():
        small = model(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.bool()
    assert torch.allclose(masked[..., kept["hidden"]][m], small[m], atol=1e-5)
    assert [layer.self_attn.layer_idx for layer in model.layers] == [0, 1, 2]
    with torch.no_grad():  # the cache is indexed by layer_idx: a cached forward runs
        model(input_ids=ids[:, :4], use_cache=True)


def test_stock_reload_of_the_removed_model(tmp_path):
    from transformers import AutoModel

    model, masks = _masked_model("qwen2")
    kept = masks.kept(model.config)
    shaping.fold(model)
    shaping.reshape(model, kept)
    model.save_pretrained(tmp_path)
    stock = AutoModel.from_pretrained(str(tmp_path)).eval()
    cfg = stock.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size,
            cfg.head_dim) == (3, 24, 2, 1, 32, 8)
    ids, mask = _ids()
    with torch.no_grad():
        a = model(input_ids=ids, attention_mask=mask).last_hidden_state
        b = stock(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(a[mask.bool()], b[mask.bool()], atol=1e-6)


def test_hard_concrete_sample_noise_and_expected_sparsity():
    hc = shaping.HardConcrete([2, 50], keep=10)
    assert float(hc.expected_sparsity().detach().max()) < 0.01  # log α starts at 5: almost surely kept
    hc.train()
    hc.resample()
    a, b = hc(), hc()
    assert torch.equal(a, b)  # one noise per step: every use of the mask in a step agrees
    assert a.min() >= 0 and a.max() <= 1
    with torch.no_grad():
        hc.log_alpha.fill_(-5)
    hc.resample()
    z = hc().detach()
    assert int((z == 0).sum()) >= 90  # hard zeros, not just small values
    assert float(hc.expected_sparsity().detach().min()) > 0.95
    hc.eval()
    assert hc().sum(-1).tolist() == [10, 10]  # eval: binary, the target count per row
    with torch.no_grad():
        hc.log_alpha.fill_(1.0)
        hc.log_alpha[1, 40] = 2.0
    assert hc.binary()[0].nonzero().flatten().tolist() == list(range(10))  # ties: the lower index
    assert hc.binary()[1].nonzero().flatten().tolist() == [*range(9), 40]


def test_lagrangian_pulls_the_expected_sparsity_to_the_target():
    from transformers import LlamaModel

    model = LlamaModel(_config("llama"))
    masks = shaping.ShapeMasks(model.config, shaping.check_target(model, TARGET), lr=0.1)
    params = [{"params": [m.log_alpha for m in masks.masks.values()]}, {"params": list(masks.lambdas.values())}]
    opt = torch.optim.AdamW(params, lr=0.1, weight_decay=0.0)
    for _ in range(200):
        masks.step_penalty().backward()
        opt.step()
        opt.zero_grad()
    report = masks.report()
    for k, r in report.items():
        assert r["expected_sparsity"] == pytest.approx(r["target_sparsity"], abs=0.08), (k, r)
        assert r["lambda_1"] != 0  # the multipliers moved (ascent)


def test_target_shape_parsing_and_checks():
    from transformers import LlamaModel

    assert shaping.parse_target_shape("layers=3, hidden=24") == {"layers": 3, "hidden": 24}
    for bad, says in (("layers=3,depth=2", "KEY=N"), ("layers=x", "KEY=N"), ("", "at least one"), ("layers=2,layers=3", "twice")):
        with pytest.raises(PruneError, match=says):
            shaping.parse_target_shape(bad)
    model = LlamaModel(_config("llama"))
    for bad, says in (({"layers": 5}, "the model has layers=4"), ({"hidden": 0}, "give 1..32"),
                      ({"heads": 3}, "multiple of 2"), ({"layers": 4}, "nothing to prune"),
                      ({"hidden": 30}, "LlamaConfig refuses that shape")):  # LlamaConfig: hidden % heads == 0
        with pytest.raises(PruneError, match=says):
            shaping.check_target(model, bad)
    assert shaping.check_target(model, {"heads": 2}) == {"layers": 4, "hidden": 32, "heads": 2, "intermediate": 64}


def _check_output(out, family_dir):
    from transformers import AutoModel

    report = json.loads((out / "prune.json").read_text())
    shape = report["shape"]
    assert shape["target"] == TARGET and shape["source"] == {"layers": 4, "hidden": 32, "heads": 4, "intermediate": 64}
    assert len(report["removed"]["blocks"]) == 1 and shape["masked_vs_removed"] <= 1e-5
    assert report["params"]["after"] < report["params"]["before"] / 2
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"], config["intermediate_size"]) == (3, 24, 2, 32)
    assert "retrctl_pruned" not in config and "auto_map" not in config and not list(out.glob("*.py"))
    AutoModel.from_pretrained(str(out))  # stock, no remote code
    saved = np.load(out / "shape_masks.npz")
    assert {"kept_layers", "log_alpha_layers", "kept_hidden", "kept_heads", "kept_intermediate"} <= set(saved.files)
    assert int(saved["kept_hidden"].sum()) == 24
    assert (out / "importance.png").stat().st_size > 0
    assert "Sheared-LLaMA" in (out / "README.md").read_text()
    assert not out.with_name(out.name + ".partial").exists()
    return report


def test_cli_lm_objective_reaches_the_target_shape(runner, gqa_decoder, corpus_file, tmp_path):
    out = tmp_path / "small"
    r = runner("prune", gqa_decoder, "-o", out, "--target-shape", TARGET_FLAG, "--objective", "lm", "--calibration", corpus_file,
               "--shape-steps", 3, "--train-batch-size", 4, "--max-length", 32, "--lr", 1e-3)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == ""
    report = _check_output(out, gqa_decoder)
    metrics = report["shape"]["metrics"]
    assert metrics["step"] == 3 and len(metrics["lm_loss"]) == 3
    assert metrics["lm_loss_unpruned"] > 0 and metrics["lm_loss_pruned"] > 0


def test_cli_contrastive_objective_then_train_index_search(runner, gqa_decoder, queries_file, tmp_path):
    groups = write_jsonl(tmp_path / "g.jsonl", _groups(8, negatives=2))
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    out = tmp_path / "small"
    common = ("--bidirectional", "--pooling", "mean", "--passage-max-len", 24, "--query-max-len", 16)
    r = runner("prune", gqa_decoder, "-o", out, "--target-shape", TARGET_FLAG, "--objective", "contrastive", "--groups", groups,
               "--corpus", corpus, "--shape-steps", 2, "--train-batch-size", 4, "--lr", 1e-3, *common)
    assert r.exit_code == 0, r.stderr
    report = _check_output(out, gqa_decoder)
    assert report["shape"]["metrics"]["step"] == 2 and "penalty" in report["shape"]["metrics"]
    trained = tmp_path / "trained"
    r = runner("train", groups, "--corpus", corpus, "--model", out, "-o", trained, "--max-steps", 2, "--train-batch-size", 4, "--lr", 1e-3)
    assert r.exit_code == 0, r.stderr
    assert json.loads((trained / "config.json").read_text())["hidden_size"] == 24
    r = runner("index", corpus, "-o", tmp_path / "idx", "--method", "dense", "--model", trained)
    assert r.exit_code == 0, r.stderr
    r = runner("search", tmp_path / "idx", queries_file, "--hits", 3)
    assert r.exit_code == 0, r.stderr
    assert len([line for line in r.stdout.splitlines() if line.strip()]) == 3 * len(queries_file.read_text().splitlines())


def test_shape_refusals_exit_2_and_leave_nothing(runner, gqa_decoder, tiny_bert, corpus_file, tmp_path):
    out = tmp_path / "small"
    cases = [
        (gqa_decoder, ["--target-shape", "layers=9", "--calibration", corpus_file], "layers=4"),
        (gqa_decoder, ["--target-shape", "heads=3", "--calibration", corpus_file], "multiple of 2"),
        (gqa_decoder, ["--target-shape", "width=3", "--calibration", corpus_file], "KEY=N"),
        (gqa_decoder, ["--target-shape", "layers=2", "--drop-layers", 1, "--calibration", corpus_file], "without --drop-*"),
        (gqa_decoder, ["--target-shape", "layers=2"], "--calibration"),
        (gqa_decoder, ["--target-shape", "layers=2", "--objective", "contrastive"], "--groups"),
        (tiny_bert, ["--target-shape", "layers=1", "--calibration", corpus_file], "Llama-family"),
    ]
    for model, flags, says in cases:
        r = runner("prune", model, "-o", out, *flags)
        assert r.exit_code == 2, (flags, r.stderr)
        assert says in r.stderr, (flags, r.stderr)
        assert not out.exists()


def test_an_interrupted_shape_run_resumes_to_the_same_model(runner, monkeypatch, gqa_decoder, corpus_file, tmp_path):
    from safetensors.torch import load_file

    from retrctl.prune import shearing

    flags = ["--target-shape", TARGET_FLAG, "--calibration", corpus_file, "--shape-steps", 4, "--train-batch-size", 4,
             "--max-length", 32, "--lr", 1e-3, "--save-steps", 1]
    whole = tmp_path / "whole"
    assert runner("prune", gqa_decoder, "-o", whole, *flags).exit_code == 0
    out = tmp_path / "small"
    real, calls = shearing._lm_loss, []

    def dies_at_step_3(*a, **kw):  # call 1 is the unpruned model's loss, then one per step
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt  # a kill, as far as prune can tell
        return real(*a, **kw)

    monkeypatch.setattr(shearing, "_lm_loss", dies_at_step_3)
    r = runner("prune", gqa_decoder, "-o", out, *flags)
    assert r.exit_code != 0 and not out.exists()
    partial = tmp_path / "small.partial"
    assert (partial / ".prune" / "shape-lm.pt").is_file()
    monkeypatch.setattr(shearing, "_lm_loss", real)
    r = runner("prune", gqa_decoder, "-o", out, *[f if f != 4 else 5 for f in flags], "--resume")
    assert r.exit_code == 2 and "differs from the interrupted one in shape_steps" in r.stderr
    r = runner("prune", gqa_decoder, "-o", out, *flags, "--resume")
    assert r.exit_code == 0, r.stderr
    assert not partial.exists()
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    ra, rb = (json.loads((d / "prune.json").read_text())["shape"]["metrics"] for d in (whole, out))
    assert ra["lm_loss"] == rb["lm_loss"]  # the same loss curve, the first two steps from the checkpoint


def test_leftovers_without_resume_are_cleared_and_foreign_ones_refused(runner, gqa_decoder, corpus_file, tmp_path):
    flags = ["--target-shape", "layers=3", "--calibration", corpus_file, "--shape-steps", 1, "--train-batch-size", 2,
             "--max-length", 16]
    out, partial = tmp_path / "small", tmp_path / "small.partial"
    (partial / ".prune").mkdir(parents=True)
    (partial / ".prune" / "prune-state.json").write_text("{}")
    (partial / "stale.bin").write_text("from a killed run")
    r = runner("prune", gqa_decoder, "-o", out, *flags)
    assert r.exit_code == 0, r.stderr
    assert not partial.exists() and not (out / "stale.bin").exists()
    partial.mkdir()
    (partial / "notes.txt").write_text("the user's")
    r = runner("prune", gqa_decoder, "-o", tmp_path / "small", *flags)
    assert r.exit_code == 2 and "not written by retrctl prune" in r.stderr
    assert (partial / "notes.txt").read_text() == "the user's"
