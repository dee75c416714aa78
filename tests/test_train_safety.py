"""train loses no data and runs no code: the -o refusals (a user's directory, a file, an existing model
without --overwrite), <output>.partial continued only with --resume, a resume refused when its data or settings
differ from the checkpoint's, and a pickle planted as each checkpoint file a resume reads (plain torch and
DeepSpeed) never runs. Every refusal leaves the user's files byte for byte as they were."""

import gzip
import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from trainkit import FAST
from trainkit import corpus as _corpus
from trainkit import groups as _groups
from trainkit import losses as _losses
from trainkit import write_jsonl as _jsonl

from retrctl.models import Encoder
from retrctl.records import RecordError
from retrctl.train import engines
from retrctl.train import loop as trainer
from stages.train import train

RUN = {"max_steps": 6, "save_steps": 2, "warmup_steps": 1, **FAST}


def _flags(settings: dict) -> list:
    out = []
    for k, v in settings.items():
        out += [f"--{k.replace('_', '-')}", v]
    return out


def _snapshot(d: Path) -> dict:
    """Every file and directory under d with its bytes: what a refusal must leave exactly as it was."""
    return {str(p.relative_to(d)): p.read_bytes() if p.is_file() else None for p in sorted(Path(d).rglob("*"))}


class Payload:
    """Unpickling this creates ``marker``: proof that loading a file ran code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


def _plant(path: Path, marker: Path, fmt: str) -> None:
    if fmt == "torch":  # a torch zip file whose pickle runs code, as torch.save writes it
        torch.save({"model": Payload(marker)}, path)
    else:  # a bare pickle
        path.write_bytes(pickle.dumps(Payload(marker)))


@pytest.fixture
def files(tmp_path):
    return (_jsonl(tmp_path / "corpus.jsonl", [{"docid": k, **v} for k, v in _corpus().items()]),
            _jsonl(tmp_path / "groups.jsonl", _groups()))


def _crash(at):
    def on_step(step, metrics):
        if step == at:
            raise KeyboardInterrupt

    return on_step


def _crashed(model, files, out, at=3, **settings):
    """A run killed at step ``at`` (after its step-2 checkpoint): ``<out>.partial`` holds checkpoints."""
    corpus, groups = files
    with pytest.raises(KeyboardInterrupt):
        train(str(groups), corpus=str(corpus), output=out, model=str(model), on_step=_crash(at), **{**RUN, **settings})
    assert (out.with_name(out.name + ".partial") / "checkpoints" / "step-2").is_dir()


@pytest.fixture(scope="module")
def crashed(tiny_bert, tmp_path_factory):
    """One crashed plain-torch run, copied by each test that plants or changes something."""
    root = tmp_path_factory.mktemp("crashed")
    files = (_jsonl(root / "corpus.jsonl", [{"docid": k, **v} for k, v in _corpus().items()]),
             _jsonl(root / "groups.jsonl", _groups()))
    _crashed(tiny_bert, files, root / "m")
    return root


def _copy(crashed: Path, tmp_path: Path):
    shutil.copytree(crashed / "m.partial", tmp_path / "m.partial")
    for name in ("corpus.jsonl", "groups.jsonl"):
        shutil.copy(crashed / name, tmp_path / name)
    return tmp_path / "corpus.jsonl", tmp_path / "groups.jsonl"


# ---------------------------------------------------------------- -o


@pytest.mark.parametrize("flags", [[], ["--overwrite"], ["--resume"], ["--overwrite", "--resume"]])
def test_o_holding_user_files_is_refused_even_with_overwrite(tmp_path, runner, flags):
    out = tmp_path / "project"
    (out / "src").mkdir(parents=True)
    (out / "notes.txt").write_text("my notes\n")
    (out / "src" / "main.py").write_text("print('hi')\n")
    (out / "retrctl.json").write_text("{}")  # one retrctl-looking file does not make it a model
    before = _snapshot(out)
    # the model and groups do not exist: the refusal must come before either is opened
    r = runner("train", tmp_path / "none.jsonl", "--model", tmp_path / "no-model", "-o", out, *flags)
    assert r.exit_code == 2, r.stderr
    assert f"{out}: is not empty and not a retrctl model (notes.txt, src/)" in r.stderr
    assert "even with --overwrite" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert _snapshot(out) == before and not (tmp_path / "project.partial").exists()


def test_o_holding_a_plain_hugging_face_model_is_refused(tiny_bert, tmp_path, runner):
    """A model directory retrctl did not write (no retrctl.json) is the user's, not an output to replace."""
    out = tmp_path / "hf"
    shutil.copytree(tiny_bert, out)
    before = _snapshot(out)
    r = runner("train", tmp_path / "none.jsonl", "--model", tiny_bert, "-o", out, "--overwrite")
    assert r.exit_code == 2 and "not a retrctl model (no retrctl.json)" in r.stderr
    assert _snapshot(out) == before and not (tmp_path / "hf.partial").exists()


