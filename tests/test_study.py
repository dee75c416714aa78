"""The scaling study (examples/scaling: study.py and its logic, study_lib.py): parameter counts against a hand count, pretraining
tokens by source, the log-linear fit, the table and its failed rows, the plot, the estimate, the collection cut,
and the whole Makefile on two tiny backbones and one that does not load."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
from conftest import run_group

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "scaling"))  # the study's logic is the example's, not the core's
import study_lib as study  # noqa: E402


def test_parameter_counts_equal_a_hand_count(tiny_bert, tiny_llama):
    v, h, inter, layers, positions = 30522, 32, 64, 2, 128  # conftest's tiny models (MiniLM's vocabulary)
    linear = lambda i, o, bias=True: i * o + (o if bias else 0)  # noqa: E731
    bert_embeddings = v * h + positions * h + 2 * h  # token, position, token type tables
    bert_layer = 4 * linear(h, h) + 2 * h + linear(h, inter) + linear(inter, h) + 2 * h  # q k v o, LN, MLP, LN
    bert_rest = 2 * h + layers * bert_layer + linear(h, h)  # the embeddings' LayerNorm, the blocks, the pooler
    counted = study.count_parameters(tiny_bert)
    assert counted == study.Params(total=bert_embeddings + bert_rest, non_embedding=bert_rest, layers=2)

    llama_layer = 4 * linear(h, h, bias=False) + 3 * linear(h, inter, bias=False) + 2 * h  # q k v o, MLP, 2 norms
    counted = study.count_parameters(tiny_llama)
    assert counted == study.Params(total=v * h + layers * llama_layer + h, non_embedding=layers * llama_layer + h, layers=2)


def test_pretraining_tokens_from_config_then_card_then_variable(tiny_llama, tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    for f in tiny_llama.iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    assert study.pretraining_tokens(model) == (None, "unknown")
    assert study.pretraining_tokens(model, 5e9) == (5e9, "variable")
    (model / "README.md").write_text("# m\n\nThis model was trained on 2 trillion tokens of web text.\n")
    assert study.pretraining_tokens(model, 5e9) == (2e12, "card")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "pretraining_tokens": 3e11}))
    assert study.pretraining_tokens(model, 5e9) == (3e11, "config")
    assert study.pretraining_tokens(tmp_path / "absent", 7e9) == (7e9, "variable")
    assert study.training_flops(100, 2e12) == 6 * 100 * 2e12
    assert study.training_flops(None, 2e12) is None


def _rows() -> list[study.Row]:
    # average nDCG@10 = -0.8 + 0.05·log10(FLOPs) exactly; params move one decade per backbone as FLOPs do
    rows = []
    for k in (1, 2, 3):
        flops, params = 10.0 ** (18 + k), 10 ** (6 + k)
        avg = -0.8 + 0.05 * math.log10(flops)
        rows.append(study.Row(backbone=f"b{k}", params_total=params * 2, params_non_embedding=params, tokens=2e12,
                              tokens_source="variable", flops=flops, ndcg={"a": avg - 0.01, "b": avg + 0.01}, seconds=60.0 * k))
    rows.append(study.Row(backbone="broken", status="failed", reason="model 'x': no such file or directory"))
    return rows


def test_loglinear_fit_recovers_the_slope_and_skips_failed_rows():
    rows = _rows()
    fit = study.loglinear_fit(rows, "FLOPs")
    assert fit.n == 3 and fit.slope == pytest.approx(0.05) and fit.intercept == pytest.approx(-0.8) and fit.r2 == pytest.approx(1.0)
    fit = study.loglinear_fit(rows, "params")
    assert fit.slope == pytest.approx(0.05) and fit.intercept == pytest.approx(-0.2) and fit.n == 3
    assert study.loglinear_fit(rows[:1], "FLOPs") is None
    lines = study.fit_lines(rows)
    assert "slope +0.0500 per decade" in lines[0] and "3 backbones" in lines[0]
    assert "needs two finished backbones" in study.fit_lines(rows[:1])[0]


def test_fits_stay_within_a_family():
    """A finished retriever beside a family of checkpoints (the study's MiniLM beside SmolLM2's sizes) gets no fit of
    its own and does not bend the family's."""
    rows = _rows()
    for r in rows:
        r.family = "fam"
    rows.append(study.Row(backbone="retriever", family="retriever", params_non_embedding=10**6, flops=1e18,
                          ndcg={"a": 0.9, "b": 0.9}))
    lines = study.fit_lines(rows)
    assert lines[0].startswith("fit on FLOPs (fam): ") and "slope +0.0500 per decade" in lines[0] and "3 backbones" in lines[0]
    assert lines[1].startswith("fit on params (fam): ") and "R² 1.000" in lines[1]
    assert lines[2] == "no fit for a family of one backbone: retriever"
    pooled = study.loglinear_fit(rows, "FLOPs")  # what one fit over every backbone would say
    assert pooled.slope < 0


