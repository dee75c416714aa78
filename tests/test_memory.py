"""memory.py: sizes, what is available (fake /proc/meminfo and cgroup files), the step plan (plain / GradCache /
refusal) on a tiny model with --max-memory, inference batch sizing, and time-based checkpoints that resume."""

import json

import numpy as np
import pytest
from trainkit import FAST, WORDS
from trainkit import corpus as _corpus
from trainkit import groups as _groups
from trainkit import losses as _losses
from trainkit import write_jsonl as _write_jsonl

from retrctl import memory
from retrctl.memory import GB, Budget, DoesNotFit, StepCost, parse_size, plan_step
from retrctl.train.config import TrainConfig
from stages.train import train

HELD = 2 * GB  # what the process "holds" in these tests: RSS is the test runner's, so it is pinned


@pytest.fixture
def machine(monkeypatch):
    """A machine with 100 GB free (no cgroup limit) and a process holding HELD bytes."""
    monkeypatch.setattr(memory, "meminfo_available", lambda path="/proc/meminfo": 100 * GB)
    monkeypatch.setattr(memory, "cgroup_available", lambda *a, **k: None)
    monkeypatch.setattr(memory, "rss", lambda: HELD)
    monkeypatch.delenv("RETRCTL_MAX_MEMORY", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_SIZE", raising=False)


# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize("text,n", [("12GB", 12 * 10**9), ("12GiB", 12 * 2**30), ("12G", 12 * 2**30), ("500MB", 5 * 10**8),
                                    ("1.5tb", 15 * 10**11), (" 64 MiB ", 64 * 2**20), ("2Gi", 2 * 2**30)])
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["lots", "12", "12XB", "0GB", "0", "-1GB", "GB", ""])
def test_parse_size_refuses_junk_and_zero(text):
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize("value", ["lots", "0GB", "12"])
def test_max_memory_flag_junk_or_zero_exits_2_naming_the_flag(tiny_bert, tmp_path, runner, value):
    r = runner("train", tmp_path / "g.jsonl", "--model", tiny_bert, "-o", tmp_path / "m", "--max-memory", value)
    assert r.exit_code == 2 and "--max-memory" in r.stderr
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.partial").exists()


def test_old_train_config_booleans_still_read(tmp_path):
    for old, new in ((True, "on"), (False, "off")):
        (tmp_path / "c.json").write_text(json.dumps({"grad_cache": old, "max_memory": "12GB"}))
        cfg = TrainConfig.from_json(tmp_path / "c.json")
        assert cfg.grad_cache == new and cfg.max_memory == 12 * 10**9
    assert TrainConfig().grad_cache == "auto"


# ---------------------------------------------------------------- what is available


def test_meminfo_reader(tmp_path):
    (tmp_path / "meminfo").write_text("MemTotal:       24684084 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\n")
    assert memory.meminfo_available(tmp_path / "meminfo") == 20000000 * 1024
    (tmp_path / "old").write_text("MemTotal: 1 kB\n")
    assert memory.meminfo_available(tmp_path / "old") is None


def test_cgroup_v2_reader_takes_the_tightest_ancestor_and_counts_cache_as_free(tmp_path):
    root = tmp_path / "cg"
    leaf, parent = root / "a" / "b", root / "a"
    leaf.mkdir(parents=True)
    (tmp_path / "self").write_text("0::/a/b\n")
    (leaf / "memory.max").write_text("10000000\n")
    (leaf / "memory.current").write_text("4000000\n")
    (leaf / "memory.stat").write_text("anon 3000000\ninactive_file 1000000\n")
    (parent / "memory.max").write_text("max\n")
    assert memory.cgroup_available(root, tmp_path / "self") == 10000000 - 3000000
    (parent / "memory.max").write_text("5000000\n")
    (parent / "memory.current").write_text("4500000\n")
    assert memory.cgroup_available(root, tmp_path / "self") == 500000
    (leaf / "memory.max").write_text("max\n")
    (parent / "memory.max").write_text("max\n")
    assert memory.cgroup_available(root, tmp_path / "self") is None