def test_o_that_is_a_file_is_refused(files, tmp_path, runner):
    corpus, groups = files
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    r = runner("train", groups, "--corpus", corpus, "--model", tmp_path / "no-model", "-o", notes, "--overwrite")
    assert r.exit_code == 2 and f"{notes}: is a file: -o needs a directory here" in r.stderr
    assert notes.read_text() == "mine\n" and not (tmp_path / "notes.txt.partial").exists()
    with pytest.raises(RecordError, match="exists and is not a directory"):  # the trainer's own check, for API callers
        trainer.check_output(notes, trainer.TrainConfig(overwrite=True))
    before = groups.read_bytes()  # -o onto the groups file itself: the shared output-onto-input check
    r = runner("train", groups, "--corpus", corpus, "--model", tmp_path / "no-model", "-o", groups, "--overwrite")
    assert r.exit_code == 2 and "the output is the input" in r.stderr
    assert groups.read_bytes() == before and not (tmp_path / "groups.jsonl.partial").exists()


@pytest.mark.parametrize("out", ["/", ".", ".."])
def test_o_without_a_directory_name_is_refused(tmp_path, runner, out):
    r = runner("train", tmp_path / "none.jsonl", "--model", tmp_path / "no-model", "-o", out, "--overwrite")
    assert r.exit_code == 2 and f"{out}: give -o a new directory's name" in r.stderr


def test_an_existing_model_is_replaced_only_with_overwrite(tiny_bert, files, tmp_path, runner):
    corpus, groups = files
    out = train(str(groups), corpus=str(corpus), output=tmp_path / "m", model=str(tiny_bert), max_steps=2, **FAST)
    before = _snapshot(out)
    args = ["train", groups, "--corpus", corpus, "--model", tiny_bert, "-o", out, "--max-steps", 2, "--seed", 7, *_flags(FAST)]
    r = runner(*args)
    assert r.exit_code == 2 and f"{out}: is a retrctl model already: give --overwrite to replace it" in r.stderr
    assert _snapshot(out) == before
    with pytest.raises(RecordError, match="give --overwrite"):
        train(str(groups), corpus=str(corpus), output=out, model=str(tiny_bert), max_steps=2, **FAST)
    assert _snapshot(out) == before
    r = runner(*args, "--overwrite")
    assert r.exit_code == 0, r.stderr
    assert _snapshot(out) != before and (out / "retrctl.json").exists()
    assert json.loads((out / "train_config.json").read_text())["seed"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "groups.jsonl", "m"]  # no .partial, no .old


def test_an_empty_o_directory_is_used(tiny_bert, files, tmp_path):
    corpus, groups = files
    (tmp_path / "m").mkdir()
    out = train(str(groups), corpus=str(corpus), output=tmp_path / "m", model=str(tiny_bert), max_steps=2, **FAST)
    assert (out / "retrctl.json").exists()


# ---------------------------------------------------------------- <output>.partial


def test_partial_with_checkpoints_needs_resume_or_overwrite(crashed, tiny_bert, tmp_path, runner):
    corpus, groups = _copy(crashed, tmp_path)
    partial = tmp_path / "m.partial"
    before = _snapshot(partial)
    args = ["train", groups, "--corpus", corpus, "--model", tiny_bert, "-o", tmp_path / "m", *_flags(RUN)]
    r = runner(*args)
    assert r.exit_code == 2
    assert f"{partial}: holds checkpoints of an earlier run (newest step-2): give --resume to continue it, or --overwrite" in r.stderr
    assert _snapshot(partial) == before
    r = runner(*args, "--overwrite")  # start over: the checkpoints are discarded, not resumed
    assert r.exit_code == 0, r.stderr
    assert "resumed from" not in r.stderr and not partial.exists()
    assert [json.loads(line)["step"] for line in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()] == list(range(1, 7))