def test_table_has_every_column_and_the_failed_row():
    text = study.table(_rows(), ["a", "b"])
    head, rule, *lines = text.splitlines()
    assert [c.strip() for c in head.strip("|").split("|")] == [
        "backbone", "status", "params (non-emb.)", "params (total)", "pretraining tokens", "FLOPs 6·N·D",
        "LM bits/byte", "nDCG@10 a", "nDCG@10 b", "average", "wall s"]
    assert len(lines) == 4 and all(ln.count("|") == head.count("|") for ln in [rule, *lines])
    first = [c.strip() for c in lines[0].strip("|").split("|")]
    assert first[:6] == ["b1", "ok", "10M", "20M", "2e12 (variable)", "1e19"]
    assert first[6:] == ["—", "0.1400", "0.1600", "0.1500", "60"]
    assert "failed: model 'x': no such file or directory" in lines[3] and lines[3].endswith("| — | — | — | — | — |")


def test_spearman_and_the_proxy_line():
    assert study.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert study.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert study.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833)  # ties get average ranks
    assert study.spearman([1, 2], [1, 2]) is None and study.spearman([1, 1, 1], [1, 2, 3]) is None
    rows = _rows()
    for r, bits in zip(rows, (3.0, 2.0, 1.0), strict=False):  # lower loss, higher nDCG: rho +1
        r.proxy = bits
    assert study.fit_lines(rows)[2] == "LM proxy (bits/byte, lower first) vs average nDCG@10: Spearman rho +1.000 over 3 backbones"
    assert "needs three" in study.fit_lines(rows[1:])[2]


def test_lm_proxy_is_the_next_token_loss_per_byte(tiny_llama, tiny_bert):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    texts = ["Cats are small domesticated carnivorous mammals that purr.", "Tea is brewed."]
    lm, tok = AutoModelForCausalLM.from_pretrained(str(tiny_llama)), AutoTokenizer.from_pretrained(str(tiny_llama))
    nats = n_bytes = 0.0
    for text in texts:  # one text at a time, no padding: transformers' own mean loss over the predicted tokens
        ids = tok(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            nats += float(lm(input_ids=ids, labels=ids).loss) * (ids.shape[1] - 1)
        n_bytes += len(tok.decode(ids[0, 1:], skip_special_tokens=True).encode("utf-8"))
    bits, note = study.lm_bits_per_byte(tiny_llama, texts, batch_size=2)  # padded together
    assert note == "" and bits == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-5)
    assert study.lm_bits_per_byte(tiny_bert, texts) == (None, "bert is not a causal LM")


