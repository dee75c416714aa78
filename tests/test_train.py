"""train: the Python API on in-memory groups, the CLI (stdin streaming, --config, refusals), bad input, resume
(after an exception and after kill -9 at a random point), LoRA merge into stock loaders, GradCache in the loop, and
2 DeepSpeed processes = 1 process with the whole batch. Output safety and checkpoint loading: test_train_safety.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from trainkit import FAST, WORDS
from trainkit import corpus as _corpus
from trainkit import groups as _groups
from trainkit import losses as _losses
from trainkit import write_jsonl as _write_jsonl

from retrctl.models import Encoder
from retrctl.train.config import TrainConfig
from retrctl.train.data import Batches, GroupSource
from retrctl.train.engines import deepspeed_config
from stages.train import train

ROOT = Path(__file__).resolve().parents[1]
# ---------------------------------------------------------------- data


def test_group_sampling_is_seeded_padded_and_counted():
    corpus = _corpus()
    groups = _groups(8, negatives=5)
    groups[0]["negative_document_ids"] = ["d30"]  # 1 of the 3 wanted: 2 resampled
    groups[1]["negative_document_ids"] = []  # none: 3 drawn from the corpus
    make = lambda seed: Batches(GroupSource(groups, corpus), group_size=4, global_batch=4, seed=seed)  # noqa: E731
    a, b, c = make(0), make(0), make(1)
    ea, eb, ec = list(a.epoch(0)), list(b.epoch(0)), list(c.epoch(0))
    assert [e.passages for batch in ea for e in batch] == [e.passages for batch in eb for e in batch]
    assert [e.passages for batch in ea for e in batch] != [e.passages for batch in ec for e in batch]
    assert sum(e.padded for b in ea for e in b) == 2 and sum(e.drawn for b in ea for e in b) == 3
    assert [e.passages for batch in ea for e in batch] != [e.passages for batch in a.epoch(1) for e in batch]
    ex = {e.query_id: e for batch in ea for e in batch}
    assert ex["q0"].passages.count(ex["q0"].passages[1]) == 3  # its only negative, three times
    assert all(len(e.passages) == 4 and e.keys[0][0] == f"d{e.query_id[1:]}" for e in ex.values())
    assert "d1" not in [k[0] for k in ex["q1"].keys[1:]]  # random negatives avoid the positive


def test_length_grouping_reduces_padding():
    corpus = _corpus()
    for i in range(16):
        corpus[f"d{i}"]["text"] = "word " * (2 + 10 * (i % 4))
    groups = _groups(16, negatives=0)
    waste = {}
    for on in (True, False):
        batches = Batches(GroupSource(groups, corpus), group_size=1, global_batch=4, group_by_length=on)
        lens = [[len(e.passages[0]) for e in b] for b in batches.epoch(0)]
        waste[on] = sum(max(b) * len(b) - sum(b) for b in lens)
    assert waste[True] < waste[False]


# ---------------------------------------------------------------- Python API


def test_train_api_output_loads_in_stock_loaders(tiny_bert, tmp_path):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    out = train(_groups(), corpus=_corpus(), output=tmp_path / "m", model=str(tiny_bert), query_prompt="query: ",
                temperature=0.05, epochs=2, **FAST)
    assert out == tmp_path / "m" and not (tmp_path / "m.partial").exists()
    assert len(_losses(out)) == 8
    saved = json.loads((out / "retrctl.json").read_text())
    assert saved["temperature"] == 0.05 and saved["query_prompt"] == "query: " and saved["passage_max_len"] == 24
    assert json.loads((out / "train_config.json").read_text())["epochs"] == 2
    assert not (out / "checkpoints").exists()
    texts = ["cat purr", "rust memory safety"]
    ours = Encoder.load(out, device="cpu")
    st = SentenceTransformer(str(out), device="cpu")
    assert np.allclose(ours.encode(texts), st.encode(texts), atol=1e-5)
    assert np.allclose(ours.encode(texts, kind="query"), st.encode(texts, prompt_name="query"), atol=1e-5)
    AutoModel.from_pretrained(str(out))
    base = Encoder.load(tiny_bert, device="cpu").encode(texts)
    assert not np.allclose(base, ours.encode(texts), atol=1e-3)  # the weights moved (FlagEmbedding#1547)


def test_one_process_without_zero_trains_where_deepspeed_is_not_installed(tiny_bert, tmp_path, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else find_spec(name, *a))
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # an import of it raises ImportError, as on such a machine
    out = train(_groups(), corpus=_corpus(), output=tmp_path / "m", model=str(tiny_bert), max_steps=2, **FAST)
    assert len(_losses(out)) == 2


def test_groups_per_second_counts_an_epochs_short_last_batch_as_short(tiny_bert, tmp_path, monkeypatch):
    import time

    from retrctl.train.loop import Trainer

    spent, step = [], Trainer.step

    def timed(self, batch, first):  # each step a fixed 0.1 s longer: the rate is the window's groups over its time
        t0 = time.perf_counter()
        time.sleep(0.1)
        out = step(self, batch, first)
        spent.append(time.perf_counter() - t0)
        return out

    monkeypatch.setattr(Trainer, "step", timed)
    out = train(_groups(10), corpus=_corpus(), output=tmp_path / "m", model=str(tiny_bert), epochs=1, **FAST)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["groups_consumed"] for r in rows] == [4, 8, 10]  # batches of 4, 4 and the last 2
    assert rows[-1]["groups_per_s"] == pytest.approx(10 / sum(spent), rel=0.05)


def test_false_negatives_are_masked_in_training(no_dropout_bert, tmp_path):
    groups = _groups(8)
    groups[1]["positive_document_ids"] = ["d1", "d0"]  # q1 also accepts q0's positive
    corpus = _corpus()
    corpus["d5"] = dict(corpus["d4"])  # q5's positive has the same text as q4's
    groups[4]["positive_document_ids"] = ["d4"]
    out = train(groups, corpus=corpus, output=tmp_path / "m", model=str(no_dropout_bert), group_by_length=False,
                max_steps=2, **FAST)
    masked = [json.loads(line)["masked"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum(masked) >= 2  # d0 for q1 (by id), d4/d5 by text


def test_grad_cache_in_the_loop_matches_plain(no_dropout_bert, tmp_path):
    kw = {"corpus": _corpus(), "model": str(no_dropout_bert), "max_steps": 3, **FAST}
    plain = train(_groups(), output=tmp_path / "a", **kw)
    cached = train(_groups(), output=tmp_path / "b", grad_cache=True, chunk_size=3, **kw)
    assert np.allclose(_losses(plain), _losses(cached), atol=1e-5)


def test_lora_merged_save_is_a_plain_model(tiny_llama, tmp_path):
    from transformers import AutoModel

    out = train(_groups(), corpus=_corpus(), output=tmp_path / "m", model=str(tiny_llama), pooling="mean",
                bidirectional=True, lora_r=4, lora_alpha=8, gradient_checkpointing=True, max_steps=3,
                lora_check_steps=2, mrl_dims=[8, 32], **FAST)
    names = [f.name for f in out.iterdir()]
    assert "adapter_config.json" not in names
    model = AutoModel.from_pretrained(str(out))
    assert not any("lora" in n for n, _ in model.named_parameters())
    assert json.loads((out / "retrctl.json").read_text())["bidirectional"] is True
    assert json.loads((out / "train_config.json").read_text())["mrl_dims"] == [8, 32]


def test_lora_that_does_not_move_fails_loudly(tiny_bert, tmp_path):
    with pytest.raises(RuntimeError, match="LoRA B weights are still zero"):
        train(_groups(), corpus=_corpus(), output=tmp_path / "m", model=str(tiny_bert), lora_r=4, max_steps=3,
              lora_check_steps=2, **{**FAST, "lr": 0.0})
    assert not (tmp_path / "m").exists()


def test_distillation_from_group_scores(no_dropout_bert, tmp_path):
    groups = _groups(8)
    for g in groups:
        g["positive_scores"] = [5.0]
        g["negative_scores"] = [float(-i) for i in range(len(g["negative_document_ids"]))]
    out = train(groups, corpus=_corpus(), output=tmp_path / "m", model=str(no_dropout_bert), distill_weight=0.5, max_steps=2, **FAST)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["kl"] > 0 and r["loss"] == pytest.approx(r["ce"] + 0.5 * r["kl"], rel=1e-5) for r in rows)


def test_margin_mse_distillation_alone(no_dropout_bert, tmp_path):
    groups = _groups(8)
    for g in groups:
        g["positive_scores"] = [5.0]
        g["negative_scores"] = [float(-i) for i in range(len(g["negative_document_ids"]))]
    out = train(groups, corpus=_corpus(), output=tmp_path / "m", model=str(no_dropout_bert), distill_weight=1.0,
                distill_loss="margin-mse", contrastive_weight=0.0, max_steps=2, **FAST)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["margin_mse"] > 0 and r["loss"] == pytest.approx(r["margin_mse"], rel=1e-5) for r in rows)


def test_bf16_mixed_precision_on_cpu(no_dropout_bert, tmp_path):
    out = train(_groups(8), corpus=_corpus(), output=tmp_path / "m", model=str(no_dropout_bert), dtype="bf16", max_steps=2, **FAST)
    assert all(np.isfinite(_losses(out)))
    assert Encoder.load(out, device="cpu").model.dtype == torch.float32  # master weights stay fp32 on disk


def test_first_step_is_padded_to_the_max_lengths(tiny_bert, tmp_path):
    widths = []
    from retrctl.train import loop as trainer

    orig = trainer.Trainer._tokenize

    def record(self, texts, kind, pad_to_max):
        batch = orig(self, texts, kind, pad_to_max)
        widths.append((kind, batch["input_ids"].size(1), pad_to_max))
        return batch

    trainer.Trainer._tokenize = record
    try:
        train(_groups(8), corpus=_corpus(), output=tmp_path / "m", model=str(tiny_bert), max_steps=2, **FAST)
    finally:
        trainer.Trainer._tokenize = orig
    steps = [w for w in widths if len(w) == 3]
    assert steps[0] == ("query", 16, True) and steps[1] == ("passage", 24, True)
    assert all(w[1] < 24 for w in steps[2:] if w[0] == "passage")


# ---------------------------------------------------------------- resume


def test_resume_after_a_crash_gives_the_same_losses(tiny_bert, tmp_path, runner):
    """2N steps in one run == N steps, crash, N resumed steps (dropout on: RNG state must be restored)."""
    corpus_file = _write_jsonl(tmp_path / "corpus.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    groups_file = _write_jsonl(tmp_path / "groups.jsonl", _groups())
    kw = {"model": str(tiny_bert), "max_steps": 8, "save_steps": 3, "warmup_steps": 2, **FAST}
    whole = train(str(groups_file), corpus=str(corpus_file), output=tmp_path / "a", **kw)

    def crash(step, metrics):
        if step == 5:  # after the step-3 checkpoint, with two steps' metrics to be dropped
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(str(groups_file), corpus=str(corpus_file), output=tmp_path / "b", on_step=crash, **kw)
    assert (tmp_path / "b.partial" / "checkpoints" / "step-3").is_dir() and not (tmp_path / "b").exists()
    args = ["train", groups_file, "--corpus", corpus_file, "--model", tiny_bert, "-o", tmp_path / "b", "--resume",
            "--max-steps", 8, "--save-steps", 3, "--warmup-steps", 2]
    for k, v in FAST.items():
        args += [f"--{k.replace('_', '-')}", v]
    r = runner(*args)
    assert r.exit_code == 0, r.stderr
    assert "resumed from" in r.stderr
    assert np.allclose(_losses(whole), _losses(tmp_path / "b"), atol=1e-5)
    state_a = Encoder.load(whole, device="cpu").encode(["cat purr"])
    state_b = Encoder.load(tmp_path / "b", device="cpu").encode(["cat purr"])
    assert np.allclose(state_a, state_b, atol=1e-5)


# ---------------------------------------------------------------- CLI


def test_cli_streams_groups_from_stdin(tiny_bert, tmp_path, runner):
    corpus_file = _write_jsonl(tmp_path / "corpus.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    stdin = "".join(json.dumps(g) + "\n" for g in _groups(8))
    r = runner("train", "--corpus", corpus_file, "--model", tiny_bert, "-o", tmp_path / "m", "--train-batch-size", 4,
               "--train-group-size", 2, "--passage-max-len", 24, "--logging-steps", 1, "--epochs", 1, input=stdin)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == ""  # stdout is for records; train writes none
    assert "step 2/2" in r.stderr and "saved" in r.stderr
    assert (tmp_path / "m" / "modules.json").exists()


def test_cli_config_file_with_flag_override(tiny_bert, tmp_path, runner):
    corpus_file = _write_jsonl(tmp_path / "corpus.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    groups_file = _write_jsonl(tmp_path / "groups.jsonl", _groups(8))
    (tmp_path / "train.json").write_text(json.dumps({"model": str(tiny_bert), "train_group_size": 2, "lr": 5e-4,
                                                     "batch_size": 8, "passage_max_len": 24}))
    r = runner("train", groups_file, "--corpus", corpus_file, "--config", tmp_path / "train.json", "--train-batch-size", 4,
               "-o", tmp_path / "m")
    assert r.exit_code == 0, r.stderr
    saved = json.loads((tmp_path / "m" / "train_config.json").read_text())
    assert saved["lr"] == 5e-4 and saved["train_group_size"] == 2 and saved["batch_size"] == 4


@pytest.mark.parametrize("flags,message", [
    (["--zero-stage", "1", "--deepspeed", "ds.json"], "give --zero-stage or --deepspeed, not both"),
    (["--zero-stage", "5"], "--zero-stage must be 0, 1, 2 or 3"),
    (["--temperature", "0"], "--temperature must be positive"),
    (["--dtype", "fp16"], "fp16 needs loss scaling"),
])
def test_cli_refuses_bad_combinations_up_front(tiny_bert, tmp_path, runner, flags, message):
    r = runner("train", tmp_path / "g.jsonl", "--model", tiny_bert, "-o", tmp_path / "m", *flags)
    assert r.exit_code == 2 and message in r.stderr
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.partial").exists()


def test_bad_input_exit_2_names_file_line_field(tiny_bert, tmp_path, runner):
    corpus_file = _write_jsonl(tmp_path / "corpus.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    groups = _groups(4)
    groups[2]["negative_document_ids"] = ["d20", "nope"]
    groups_file = _write_jsonl(tmp_path / "groups.jsonl", groups)
    r = runner("train", groups_file, "--corpus", corpus_file, "--model", tiny_bert, "-o", tmp_path / "m")
    assert r.exit_code == 2
    assert f"{groups_file}:3: field 'negative_document_ids': doc 'nope' is not in the corpus" in r.stderr
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.partial").exists()
    (tmp_path / "bad.jsonl").write_text('{"query_id": "q1", "query_text": "x", "positive_document_ids": [1.5]}\n')
    r = runner("train", tmp_path / "bad.jsonl", "--corpus", corpus_file, "--model", tiny_bert, "-o", tmp_path / "m")
    assert r.exit_code == 2 and "bad.jsonl:1: field 'positive_document_ids'" in r.stderr


def test_deepspeed_config_generation_and_user_json(tmp_path):
    cfg = TrainConfig(batch_size=8, zero_stage=2, dtype="bf16", max_grad_norm=0.5)
    ds = deepspeed_config(cfg, world=4)
    assert ds["train_batch_size"] == 32 and ds["train_micro_batch_size_per_gpu"] == 8
    assert ds["zero_optimization"]["stage"] == 2 and ds["bf16"]["enabled"] and ds["gradient_clipping"] == 0.5
    user = tmp_path / "ds.json"
    user.write_text(json.dumps({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"}))
    cfg = TrainConfig(batch_size=2, deepspeed=str(user))
    assert deepspeed_config(cfg, 1)["train_micro_batch_size_per_gpu"] == 2 and cfg.ds_stage() == 3
    user.write_text(json.dumps({"optimizer": {"type": "Adam"}}))
    with pytest.raises(ValueError, match="remove 'optimizer'"):
        deepspeed_config(cfg, 1)
    user.write_text(json.dumps({"gradient_accumulation_steps": 4}))
    with pytest.raises(ValueError, match="adds no in-batch negatives"):
        deepspeed_config(cfg, 1)


# ---------------------------------------------------------------- DeepSpeed, several processes


def _torchrun(nproc, args, tmp_path, port, extensions=None):
    extensions = extensions or os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(port),
           "-m", "retrctl", "train", *map(str, args)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _files(tmp_path, n_groups=40):
    corpus_file = _write_jsonl(tmp_path / "corpus.jsonl", [{"docid": k, **v} for k, v in _corpus(80).items()])
    groups = []
    rng = np.random.default_rng(5)
    for i in range(n_groups):
        negs = [f"d{j}" for j in rng.choice(range(40, 79), 6, replace=False)]
        groups.append({"query_id": f"q{i}", "query_text": f"about {WORDS[i % 16]} {WORDS[(i * 7) % 16]}",
                       "positive_document_ids": [f"d{i}"], "negative_document_ids": negs})
    for g in groups[::2]:  # a second positive shared by half the queries: false negatives in most batches
        g["positive_document_ids"].append("d79")
    return corpus_file, _write_jsonl(tmp_path / "groups.jsonl", groups)


def test_zero2_two_processes_match_one_process_with_double_batch(no_dropout_bert, tmp_path):
    """ZeRO-2, 2 gloo processes × batch 2 == 1 process × batch 4 (same seed): 20 steps within 1e-3, and nothing
    compiled on the way (DeepSpeed's shared-memory all-reduce serves inference only)."""
    corpus_file, groups_file = _files(tmp_path)
    common = [groups_file, "--corpus", corpus_file, "--model", no_dropout_bert, "--train-group-size", 4, "--lr", 1e-3,
              "--max-steps", 20, "--query-max-len", 16, "--passage-max-len", 24, "--logging-steps", 5]
    one = train(str(groups_file), corpus=str(corpus_file), output=tmp_path / "one", model=str(no_dropout_bert),
                train_group_size=4, lr=1e-3, max_steps=20, query_max_len=16, passage_max_len=24, batch_size=4)
    extensions = tmp_path / "torch_extensions"
    r = _torchrun(2, [*common, "--train-batch-size", 2, "--zero-stage", 2, "-o", tmp_path / "two"], tmp_path, _free_port(),
                  extensions)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == ""
    assert not extensions.exists() or not list(extensions.iterdir())
    a, b = _losses(one), _losses(tmp_path / "two")
    assert len(a) == len(b) == 20
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-3
    masked = [[json.loads(line)["masked"] for line in (d / "metrics.jsonl").read_text().splitlines()] for d in (one, tmp_path / "two")]
    assert masked[0] == masked[1] and sum(masked[0]) > 0  # the same candidates masked for the same queries
    va = Encoder.load(one, device="cpu").encode(["cat purr"])
    vb = Encoder.load(tmp_path / "two", device="cpu").encode(["cat purr"])
    assert np.allclose(va, vb, atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("grad_cache", [False, True])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_matrix(no_dropout_bert, tmp_path, zero, grad_cache, lora):
    """ZeRO {0,1,2,3} × GradCache × LoRA on 2 processes: the same losses as one plain process (all supported)."""
    corpus_file, groups_file = _files(tmp_path, 24)
    extra = (["--grad-cache", "--chunk-size", 3] if grad_cache else [])
    extra += ["--lora-r", 4, "--lora-dropout", 0, "--lora-check-steps", 2] if lora else []
    common = [groups_file, "--corpus", corpus_file, "--model", no_dropout_bert, "--train-group-size", 3, "--lr", 1e-3,
              "--max-steps", 6, "--query-max-len", 16, "--passage-max-len", 24, *extra]
    r = _torchrun(2, [*common, "--train-batch-size", 2, "--zero-stage", zero, "-o", tmp_path / "two"], tmp_path, _free_port())
    assert r.returncode == 0, r.stderr[-3000:]
    settings = {"grad_cache": grad_cache, "chunk_size": 3, "lora_r": 4 if lora else 0, "lora_dropout": 0.0, "lora_check_steps": 2}
    one = train(str(groups_file), corpus=str(corpus_file), output=tmp_path / "one", model=str(no_dropout_bert), train_group_size=3,
                lr=1e-3, max_steps=6, query_max_len=16, passage_max_len=24, batch_size=4, **settings)
    assert np.allclose(_losses(one), _losses(tmp_path / "two"), atol=1e-3)


@pytest.mark.slow
def test_deepspeed_resume_after_kill(no_dropout_bert, tmp_path):
    """ZeRO-2 on 2 processes: the launcher and its workers killed (SIGKILL) once the step-4 checkpoint exists, then
    --resume, equals an uninterrupted run (and the resume really started from the checkpoint)."""
    import signal
    import time

    import psutil

    from retrctl.train.checkpoint import checkpoints

    corpus_file, groups_file = _files(tmp_path)
    common = [groups_file, "--corpus", corpus_file, "--model", no_dropout_bert, "--train-group-size", 3, "--lr", 1e-3,
              "--max-steps", 8, "--save-steps", 2, "--train-batch-size", 2, "--zero-stage", 2, "--query-max-len", 16,
              "--passage-max-len", 24]
    r = _torchrun(2, [*common, "-o", tmp_path / "a"], tmp_path, _free_port())
    assert r.returncode == 0, r.stderr[-3000:]
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions")),
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
           "-m", "retrctl", "train", *map(str, common), "-o", str(tmp_path / "b")]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stderr=subprocess.DEVNULL)
    ckpts = tmp_path / "b.partial" / "checkpoints"
    while proc.poll() is None and not any(int(p.name[5:]) >= 4 for p in checkpoints(ckpts)):
        time.sleep(0.01)
    workers = psutil.Process(proc.pid).children(recursive=True)  # each in a session of its own (torch elastic)
    for p in [*workers, psutil.Process(proc.pid)]:
        p.send_signal(signal.SIGKILL)
    proc.wait()
    psutil.wait_procs(workers, timeout=30)
    assert not (tmp_path / "b").exists(), "finished before the kill"
    r = _torchrun(2, [*common, "--resume", "-o", tmp_path / "b"], tmp_path, _free_port())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stderr
    assert [json.loads(line)["step"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()] == list(range(1, 9))
    assert np.allclose(_losses(tmp_path / "a"), _losses(tmp_path / "b"), atol=1e-5)


def test_kill_9_then_resume(tiny_bert, tmp_path, runner):
    """A real SIGKILL at a random point after a checkpoint exists (mid-step, mid-checkpoint or mid-metrics), then
    --resume: the saved weights equal an uninterrupted run's, so do the losses, and metrics.jsonl has exactly one
    line per step. The point is drawn anew each run and printed on failure; RETRCTL_KILL_SEED=N replays it."""
    import random
    import signal
    import time

    from safetensors.torch import load_file

    from retrctl.train.checkpoint import checkpoints

    seed = int(os.environ.get("RETRCTL_KILL_SEED") or random.SystemRandom().randrange(10**6))
    rng = random.Random(seed)
    after, delay = rng.randint(1, 6), rng.uniform(0.0, 0.2)  # kill once step-`after` is saved, `delay` s later
    steps = 12
    corpus_file, groups_file = _files(tmp_path)
    settings = {"train_group_size": 3, "batch_size": 4, "max_steps": steps, "save_steps": 1, "query_max_len": 16,
                "passage_max_len": 24}
    whole = train(str(groups_file), corpus=str(corpus_file), output=tmp_path / "a", model=str(tiny_bert), **settings)
    args = ["train", groups_file, "--corpus", corpus_file, "--model", tiny_bert, "-q", "-o", tmp_path / "b"]
    for k, v in settings.items():
        args += [f"--{k.replace('_', '-')}", v]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "retrctl", *map(str, args)], env=env)
    ckpts = tmp_path / "b.partial" / "checkpoints"
    while proc.poll() is None and not any(int(p.name[5:]) >= after for p in checkpoints(ckpts)):
        time.sleep(0.005)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    where = f"(kill seed {seed}: after step-{after} + {delay:.3f} s)"
    assert not (tmp_path / "b").exists(), f"finished before the kill {where}"
    r = runner(*args, "--resume")
    assert r.exit_code == 0, f"{where} {r.stderr}"
    assert [json.loads(line)["step"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()] == \
        list(range(1, steps + 1)), where
    assert np.allclose(_losses(whole), _losses(tmp_path / "b"), atol=1e-5), where
    wa, wb = load_file(whole / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) <= 1e-6, where
    assert not (tmp_path / "b.partial").exists()


@pytest.mark.real
@pytest.mark.slow
def test_minilm_few_steps_changes_embeddings_and_loads_in_st(tmp_path):
    from sentence_transformers import SentenceTransformer

    out = train(_groups(8), corpus=_corpus(), output=tmp_path / "m", model="minilm", batch_size=4, train_group_size=2,
                query_max_len=16, passage_max_len=32, max_steps=2, lr=1e-4)
    texts = ["cat purr water", "memory safety in rust"]
    st = SentenceTransformer(str(out), device="cpu")
    assert np.allclose(Encoder.load(out, device="cpu").encode(texts), st.encode(texts), atol=1e-5)
    assert not np.allclose(Encoder.load("minilm", device="cpu").encode(texts), st.encode(texts), atol=1e-4)


def _scaled_copy_groups(encoder_dir, scale):
    """Groups whose teacher scores are ``scale`` × the untrained student's own similarities (short texts: nothing
    truncated), and a corpus for them."""
    corpus = {f"d{i}": {"title": "", "text": " ".join(WORDS[(i + k) % len(WORDS)] for k in range(4))} for i in range(12)}
    groups = [{"query_id": f"q{i}", "query_text": corpus[f"d{i}"]["text"], "positive_document_ids": [f"d{i}"],
               "negative_document_ids": [f"d{(i + 3) % 12}", f"d{(i + 7) % 12}"]} for i in range(8)]
    enc = Encoder.load(encoder_dir, device="cpu")
    for g in groups:
        q = enc.encode([g["query_text"]], kind="query")
        p = enc.encode([corpus[d]["text"] for d in g["positive_document_ids"] + g["negative_document_ids"]], kind="passage")
        s = (p / np.linalg.norm(p, axis=1, keepdims=True)) @ (q[0] / np.linalg.norm(q[0]))
        g["positive_scores"], g["negative_scores"] = [float(scale * s[0])], [float(scale * x) for x in s[1:]]
    return groups, corpus


@pytest.mark.parametrize("calibrate", [True, False])
def test_calibrated_teacher_puts_a_scaled_copy_of_the_student_on_its_scale(no_dropout_bert, tmp_path, calibrate):
    # a teacher scoring 7 × the student's cosines: calibrated (temperature × 7), its margins are the student's own,
    # so the first step's MarginMSE is zero up to float32 rounding of logits near 1/temperature; not calibrated, it
    # asks for margins 7 times larger
    groups, corpus = _scaled_copy_groups(no_dropout_bert, 7.0)
    out = train(groups, corpus=corpus, output=tmp_path / "m", model=str(no_dropout_bert), distill_weight=1.0,
                distill_loss="margin-mse", contrastive_weight=0.0, teacher_temperature=0.05, temperature=0.05,
                calibrate_teacher=calibrate, max_steps=1, **{**FAST, "lr": 1e-4})
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["margin_mse"]
    assert (first < 1e-6) if calibrate else (first > 1.0)


def test_calibrating_the_teacher_needs_distillation(tiny_bert, tmp_path):
    from retrctl.errors import UsageError

    with pytest.raises(UsageError, match="--calibrate-teacher"):
        train(_groups(8), corpus=_corpus(), output=tmp_path / "m", model=str(tiny_bert), calibrate_teacher=True,
              max_steps=1, **FAST)