@pytest.mark.parametrize("flags", [["--resume"], ["--overwrite"], ["--resume", "--overwrite"]])
def test_partial_holding_user_files_is_refused(crashed, tiny_bert, tmp_path, runner, flags):
    corpus, groups = _copy(crashed, tmp_path)
    partial = tmp_path / "m.partial"
    (partial / "draft.md").write_text("mine\n")
    (partial / "checkpoints" / "best").mkdir()
    before = _snapshot(partial)
    r = runner("train", groups, "--corpus", corpus, "--model", tmp_path / "no-model", "-o", tmp_path / "m", *flags)
    assert r.exit_code == 2
    assert f"{partial}: holds files retrctl did not write (checkpoints/best, draft.md)" in r.stderr
    assert _snapshot(partial) == before and not (tmp_path / "m").exists()


def test_partial_scratch_without_checkpoints_is_started_afresh(tiny_bert, files, tmp_path):
    """A run killed before its first checkpoint left only metrics: nothing to resume, nothing to keep."""
    corpus, groups = files
    partial = tmp_path / "m.partial"
    (partial / "checkpoints" / "step-1.tmp").mkdir(parents=True)
    (partial / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 9.0}) + "\n")
    out = train(str(groups), corpus=str(corpus), output=tmp_path / "m", model=str(tiny_bert), max_steps=2, **FAST)
    assert len(_losses(out)) == 2 and 9.0 not in _losses(out) and not partial.exists()


def test_temporary_files_of_a_killed_write_are_scratch_in_a_partial_only(tmp_path):
    """A kill inside records.atomic_path leaves its temporary file (metrics.jsonl's rewrite, a teacher chunk): a
    resume takes it for scratch, not for a user's file; the names an earlier retrctl used stay scratch too."""
    from retrctl import records
    from retrctl.train.checkpoint import foreign_files

    partial = tmp_path / "m.partial"
    (partial / "teacher").mkdir(parents=True)
    left = []
    for target, suffix in [(partial / "metrics.jsonl", ""), (partial / "teacher" / "passage-00000.npy", ".npy")]:
        with records.atomic_path(target, suffix=suffix) as tmp:  # the names atomic_path gives its temporary files
            left.append(Path(tmp))
        target.unlink()
    for p in [*left, partial / "metrics.jsonl.tmp", partial / "teacher" / "query-00001.tmp.npy",  # as a kill leaves them
              partial / "notes.tmp", partial / "teacher" / ".mine.abc.tmp"]:  # and a user's
        p.write_text("x")
    assert foreign_files(partial, partial=True) == ["notes.tmp", "teacher/.mine.abc.tmp"]
    assert left[0].name in foreign_files(partial)  # a finished model dir holds no scratch


# ---------------------------------------------------------------- resume consistency


def test_resume_refuses_other_settings_and_allows_reporting_ones(crashed, tiny_bert, tmp_path, runner, monkeypatch):
    corpus, groups = _copy(crashed, tmp_path)
    partial = tmp_path / "m.partial"
    before = _snapshot(partial)
    with monkeypatch.context() as m:  # refused before any model is loaded
        m.setattr(trainer, "build_encoder", lambda *a, **k: pytest.fail("the model was loaded"))
        with pytest.raises(RecordError, match=r"differs from the checkpoint in lr \(checkpoint 0.001, now 0.002\)"):
            train(str(groups), corpus=str(corpus), output=tmp_path / "m", model=str(tiny_bert), resume=True, **{**RUN, "lr": 2e-3})
    base = ["train", groups, "--corpus", corpus, "--model", tiny_bert, "-o", tmp_path / "m", "--resume"]
    changes = [({"lr": 2e-3}, "lr (checkpoint 0.001, now 0.002)"),
               ({"temperature": 0.1}, "temperature (checkpoint 0.05, now 0.1)"),
               ({"train_group_size": 2}, "train_group_size (checkpoint 3, now 2)"),
               ({"max_steps": 8}, "max_steps (checkpoint 6, now 8)"),
               ({"seed": 1}, "seed (checkpoint 42, now 1)")]
    for change, named in changes:
        r = runner(*base, *_flags({**RUN, **change}))
        assert r.exit_code == 2, (change, r.stderr)
        assert f"--resume: this run differs from the checkpoint in {named}" in r.stderr, r.stderr
        assert _snapshot(partial) == before
    r = runner(*base, *_flags({**RUN, "lr": 2e-3, "temperature": 0.1}))
    assert "lr (checkpoint 0.001, now 0.002); temperature (checkpoint 0.05, now 0.1)" in r.stderr  # every key named
    # where and how often it reports and saves may change
    r = runner(*base, *_flags({**RUN, "logging_steps": 3, "save_steps": 1, "save_total_limit": 1}))
    assert r.exit_code == 0, r.stderr
    assert "resumed from" in r.stderr
    saved = json.loads((tmp_path / "m" / "train_config.json").read_text())
    assert saved["lr"] == RUN["lr"] and saved["temperature"] == 0.05  # records what it ran


