"""retrctl export: every artifact reproduces retrctl's PyTorch encoder, or nothing is written.

Tiny random models (conftest) test plumbing: parity bounds are the export's own (st 1e-5 max abs diff, ONNX fp32
1e-4, int8 mean cosine ≥ 0.99). The int8 bound holds on tiny_bert because its random weights are small and
well spread (per-channel int8 keeps ~1% relative error per MatMul); the real MiniLM figure is in bench/RESULTS.md.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retrctl.export import SAMPLE_TEXTS

ROOT = Path(__file__).resolve().parents[1]
TEXTS = SAMPLE_TEXTS[:6] + ["completely different words for a second check", "x y z"]


def _torch_vectors(model, kind="passage", **settings):
    from retrctl.models import Encoder

    return Encoder.load(model, device="cpu", **settings).encode(TEXTS, kind)


def _cos(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _no_leftovers(parent: Path, name: str) -> bool:
    return not [p for p in parent.iterdir() if p.name.startswith(f".{name}") or p.name == name]


@pytest.fixture(scope="module")
def bert_dist(tiny_bert, tmp_path_factory):
    from click.testing import CliRunner

    from tests.conftest import _retrctl

    dist = tmp_path_factory.mktemp("export") / "dist"
    r = CliRunner().invoke(_retrctl, ["export", str(tiny_bert), "-o", str(dist), "--query-prompt", "query: "])
    assert r.exit_code == 0, r.stderr
    assert "onnx-int8 parity" in r.stderr and r.stdout == ""
    return dist


def test_stock_sentence_transformers_reproduces_the_encoder(bert_dist, tiny_bert):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(bert_dist), device="cpu")
    ours_q = _torch_vectors(tiny_bert, "query", query_prompt="query: ")
    np.testing.assert_allclose(st.encode(TEXTS, prompt_name="query"), ours_q, atol=1e-5)
    np.testing.assert_allclose(st.encode(TEXTS, prompt_name="document"), _torch_vectors(tiny_bert), atol=1e-5)


def test_onnx_fp32_and_int8_parity(bert_dist, tiny_bert):
    from retrctl.models.runtime import OnnxEncoder, load_encoder

    ref_q = _torch_vectors(tiny_bert, "query", query_prompt="query: ")
    ref_p = _torch_vectors(tiny_bert)
    fp32 = load_encoder(bert_dist / "onnx")
    assert isinstance(fp32, OnnxEncoder) and fp32.dim == ref_p.shape[1]
    np.testing.assert_allclose(fp32.encode(TEXTS, "query"), ref_q, atol=1e-4)
    np.testing.assert_allclose(fp32.encode(TEXTS, "passage", batch_size=3), ref_p, atol=1e-4)
    int8_file = bert_dist / "onnx" / "model_int8.onnx"
    int8 = load_encoder(int8_file)
    got = int8.encode(TEXTS, "passage")
    assert _cos(got, ref_p).mean() >= 0.99
    assert np.abs(got - fp32.encode(TEXTS, "passage")).max() > 1e-6  # quantised: close, not the fp32 graph
    import onnx

    ops = {n.op_type for n in onnx.load(str(int8_file)).graph.node}
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= ops  # weight MatMuls in int8 (attention QK^T stays fp32)
    assert sum(n.op_type == "MatMulInteger" for n in onnx.load(str(int8_file)).graph.node) == 2 * 6  # all weight MatMuls
    report = json.loads((bert_dist / "export.json").read_text())
    assert set(report["formats"]) == {"st", "onnx", "onnx-int8"}
    assert report["formats"]["onnx"]["min_cos"] >= 0.9999 and report["formats"]["onnx-int8"]["mean_cos"] >= 0.99
    card = (bert_dist / "README.md").read_text()
    assert "onnx/model_int8.onnx" in card and report["source_fingerprint"] in card and "'query: '" in card


def test_torch_weights_stay_the_default_backend(bert_dist):
    from retrctl.models import Encoder
    from retrctl.models.runtime import OnnxEncoder, load_encoder

    assert isinstance(load_encoder(bert_dist), Encoder)
    assert isinstance(load_encoder(bert_dist, backend="onnx"), OnnxEncoder)
    with pytest.raises(ValueError, match="part of the exported graph"):
        load_encoder(bert_dist / "onnx", pooling="cls")


def test_index_and_search_with_the_onnx_model_match_torch(runner, bert_dist, corpus_file, queries_file, tmp_path):
    runs = {}
    for name, model in (("torch", bert_dist), ("onnx", bert_dist / "onnx")):
        idx = tmp_path / f"idx-{name}"
        r = runner("index", corpus_file, "--model", model, "-o", idx)
        assert r.exit_code == 0, r.stderr
        r = runner("search", idx, queries_file, "--hits", 6)
        assert r.exit_code == 0, r.stderr
        runs[name] = [line.split() for line in r.stdout.splitlines()]
    manifest = json.loads(next((tmp_path / "idx-onnx").rglob("index.json")).read_text())
    assert manifest["encoder"]["backend"] == "onnx"
    assert [row[:3] for row in runs["torch"]] == [row[:3] for row in runs["onnx"]]
    np.testing.assert_allclose([float(r[4]) for r in runs["torch"]], [float(r[4]) for r in runs["onnx"]], atol=1e-4)


def test_backend_flag_forces_the_runtime(runner, bert_dist, tiny_bert, corpus_file, queries_file, tmp_path):
    def encoder_backend(idx):
        return json.loads(next(idx.rglob("index.json")).read_text())["encoder"].get("backend", "torch")

    r = runner("index", corpus_file, "--model", bert_dist, "--backend", "onnx", "-o", tmp_path / "a")
    assert r.exit_code == 0, r.stderr
    assert encoder_backend(tmp_path / "a") == "onnx"  # the dir holds torch weights too: torch unless forced
    r = runner("index", corpus_file, "--model", bert_dist / "onnx", "--backend", "torch", "-o", tmp_path / "b")
    assert r.exit_code == 0, r.stderr
    assert encoder_backend(tmp_path / "b") == "torch"
    onnx = runner("search", tmp_path / "a", queries_file, "--hits", 3)
    torch_q = runner("search", tmp_path / "a", queries_file, "--hits", 3, "--backend", "torch")
    assert onnx.exit_code == 0 and torch_q.exit_code == 0, onnx.stderr + torch_q.stderr
    assert [ln.split()[:3] for ln in onnx.stdout.splitlines()] == [ln.split()[:3] for ln in torch_q.stdout.splitlines()]
    r = runner("index", corpus_file, "--model", tiny_bert, "--backend", "onnx", "-o", tmp_path / "c")
    assert r.exit_code == 2 and "holds no model.onnx" in r.stderr and not (tmp_path / "c").exists()


def test_card_lists_the_eval_results_of_runs_searched_with_the_model(runner, tiny_bert, corpus_file, queries_file, tmp_path):
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("".join(f"{json.loads(q)['query_id']}\t{json.loads(d)['docid']}\t1\n"
                             for q, d in zip(queries_file.read_text().splitlines(), corpus_file.read_text().splitlines(), strict=False)))
    assert runner("index", corpus_file, "--model", tiny_bert, "-o", tmp_path / "idx").exit_code == 0
    assert runner("search", tmp_path / "idx", queries_file, "--hits", 5, "-o", tmp_path / "run.trec").exit_code == 0
    r = runner("eval", tmp_path / "run.trec", "--qrels", qrels, "--json", "-m", "nDCG@10", "-o", tmp_path / "ev.jsonl")
    assert r.exit_code == 0, r.stderr
    ndcg = json.loads((tmp_path / "ev.jsonl").read_text().splitlines()[0])["nDCG@10"]
    r = runner("export", tiny_bert, "--format", "st", "--eval-results", tmp_path / "ev.jsonl", "-o", tmp_path / "dist")
    assert r.exit_code == 0, r.stderr
    card = (tmp_path / "dist" / "README.md").read_text()
    assert f"{ndcg:.4f}" in card and "run.trec" in card and "nDCG@10" in card
    other = tmp_path / "other"
    other.mkdir()
    (other / "ev.jsonl").write_text((tmp_path / "ev.jsonl").read_text().replace(str(tmp_path / "run.trec"), str(other / "x.trec")))
    r = runner("export", tiny_bert, "--format", "st", "--eval-results", other / "ev.jsonl", "-o", tmp_path / "dist2")
    assert r.exit_code == 0 and "No `retrctl eval` result names this model" in (tmp_path / "dist2" / "README.md").read_text()
    (other / "bad.jsonl").write_text("{}\nnot json\n")
    r = runner("export", tiny_bert, "--format", "st", "--eval-results", other / "bad.jsonl", "-o", tmp_path / "dist3")
    assert r.exit_code == 2 and "bad.jsonl:1" in r.stderr and not (tmp_path / "dist3").exists()


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_cast_st_export_is_stored_in_its_dtype_and_checked_against_fp32(runner, tiny_bert, tmp_path, dtype):
    from safetensors import safe_open

    r = runner("export", tiny_bert, "--format", "st", "--dtype", dtype, "-o", tmp_path / "dist")
    assert r.exit_code == 0, r.stderr
    with safe_open(str(tmp_path / "dist" / "model.safetensors"), "pt") as f:
        stored = {str(f.get_tensor(k).dtype) for k in f.keys()}
    assert stored == {{"fp16": "torch.float16", "bf16": "torch.bfloat16"}[dtype]}
    st = json.loads((tmp_path / "dist" / "export.json").read_text())["formats"]["st"]
    assert st["dtype"] == dtype and st["min_cos"] >= (0.999 if dtype == "fp16" else 0.99) and st["max_abs_diff"] > 0
    r = runner("export", tiny_bert, "--format", "st,onnx", "--dtype", dtype, "-o", tmp_path / "both")
    assert r.exit_code == 2 and "--format st only" in r.stderr and not (tmp_path / "both").exists()


def test_dim_refused_unless_trained_with_it_or_forced(runner, tiny_bert, tmp_path):
    dist = tmp_path / "d"
    r = runner("export", tiny_bert, "-o", dist, "--format", "st", "--dim", "16")
    assert r.exit_code == 2 and "mrl_dims" in r.stderr and "--force" in r.stderr and _no_leftovers(tmp_path, "d")
    r = runner("export", tiny_bert, "-o", dist, "--format", "st", "--dim", "64", "--force")
    assert r.exit_code == 2 and "above the model's dim (32)" in r.stderr and _no_leftovers(tmp_path, "d")
    trained = tmp_path / "trained"
    shutil.copytree(tiny_bert, trained)
    (trained / "train_config.json").write_text(json.dumps({"model": "tiny", "mrl_dims": [16, 32]}))
    r = runner("export", trained, "-o", dist, "--format", "st,onnx", "--dim", "16")
    assert r.exit_code == 0, r.stderr
    full = _torch_vectors(tiny_bert)
    want = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
    from sentence_transformers import SentenceTransformer

    got = SentenceTransformer(str(dist), device="cpu").encode(TEXTS)
    assert got.shape == (len(TEXTS), 16)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # renormalised after truncating
    np.testing.assert_allclose(got, want, atol=1e-5)
    from retrctl.models.runtime import load_encoder

    np.testing.assert_allclose(load_encoder(dist / "onnx").encode(TEXTS), want, atol=1e-4)
    assert "mrl_dims" in (dist / "README.md").read_text()


def test_forced_dim_without_mrl_training(runner, tiny_bert, tmp_path):
    r = runner("export", tiny_bert, "-o", tmp_path / "d", "--format", "onnx", "--dim", "8", "--force")
    assert r.exit_code == 0, r.stderr
    assert not (tmp_path / "d" / "modules.json").exists()  # only what was asked for
    from retrctl.models.runtime import load_encoder

    assert load_encoder(tmp_path / "d").dim == 8  # only onnx/ and no torch weights: the ONNX backend


def test_failed_parity_exits_2_and_writes_nothing(runner, tiny_bert, tmp_path, monkeypatch):
    from retrctl.export import onnx

    real = onnx.Graph.forward
    monkeypatch.setattr(onnx.Graph, "forward", lambda self, ids, mask: -real(self, ids, mask))  # a wrong graph
    r = runner("export", tiny_bert, "-o", tmp_path / "dist", "--format", "st,onnx")
    assert r.exit_code == 2
    assert "onnx failed its parity check" in r.stderr and "nothing written" in r.stderr
    assert _no_leftovers(tmp_path, "dist")


def test_missing_onnxruntime_says_how_to_install(runner, tiny_bert, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as when it is not installed
    r = runner("export", tiny_bert, "-o", tmp_path / "dist", "--format", "onnx")
    assert r.exit_code == 2 and "pip install 'retrctl[onnx]'" in r.stderr and _no_leftovers(tmp_path, "dist")
    assert runner("export", tiny_bert, "-o", tmp_path / "st", "--format", "st").exit_code == 0  # st needs neither


def test_bad_format_and_foreign_output_dir(runner, tiny_bert, tmp_path):
    r = runner("export", tiny_bert, "-o", tmp_path / "d", "--format", "st,tflite")
    assert r.exit_code == 2 and "tflite" in r.stderr
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("x")
    r = runner("export", tiny_bert, "-o", tmp_path / "mine", "--format", "st")
    assert r.exit_code == 2 and "not a retrctl export" in r.stderr and (tmp_path / "mine" / "keep.txt").exists()


def test_bidirectional_decoder_with_eos_pooling(runner, tiny_llama, tmp_path):
    dist = tmp_path / "d"
    r = runner("export", tiny_llama, "-o", dist, "--bidirectional", "--pooling", "eos", "--format", "st,onnx")
    assert r.exit_code == 0, r.stderr
    ref = _torch_vectors(tiny_llama, bidirectional=True, pooling="eos")
    assert not np.allclose(ref, _torch_vectors(tiny_llama, bidirectional=False, pooling="eos"), atol=1e-4)
    from sentence_transformers import SentenceTransformer

    np.testing.assert_allclose(SentenceTransformer(str(dist), device="cpu").encode(TEXTS), ref, atol=1e-5)
    from retrctl.models.runtime import load_encoder

    np.testing.assert_allclose(load_encoder(dist / "onnx").encode(TEXTS), ref, atol=1e-4)
    assert "is_causal" in (dist / "README.md").read_text()


def test_export_help_imports_neither_torch_nor_onnxruntime():
    code = ("import sys\nfrom retrctl.cli import main\n"
            "for args in (['--help'], ['export', '--help']):\n"
            "    try:\n        main(args)\n    except SystemExit as e:\n        assert e.code in (0, None), e.code\n"
            "    assert 'torch' not in sys.modules and 'onnxruntime' not in sys.modules, args\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "export" in out.stdout and "--dim" in out.stdout


def test_lora_adapter_dir_is_merged_in_fp32_and_matches_the_adapter_model(runner, tiny_bert, tmp_path):
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModel

    torch.manual_seed(1)
    base = AutoModel.from_pretrained(str(tiny_bert))
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], init_lora_weights=False)
    adapter = tmp_path / "adapter"
    get_peft_model(base, cfg).save_pretrained(adapter)
    meta = json.loads((adapter / "adapter_config.json").read_text())
    meta["base_model_name_or_path"] = str(tiny_bert)
    (adapter / "adapter_config.json").write_text(json.dumps(meta))
    from retrctl.models import Encoder

    enc = Encoder.load(tiny_bert, device="cpu")
    plain = enc.encode(TEXTS)
    enc.model = PeftModel.from_pretrained(enc.model, str(adapter)).eval()
    want = enc.encode(TEXTS)  # the adapter model, unmerged
    assert np.abs(want - plain).max() > 1e-3  # the adapters change the vectors, so the check below means something
    dist = tmp_path / "dist"
    r = runner("export", adapter, "-o", dist, "--format", "st,onnx")
    assert r.exit_code == 0, r.stderr
    from sentence_transformers import SentenceTransformer

    np.testing.assert_allclose(SentenceTransformer(str(dist), device="cpu").encode(TEXTS), want, atol=1e-5)
    report = json.loads((dist / "export.json").read_text())
    assert report["lora"]["merged_in"] == "fp32" and report["lora"]["merge_max_abs_diff"] <= 1e-5
    assert not (dist / "adapter_config.json").exists() and "merged in fp32" in (dist / "README.md").read_text()


def test_query_cap_below_passage_cap_reaches_stock_encode_query(runner, tiny_bert, tmp_path):
    """ST has one max_seq_length; a shorter query cap goes in as the Transformer's query_length (ST 6), so the
    stock encode_query cuts queries where retrctl does (the sample texts are longer than 3 tokens)."""
    dist = tmp_path / "d"
    r = runner("export", tiny_bert, "-o", dist, "--format", "st", "--query-max-len", "3", "--passage-max-len", "32")
    assert r.exit_code == 0, r.stderr
    sb = json.loads((dist / "sentence_bert_config.json").read_text())
    assert (sb["max_seq_length"], sb["query_length"], sb["document_length"]) == (32, 3, 32)
    ours = _torch_vectors(tiny_bert, "query", query_max_len=3, passage_max_len=32)
    assert not np.allclose(ours, _torch_vectors(tiny_bert, "query", query_max_len=32, passage_max_len=32), atol=1e-4)
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(dist), device="cpu")
    np.testing.assert_allclose(st.encode_query(TEXTS), ours, atol=1e-5)
    np.testing.assert_allclose(st.encode_document(TEXTS), _torch_vectors(tiny_bert, passage_max_len=32), atol=1e-5)
    assert "query_length" in (dist / "README.md").read_text()
    (dist / "retrctl.json").unlink()  # a sentence-transformers dir from elsewhere: the caps come from its config
    from retrctl.models import Encoder

    config = Encoder.load(dist, device="cpu").config
    assert (config.query_max_len, config.passage_max_len) == (3, 32)