def test_plot_is_written_and_skipped_when_nothing_finished(tmp_path):
    out = study.plot(_rows(), tmp_path / "s.png", note="budget")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not list(tmp_path.glob("*.tmp*"))
    assert study.plot(_rows()[3:], tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_estimate_counts_train_and_encode_flops():
    budget = study.Budget(groups=16, group_size=2, max_len=128, docs=100, queries=10, collections=2)
    trained, encoded = 16 * (64 + 2 * 128), 2 * (100 * 128 + 10 * 64)
    n = 10**8
    assert study.estimate_seconds(n, budget, flops_per_second=1e11, stage_seconds=20) == pytest.approx(
        (8 * n * trained + 2 * n * encoded) / 1e11 + 20 * 5)


def _beir(folder: Path, docs: list[dict], queries: list[dict], qrels: dict[str, dict[str, dict[str, int]]]) -> Path:
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": d["docid"], "title": d["title"], "text": d["text"]}) + "\n" for d in docs))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": q["query_id"], "text": q["query_text"]}) + "\n" for q in queries))
    for split, pairs in qrels.items():
        rows = [f"{q}\t{d}\t{r}" for q, ds in pairs.items() for d, r in ds.items()]
        (folder / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    return folder


@pytest.fixture
def toy(tmp_path) -> Path:
    """A BEIR folder with test and train splits: six docs, three test and three train queries."""
    from conftest import DOCS, QRELS, QUERIES

    train = [{"query_id": f"t{i}", "query_text": text} for i, text in
             enumerate(("purring pets", "beverage with caffeine", "readable programming language"))]
    return _beir(tmp_path / "data" / "toy", DOCS, QUERIES + train,
                 {"test": QRELS, "train": {"t0": {"d1": 1}, "t1": {"d6": 1}, "t2": {"d3": 1}}})


def test_slice_keeps_the_judged_docs_of_the_first_queries(toy, tmp_path):
    from retrctl import records

    out = study.slice_collection(toy, tmp_path / "cut", max_docs=3, max_queries=2)
    docs = [d["docid"] for d in records.read(out, "doc")]
    assert docs == ["d1", "d3", "d4"]  # q1's and q2's judged docs fill the budget (3 docs)
    assert sorted(q["query_id"] for q in records.read(out, "query")) == ["q1", "q2"]
    assert records.read_qrels(out, "test") == {"q1": {"d1": 1}, "q2": {"d4": 2, "d3": 1}}


def test_rows_of_two_backbones_and_a_failed_one_make_the_table_and_the_fit(tiny_bert, tiny_llama, tmp_path):
    """What the Makefile's row and report steps do, in-process: each backbone's work dir (evaluations, timed steps,
    proxy) and model make its row; a model that does not load, or a missing evaluation, fails only its own row."""
    for name, values, secs in (("bert", (0.31, 0.52), ("12.5", "3.5")), ("llama", (0.41, 0.62), ("30", "10"))):
        work = tmp_path / name
        work.mkdir()
        for collection, value in zip(("a", "b"), values, strict=True):
            (work / f"{collection}.eval.json").write_text(json.dumps({"run": "x", "nDCG@10": value}) + "\n")
        for step, s in zip(("model", "a.trec"), secs, strict=True):
            (work / f"{step}.secs").write_text(s + "\n")
    (tmp_path / "llama" / "proxy.json").write_text(json.dumps({"bits_per_byte": 3.5, "note": ""}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "steps.log").write_text("retrctl train ...\nError: model 'nowhere': no such file or directory\n"
                                                   "make[1]: *** [Makefile:99: w/bb/broken/model] Error 2\n")
    bert = study.build_row("bert", tiny_bert, status="ok", work=tmp_path / "bert", collections=["a", "b"], tokens_fallback=1e9)
    llama = study.build_row("llama", tiny_llama, status="ok", work=tmp_path / "llama", collections=["a", "b"], tokens_fallback=1e10)
    broken = study.build_row("broken", tmp_path / "nowhere", status="failed", work=tmp_path / "broken", collections=["a", "b"],
                             log=tmp_path / "broken" / "steps.log")
    half = study.build_row("half", tiny_bert, status="ok", work=tmp_path / "bert", collections=["a", "c"])
    assert (bert.status, bert.ndcg, bert.seconds, bert.tokens, bert.tokens_source) == ("ok", {"a": 0.31, "b": 0.52}, 16.0, 1e9, "variable")
    assert bert.flops == 6 * bert.params_non_embedding * 1e9 and bert.proxy is None
    assert llama.proxy == 3.5 and llama.average == pytest.approx(0.515) and llama.seconds == 40.0
    assert (broken.status, broken.reason, broken.params_total, broken.flops) == (
        "failed", "Error: model 'nowhere': no such file or directory", None, None)
    assert (half.status, half.reason) == ("failed", "no evaluation of c")
    path = tmp_path / "row.json"
    llama.write(path)
    assert study.Row.read(path) == llama
    rows = [bert, llama, broken]
    lines = study.table(rows, ["a", "b"]).splitlines()
    assert len(lines) == 5 and lines[4].startswith("| broken | failed: Error: model 'nowhere'")
    assert all("—" not in c for c in lines[2].split("|")[1:-1][:6] + lines[3].split("|")[1:-1])  # every column filled
    fit = study.loglinear_fit(rows, "FLOPs")
    assert fit.n == 2 and fit.r2 == pytest.approx(1.0)
    assert fit.slope == pytest.approx((llama.average - bert.average) / math.log10(llama.flops / bert.flops))


@pytest.mark.slow  # ~17 processes that each import torch: 2.5 min on the idle 2 cores, over 10 under load
def test_makefile_runs_the_study_and_keeps_a_failed_row(toy, tiny_bert, tiny_llama, tmp_path):
    """The whole pipeline on two tiny backbones and a dir that does not load: both rows finish with every column,
    the third is marked failed with the reason, the fits and the plot come out."""
    work = tmp_path / "work"
    backbones = f"bert={tiny_bert} llama={tiny_llama} broken={tmp_path / 'no-such-model'}"
    env = {**os.environ, "RETRCTL_CACHE": str(tmp_path / "cache")}
    args = (
        ["make", "-C", str(ROOT / "examples" / "scaling"), f"PY={sys.executable}", f"DATA={toy.parent}",
         f"TRAIN_DATA={toy}", "COLLECTIONS=toy", f"W={work}", f"BACKBONES={backbones}", "GROUPS=3", "BATCH=3",
         "MAX_LEN=32", "DOCS=5", "QUERIES=3", "TOKENS_bert=1e9", "TOKENS_llama=1e10", "PRUNED=", "PROXY_TEXTS=4",
         "FAMILY_bert=tiny", "FAMILY_llama=tiny"])
    out = run_group(args, env, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "estimated: ~" in out.stderr and "broken: ?" in out.stderr  # the plan, before anything runs
    lines = out.stdout.splitlines()
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.strip("|").split("|")] for ln in lines if ln.startswith("| ")}
    assert set(rows) == {"backbone", "bert", "llama", "broken"}
    for name, tokens in (("bert", "1e09 (variable)"), ("llama", "1e10 (variable)")):
        r = rows[name]
        assert r[1] == "ok" and r[4] == tokens and all(c != "—" for i, c in enumerate(r) if i != 6), r
        assert 0 <= float(r[7]) <= 1 and float(r[8]) == float(r[7]) and float(r[9]) > 0
    assert rows["bert"][6] == "—" and float(rows["llama"][6]) > 0  # the LM proxy: causal LMs only
    assert rows["broken"][1].startswith("failed: ") and "no-such-model" in rows["broken"][1]
    assert any(ln.startswith("fit on FLOPs (tiny): avg nDCG@10 = ") and "2 backbones" in ln for ln in lines)
    assert any(ln.startswith("fit on params (tiny): ") for ln in lines)
    assert "no fit for a family of one backbone: broken" not in out.stdout  # a failed backbone is not a point
    assert json.loads((work / "rows" / "bert.json").read_text())["family"] == "tiny"
    assert any(ln.startswith("LM proxy vs average nDCG@10: needs three") for ln in lines)
    assert (work / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((work / "rows" / "broken.json").read_text())["status"] == "failed"


def test_a_step_deleted_by_hand_is_made_again_with_what_was_made_from_it(tmp_path):
    """No step's output is intermediate: with a backbone's model deleted, make trains it again and then indexes,
    searches and evaluates again (a dry run, `make -n`, over a work dir of finished steps)."""
    work = tmp_path / "w"
    steps = ["all-groups.jsonl", "groups.jsonl", "data/toy/corpus.jsonl", "bb/b/model/", "bb/b/toy.trec",
             "bb/b/toy.eval.json"]
    for i, step in enumerate(steps):  # each finished a second after what it is made from
        path = work / step
        path.parent.mkdir(parents=True, exist_ok=True)
        if step.endswith("/"):
            path.mkdir()
        else:
            path.touch()
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
    args = ["make", "-n", "-C", str(ROOT / "examples" / "scaling"), f"PY={sys.executable}", f"W={work}",
            "COLLECTIONS=toy", "BACKBONES=b=minilm", "PRUNED=", str(work / "bb" / "b" / "toy.eval.json")]
    out = run_group(args, dict(os.environ), timeout=60)
    assert out.returncode == 0 and " train " not in out.stdout and " eval " not in out.stdout, out.stdout + out.stderr
    (work / "bb" / "b" / "model").rmdir()
    out = run_group(args, dict(os.environ), timeout=60)
    assert out.returncode == 0, out.stderr
    assert all(f" {cmd} " in out.stdout for cmd in ("train", "index", "search", "eval")), out.stdout