def test_resume_refuses_other_data_and_accepts_the_same_data_in_another_container(crashed, tiny_bert, tmp_path, runner):
    corpus, groups = _copy(crashed, tmp_path)
    partial = tmp_path / "m.partial"
    before = _snapshot(partial)
    changed = _groups()
    changed[5]["query_text"] += " and more"
    other_groups = _jsonl(tmp_path / "groups2.jsonl", changed)
    docs = _corpus()
    docs["d3"]["text"] += " changed"  # a positive of q3
    other_corpus = _jsonl(tmp_path / "corpus2.jsonl", [{"docid": k, **v} for k, v in docs.items()])
    for g, c in ((other_groups, corpus), (groups, other_corpus)):
        r = runner("train", g, "--corpus", c, "--model", tiny_bert, "-o", tmp_path / "m", "--resume", *_flags(RUN))
        assert r.exit_code == 2
        assert "this run differs from the checkpoint in the data (groups, or the text of the docs they name)" in r.stderr
        assert _snapshot(partial) == before
    # the same groups from stdin, the same corpus gzipped: the same data
    gz = tmp_path / "corpus.jsonl.gz"
    gz.write_bytes(gzip.compress(corpus.read_bytes()))
    r = runner("train", "--corpus", gz, "--model", tiny_bert, "-o", tmp_path / "m", "--resume", *_flags(RUN),
               input=groups.read_text())
    assert r.exit_code == 0, r.stderr
    assert "resumed from" in r.stderr


def test_fingerprint_covers_what_training_reads_and_only_that():
    from retrctl.train.data import GroupSource

    def fingerprint(groups, corpus):
        src = GroupSource(groups, corpus)
        src.validate()
        return src.fingerprint

    base = fingerprint(_groups(), _corpus(50))
    assert fingerprint(_groups(), _corpus(50)) == base
    docs = _corpus(50)
    docs["d45"]["text"] += " x"  # named by no group: not read by training with negatives
    assert fingerprint(_groups(), docs) == base
    docs["d3"]["title"] = "other"  # a positive: its title is part of the passage text
    assert fingerprint(_groups(), docs) != base
    reordered = _groups()
    reordered[0], reordered[1] = reordered[1], reordered[0]  # sampling depends on the position
    assert fingerprint(reordered, _corpus(50)) != base
    src = GroupSource(_groups(), _corpus(50))
    src.validate()
    other = GroupSource(_groups(), docs)
    other.validate()
    assert src.corpus_fingerprint() != other.corpus_fingerprint()


def test_groups_without_negatives_make_the_whole_corpus_part_of_the_data(tiny_bert, tmp_path, runner):
    """Their negatives are drawn from every corpus doc, so a change to a doc no group names is a change of data."""
    groups = _groups()
    groups[0]["negative_document_ids"] = []
    files = (_jsonl(tmp_path / "corpus.jsonl", [{"docid": k, **v} for k, v in _corpus(50).items()]),
             _jsonl(tmp_path / "groups.jsonl", groups))
    named = {d for g in groups for d in g["positive_document_ids"] + g["negative_document_ids"]}
    unnamed = sorted(set(_corpus(50)) - named)[0]
    _crashed(tiny_bert, files, tmp_path / "m")
    docs = _corpus(50)
    docs[unnamed]["text"] += " changed"
    other = _jsonl(tmp_path / "corpus2.jsonl", [{"docid": k, **v} for k, v in docs.items()])
    r = runner("train", files[1], "--corpus", other, "--model", tiny_bert, "-o", tmp_path / "m", "--resume", *_flags(RUN))
    assert r.exit_code == 2 and "differs from the checkpoint in the data" in r.stderr