def test_cgroup_v1_reader(tmp_path):
    v1 = tmp_path / "cg" / "memory"
    v1.mkdir(parents=True)
    (tmp_path / "self").write_text("4:memory:/job\n0::/\n")
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert memory.cgroup_available(tmp_path / "cg", tmp_path / "self") is None
    (v1 / "job").mkdir()
    (v1 / "job" / "memory.limit_in_bytes").write_text(f"{2 * GB}\n")
    (v1 / "job" / "memory.usage_in_bytes").write_text(f"{GB // 2}\n")
    (v1 / "job" / "memory.stat").write_text(f"cache 5\ntotal_inactive_file {GB // 10}\n")
    assert memory.cgroup_available(tmp_path / "cg", tmp_path / "self") == 2 * GB - (GB // 2 - GB // 10)


def test_available_takes_the_least_a_per_process_share_and_the_cap(machine, monkeypatch):
    monkeypatch.setattr(memory, "cgroup_available", lambda *a, **k: 30 * GB)
    b = memory.available("cpu")
    assert (b.held, b.free, b.source) == (HELD, 30 * GB, "cgroup limit") and b.usable == int(30 * GB * memory.MARGIN)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun: four processes share the host's RAM
    assert memory.available("cpu").free == 30 * GB // 4
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setenv("LOCAL_SIZE", "2")  # the deepspeed launcher's name for it
    assert memory.available("cpu").free == 30 * GB // 2
    monkeypatch.delenv("LOCAL_SIZE")
    b = memory.available("cpu", max_memory=5 * GB)
    assert (b.free, b.source, b.usable, b.total) == (3 * GB, "--max-memory", 3 * GB, 5 * GB)
    monkeypatch.setenv("RETRCTL_MAX_MEMORY", "4GB")
    assert memory.available("cpu").total == 4 * GB


# ---------------------------------------------------------------- the plan


COST = StepCost(state=GB, per_query=10**8, per_passage=10**8, queries=32, passages=64)


def _budget(free, source="MemAvailable"):
    return Budget(held=HELD, free=free, source=source)


def test_plan_plain_when_it_fits_gradcache_largest_chunk_otherwise():
    plain = COST.plain()
    p = plan_step(COST, mode="auto", chunk_size=32, budget=_budget(plain * 2), batch_size=32, group_size=2)
    assert not p.grad_cache and p.need == plain and "plain steps" in p.line()
    p = plan_step(COST, mode="auto", chunk_size=32, budget=_budget(COST.cached(20), "--max-memory"), batch_size=32, group_size=2)
    assert p.grad_cache and p.chunk_size == 20 and p.need <= COST.cached(20) < COST.cached(21)
    assert "GradCache, chunk 20" in p.line() and p.record()["chunk_size"] == 20
    p = plan_step(COST, mode="auto", chunk_size=16, budget=_budget(COST.cached(20), "--max-memory"), batch_size=32, group_size=2)
    assert p.grad_cache and p.chunk_size == 16  # --chunk-size is the most it uses
    p = plan_step(COST, mode="on", chunk_size=8, budget=_budget(plain * 2), batch_size=32, group_size=2)
    assert p.grad_cache and p.chunk_size == 8


def test_plan_refuses_with_the_smallest_setting_that_would_fit():
    with pytest.raises(DoesNotFit, match="drop --grad-cache off"):
        plan_step(COST, mode="off", chunk_size=32, budget=_budget(COST.cached(4), "--max-memory"), batch_size=32, group_size=2)
    with pytest.raises(DoesNotFit, match="--chunk-size 1 needs"):
        plan_step(COST, mode="auto", chunk_size=32, budget=_budget(COST.cached(1) - 1, "--max-memory"), batch_size=32, group_size=2)
    with pytest.raises(DoesNotFit, match="gradients and optimizer state do not fit"):
        plan_step(COST, mode="auto", chunk_size=32, budget=_budget(GB // 2, "--max-memory"), batch_size=32, group_size=2)


def test_optimizer_state_is_partitioned_under_zero():
    assert memory.optimizer_state(1000) == 12000
    assert memory.optimizer_state(1000, zero_stage=1, world=4) == 4000 + 2000
    assert memory.optimizer_state(1000, zero_stage=2, world=4) == 1000 + 2000


def test_small_max_memory_switches_to_gradcache_with_the_same_losses(no_dropout_bert, tmp_path, machine):
    kw = {"corpus": _corpus(), "model": str(no_dropout_bert), "max_steps": 3, **FAST}
    plain = train(_groups(), output=tmp_path / "a", **kw)
    rec = json.loads((plain / "train_config.json").read_text())["plan"]
    assert rec["grad_cache"] is False and rec["reason"] == "fits with a margin" and rec["per_passage_bytes"] > 0
    cost = StepCost(state=rec["state_bytes"], per_query=rec["per_query_bytes"], per_passage=rec["per_passage_bytes"],
                    queries=4, passages=12, embeddings=3 * 4 * 16 * 32)
    assert cost.plain() + HELD == rec["plain_peak_bytes"]
    cap = HELD + cost.cached(2)  # room for a chunk of 2 texts, not 3
    cached = train(_groups(), output=tmp_path / "b", max_memory=cap, **kw)
    rec = json.loads((cached / "train_config.json").read_text())["plan"]
    assert rec["grad_cache"] is True and rec["chunk_size"] == 2 and rec["source"] == "--max-memory"
    assert rec["peak_bytes"] <= cap
    assert np.allclose(_losses(plain), _losses(cached), atol=1e-5)


def test_impossible_max_memory_exits_2_with_the_message(no_dropout_bert, tmp_path, runner, machine):
    corpus = _write_jsonl(tmp_path / "corpus.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    groups = _write_jsonl(tmp_path / "groups.jsonl", _groups())
    cap = HELD + 1024 * 1024  # 1 MiB above what the process holds
    r = runner("train", groups, "--corpus", corpus, "--model", no_dropout_bert, "-o", tmp_path / "m", "--max-memory", f"{cap}B",
               "--train-batch-size", 4, "--train-group-size", 3)
    assert r.exit_code == 2, r.stderr
    assert "one training step needs" in r.stderr and "do not fit" in r.stderr
    assert len([ln for ln in r.stderr.splitlines() if "Error" in ln]) == 1
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.partial").exists()


def test_the_plan_is_said_on_stderr(no_dropout_bert, tmp_path, runner, machine):
    corpus = _write_jsonl(tmp_path / "corpus.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    groups = _write_jsonl(tmp_path / "groups.jsonl", _groups(8))
    r = runner("train", groups, "--corpus", corpus, "--model", no_dropout_bert, "-o", tmp_path / "m", "--train-batch-size", 4,
               "--train-group-size", 2, "--passage-max-len", 24, "--max-steps", 1, "--grad-cache", "--chunk-size", 3)
    assert r.exit_code == 0, r.stderr
    line = next(ln for ln in r.stderr.splitlines() if "one step needs" in ln)
    assert line.startswith("retrctl.train: one step needs ~") and "available (MemAvailable): GradCache, chunk 3" in line


# ---------------------------------------------------------------- inference batches


def test_encode_batch_shrinks_to_what_fits_and_gives_the_same_vectors(tiny_bert, machine, monkeypatch):
    from retrctl.models import Encoder

    enc = Encoder.load(tiny_bert, device="cpu", passage_max_len=24)
    texts = [" ".join(WORDS[: 2 + i % 10]) for i in range(20)]
    full = enc.encode(texts, batch_size=32)
    per_text = memory.inference_per_text(enc.model.config, 24)
    room = 3 * per_text + enc.weight_bytes()  # three texts and the weights
    monkeypatch.setattr(memory, "meminfo_available", lambda path="/proc/meminfo": int(room / memory.MARGIN) + 1)
    sizes = []
    orig = enc.forward
    monkeypatch.setattr(enc, "forward", lambda batch: sizes.append(batch["input_ids"].size(0)) or orig(batch))
    assert np.allclose(enc.encode(texts, batch_size=32), full, atol=1e-6)
    assert max(sizes) == 3 and sum(sizes) == 20
    assert memory.encode_batch(10**12, 32, memory.available()) == 1  # never below one


def test_generation_batch_shrinks_to_what_fits(tiny_llama, machine, monkeypatch):
    from retrctl.llm import load_llm

    llm = load_llm(tiny_llama, device="cpu", batch_size=8)
    prompts = [f"write about {w}" for w in WORDS[:6]]
    full = llm.generate(prompts, max_new_tokens=4)
    width = max(len(llm._ids(llm.render(p))) for p in prompts)
    per_row = memory.generation_per_row(llm.model.config, width, 4)
    monkeypatch.setattr(memory, "meminfo_available", lambda path="/proc/meminfo": int(2 * per_row / memory.MARGIN) + 1)
    batches = [len(b) for b in llm._batches([llm._ids(llm.render(p)) for p in prompts], 4)]
    assert batches == [2, 2, 2]
    assert llm.generate(prompts, max_new_tokens=4) == full


# ---------------------------------------------------------------- time-based checkpoints


def test_time_based_checkpoints_resume_to_the_same_losses(tiny_bert, tmp_path):
    """--save-minutes alone (no --save-steps) leaves checkpoints a killed run resumes from."""
    corpus = _write_jsonl(tmp_path / "corpus.jsonl", [{"docid": k, **v} for k, v in _corpus().items()])
    groups = _write_jsonl(tmp_path / "groups.jsonl", _groups())
    kw = {"model": str(tiny_bert), "max_steps": 8, "warmup_steps": 2, "save_steps": 0, **FAST}
    whole = train(str(groups), corpus=str(corpus), output=tmp_path / "a", save_minutes=0, **kw)
    seen = []

    def crash(step, metrics):
        seen.append(sorted(p.name for p in (tmp_path / "b.partial" / "checkpoints").glob("step-*")))
        if step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(str(groups), corpus=str(corpus), output=tmp_path / "b", save_minutes=1e-9, on_step=crash, **kw)
    assert seen[-1] == ["step-4", "step-5"]  # a checkpoint after every step here, the last two kept
    resumed = train(str(groups), corpus=str(corpus), output=tmp_path / "b", save_minutes=1e-9, resume=True, **kw)
    assert np.allclose(_losses(whole), _losses(resumed), atol=1e-5)


def test_no_time_based_checkpoint_before_the_interval(tiny_bert, tmp_path):
    seen = []
    train(_groups(8), corpus=_corpus(), output=tmp_path / "m", model=str(tiny_bert), max_steps=3, save_minutes=60,
          on_step=lambda s, m: seen.append(list((tmp_path / "m.partial" / "checkpoints").glob("step-*"))), **FAST)
    assert seen == [[], [], []]
