"""Trainer's interfaces for stages that train an encoder they built (prune's healing) or distil from a model on
the fly (LightRetriever's KL term): an Encoder instance trains exactly as its saved name does, and an
online teacher gives exactly the loss of the same scores stored in the groups. Old module paths still import."""

import json

import numpy as np
import pytest
from safetensors.torch import load_file
from trainkit import FAST
from trainkit import corpus as _corpus
from trainkit import groups as _groups

from retrctl import records
from retrctl.models import Encoder
from retrctl.train.config import TrainConfig
from retrctl.train.loop import Trainer


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_training_an_encoder_instance_equals_training_its_saved_name(tiny_bert, tmp_path):
    """Dropout on: the instance path must seed as the name path does."""
    by_name = Trainer.build(TrainConfig(model=str(tiny_bert), max_steps=2, **FAST), _groups(8), _corpus(), tmp_path / "a").fit()
    enc = Encoder.load(tiny_bert, device="cpu")
    given = Trainer.build(TrainConfig(max_steps=2, **FAST), _groups(8), _corpus(), tmp_path / "b", encoder=enc).fit()
    a, b = load_file(by_name / "model.safetensors"), load_file(given / "model.safetensors")
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)
    assert (by_name / "retrctl.json").read_text() == (given / "retrctl.json").read_text()
    assert [r["loss"] for r in _rows(by_name)] == [r["loss"] for r in _rows(given)]
    assert not np.allclose(Encoder.load(tiny_bert, device="cpu").encode(["cat"]), Encoder.load(given, device="cpu").encode(["cat"]))


def test_an_instance_takes_the_configs_encoder_settings_and_needs_no_model_name(tiny_bert, tmp_path):
    enc = Encoder.load(tiny_bert, device="cpu")
    out = Trainer.build(TrainConfig(max_steps=1, pooling="cls", **FAST), _groups(4), _corpus(), tmp_path / "m", encoder=enc).fit()
    saved = json.loads((out / "retrctl.json").read_text())
    assert (saved["pooling"], saved["query_max_len"], saved["temperature"]) == ("cls", 16, 0.05)
    with pytest.raises(ValueError, match="a model is required"):
        Trainer.build(TrainConfig(max_steps=1, **FAST), _groups(4), _corpus(), tmp_path / "n")


def _teacher_groups(teacher: Encoder):
    """Groups carrying the teacher's own scores for each positive and negative."""
    corpus, groups = _corpus(), _groups(8)
    for g in groups:
        ids = g["positive_document_ids"] + g["negative_document_ids"]
        q = teacher.encode([g["query_text"]], kind="query")
        p = teacher.encode([records.passage_text(corpus[d]) for d in ids], kind="passage")
        s = (q @ p.T)[0].tolist()
        g["positive_scores"], g["negative_scores"] = s[:1], s[1:]
    return corpus, groups


def test_an_online_teacher_gives_the_loss_of_its_scores_stored_in_the_groups(no_dropout_bert, tiny_llama, tmp_path):
    teacher = Encoder.load(tiny_llama, device="cpu", pooling="last")
    corpus, scored = _teacher_groups(teacher)
    cfg = TrainConfig(model=str(no_dropout_bert), max_steps=2, distill_weight=0.5, **FAST)
    stored = _rows(Trainer.build(cfg, scored, corpus, tmp_path / "stored").fit())
    plain = [{k: v for k, v in g.items() if not k.endswith("_scores")} for g in scored]
    online = _rows(Trainer.build(cfg, plain, corpus, tmp_path / "online", teacher=teacher).fit())
    assert all(r["kl"] > 0 for r in stored)
    # a passage encoded in another batch differs in the last bits: its cosine by a few eps32 (1.2e-7), its logit (/ τ
    # = 0.05) by ~1e-6, and so do the ce and kl computed from them; kl may be near zero, so the bound is absolute too
    for a, b in zip(stored, online, strict=True):
        assert (a["ce"], a["kl"], a["loss"]) == pytest.approx((b["ce"], b["kl"], b["loss"]), rel=1e-4, abs=1e-5)

    # a callable teacher returning exactly the stored scores: exactly the stored run
    table = {}
    for g in scored:
        for d, s in zip(g["positive_document_ids"] + g["negative_document_ids"], g["positive_scores"] + g["negative_scores"],
                        strict=True):
            table[g["query_text"], records.passage_text(corpus[d])] = s
    by_call = _rows(Trainer.build(cfg, plain, corpus, tmp_path / "call", teacher=lambda q, ps: [table[q, p] for p in ps]).fit())
    assert [(r["ce"], r["kl"], r["loss"]) for r in by_call] == [(r["ce"], r["kl"], r["loss"]) for r in stored]


def test_training_has_one_forward_pass_the_encoders():
    from retrctl.train import loop

    assert not hasattr(loop, "Tower")  # the old training wrapper embedded on its own and could drift from encode


def test_a_checkpoint_of_the_old_training_wrapper_loads_into_the_encoder(tiny_bert):
    """Checkpoints of earlier retrctl name the weights enc.<name> (it trained a wrapper): a resume reads them."""
    import torch

    from retrctl.train.checkpoint import legacy_keys

    a, b = Encoder.load(tiny_bert, device="cpu"), Encoder.load(tiny_bert, device="cpu")
    with torch.no_grad():
        for p in b.parameters():
            p.add_(1.0)
    legacy_keys(b)
    b.load_state_dict({f"enc.{k}": v for k, v in a.state_dict().items()})
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    b.load_state_dict(b.state_dict())  # today's names still load


def test_the_command_line_checks_the_training_settings_once(tmp_path, runner, monkeypatch):
    """The command, train() and Trainer share one check (Trainer's), made before the groups are read."""
    calls = []
    monkeypatch.setattr(TrainConfig, "check", lambda self, needs_model=True: calls.append(needs_model))
    r = runner("train", tmp_path / "none.jsonl", "--model", "x", "-o", tmp_path / "m")
    assert r.exit_code == 2 and "none.jsonl" in r.stderr, r.stderr  # the groups are read after the check
    assert calls == [True] and not (tmp_path / "m").exists()