# ---------------------------------------------------------------- nothing executed


@pytest.mark.parametrize("fmt", ["torch", "pickle"])
@pytest.mark.parametrize("name", ["engine.pt", "rng-0.pt"])
def test_planted_pickle_in_a_checkpoint_never_runs(crashed, tiny_bert, tmp_path, runner, name, fmt):
    corpus, groups = _copy(crashed, tmp_path)
    marker = tmp_path / "PWNED"
    planted = tmp_path / "m.partial" / "checkpoints" / "step-2" / name
    _plant(planted, marker, fmt)
    r = runner("train", groups, "--corpus", corpus, "--model", tiny_bert, "-o", tmp_path / "m", "--resume", *_flags(RUN))
    assert not marker.exists(), "unpickling the checkpoint ran code"
    assert r.exit_code == 2
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"retrctl train: {planted}: not a plain-tensor checkpoint") and "refusing to unpickle" in line
    assert not (tmp_path / "m").exists()


def test_damaged_checkpoint_files_exit_2_naming_them(crashed, tiny_bert, tmp_path, runner):
    corpus, groups = _copy(crashed, tmp_path)
    step = tmp_path / "m.partial" / "checkpoints" / "step-2"
    args = ["train", groups, "--corpus", corpus, "--model", tiny_bert, "-o", tmp_path / "m", "--resume", *_flags(RUN)]
    engine = (step / "engine.pt").read_bytes()
    (step / "engine.pt").write_bytes(engine[: len(engine) // 2])
    r = runner(*args)
    assert r.exit_code == 2 and f"{step / 'engine.pt'}: damaged checkpoint file" in r.stderr
    (step / "engine.pt").write_bytes(engine)
    (step / "trainer_state.json").write_text('{"step": ')
    r = runner(*args)
    assert r.exit_code == 2 and f"{step / 'trainer_state.json'}: damaged checkpoint file" in r.stderr


def _spy_torch_load(monkeypatch) -> list:
    calls, real = [], torch.load

    def spy(f, *args, **kw):
        calls.append((Path(f).name, kw.get("weights_only")))
        return real(f, *args, **kw)

    monkeypatch.setattr(torch, "load", spy)
    return calls


def test_config_file_never_carries_resume_or_overwrite_over(tmp_path):
    from retrctl.train.config import TrainConfig

    (tmp_path / "train_config.json").write_text(json.dumps({"lr": 0.5, "resume": True, "overwrite": True}))
    cfg = TrainConfig.from_json(tmp_path / "train_config.json")
    assert cfg.lr == 0.5 and not cfg.resume and not cfg.overwrite


def test_plain_resume_loads_every_file_weights_only(crashed, tiny_bert, tmp_path, monkeypatch):
    corpus, groups = _copy(crashed, tmp_path)
    calls = _spy_torch_load(monkeypatch)
    train(str(groups), corpus=str(corpus), output=tmp_path / "m", model=str(tiny_bert), resume=True, **RUN)
    assert calls == [("engine.pt", True), ("rng-0.pt", True)]


@pytest.fixture
def one_process_deepspeed(monkeypatch):
    """DeepSpeed in this process (gloo, world 1); the launcher variables it sets are removed afterwards."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_deepspeed_resume_is_exact_and_never_unpickles_code(no_dropout_bert, files, tmp_path, runner, monkeypatch,
                                                            one_process_deepspeed):
    """ZeRO-2 (its optimizer files hold DeepSpeed's own classes): a crashed and resumed run equals an uninterrupted
    one, every load is weights_only, and a payload planted as any file the resume reads never runs."""
    corpus, groups = files
    ds = {**RUN, "zero_stage": 2}
    whole = train(str(groups), corpus=str(corpus), output=tmp_path / "a", model=str(no_dropout_bert), **ds)
    _crashed(no_dropout_bert, files, tmp_path / "b", **ds)
    step = tmp_path / "b.partial" / "checkpoints" / "step-2"
    read = ["deepspeed/mp_rank_00_model_states.pt", "deepspeed/zero_pp_rank_0_mp_rank_00_optim_states.pt", "rng-0.pt"]
    assert sorted(str(p.relative_to(step)) for p in step.rglob("*.pt")) == read
    for i, name in enumerate(read):
        shutil.copytree(tmp_path / "b.partial", tmp_path / f"p{i}.partial")
        planted = tmp_path / f"p{i}.partial" / "checkpoints" / "step-2" / name
        _plant(planted, tmp_path / "PWNED", "torch")
        r = runner("train", groups, "--corpus", corpus, "--model", no_dropout_bert, "-o", tmp_path / f"p{i}", "--resume",
                   *_flags(ds))
        assert not (tmp_path / "PWNED").exists(), f"unpickling {name} ran code"
        assert r.exit_code == 2 and f"{planted}: not a plain-tensor checkpoint" in r.stderr, r.stderr
    # without the scan that runs first, DeepSpeed's own reads still go through the weights-only loader
    shutil.rmtree(tmp_path / "p1.partial" / "checkpoints" / "step-2" / "deepspeed")
    shutil.copytree(step / "deepspeed", tmp_path / "p1.partial" / "checkpoints" / "step-2" / "deepspeed")
    planted = tmp_path / "p1.partial" / "checkpoints" / "step-2" / read[1]
    _plant(planted, tmp_path / "PWNED", "torch")
    with monkeypatch.context() as m:
        m.setattr(engines, "_scan", lambda path, allowed: None)
        r = runner("train", groups, "--corpus", corpus, "--model", no_dropout_bert, "-o", tmp_path / "p1", "--resume", *_flags(ds))
    assert not (tmp_path / "PWNED").exists(), "DeepSpeed's load_checkpoint ran code"
    assert r.exit_code == 2 and f"{planted}: not a plain-tensor checkpoint" in r.stderr, r.stderr
    calls = _spy_torch_load(monkeypatch)
    train(str(groups), corpus=str(corpus), output=tmp_path / "b", model=str(no_dropout_bert), resume=True, **ds)
    # DeepSpeed's model and optimizer states go through our loader, as does the RNG state
    assert {name for name, _ in calls} == {Path(f).name for f in read} and all(w is True for _, w in calls), calls
    assert np.allclose(_losses(whole), _losses(tmp_path / "b"), atol=1e-5)
    probe = ["cat purr", "memory safety"]
    assert np.allclose(Encoder.load(whole, device="cpu").encode(probe), Encoder.load(tmp_path / "b", device="cpu").encode(probe),
                       atol=1e-5)


def test_resume_may_plan_memory_differently(crashed, tiny_bert, tmp_path, runner):
    """GradCache on or off, any chunk, another --max-memory: the same loss and gradient, so a resume on a busier
    machine is not refused (the memory plan is not part of what a run computes)."""
    corpus, groups = _copy(crashed, tmp_path)
    r = runner("train", groups, "--corpus", corpus, "--model", tiny_bert, "-o", tmp_path / "m", "--resume",
               *_flags({**RUN, "grad_cache": "on", "chunk_size": 2, "save_minutes": 5}), "--max-memory", "64GB")
    assert r.exit_code == 0, r.stderr
    assert "resumed from" in r.stderr and "GradCache" in r.stderr
    saved = json.loads((tmp_path / "m" / "train_config.json").read_text())
    assert saved["plan"]["grad_cache"] is True and saved["plan"]["chunk_size"] == 2


def test_max_steps_short_of_an_epoch_warns_that_the_files_head_is_read(tiny_bert, files, tmp_path, caplog):
    """Groups stream in file order: 2 steps of 4 read 8 of 16 groups, and the log says so; a whole epoch does not."""
    corpus, groups = files
    with caplog.at_level("WARNING", logger="retrctl.train"):
        train(str(groups), corpus=str(corpus), output=tmp_path / "short", model=str(tiny_bert), max_steps=2, **FAST)
    assert "--max-steps 2 trains on the first 8 of the 16 groups, in file order" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="retrctl.train"):
        train(str(groups), corpus=str(corpus), output=tmp_path / "epoch", model=str(tiny_bert), max_steps=4, **FAST)
    assert "trains on the first" not in caplog.text
