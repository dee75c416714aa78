"""train --teacher: distillation from a frozen teacher model, with groups (its scores, its vectors) or from a corpus
alone (its vectors of each passage and a sentence crop of it), on tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import with_config
from trainkit import FAST, corpus, groups, losses, write_jsonl

from stages.train import train

TEXTS = ["cat purr memory", "python code safety rust", "hot water tea leaf"]


def _random_bert(out: Path, seed: int, **settings) -> Path:
    """A random BERT (2 heads, MLP 64, 128 positions, ``settings`` on top) with the MiniLM tokenizer, saved in ``out``."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from retrctl.models import locate_shipped

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(locate_shipped("minilm")))
    BertModel(BertConfig(vocab_size=tok.vocab_size, num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=128, **settings)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def wide_teacher(tmp_path_factory) -> Path:
    """A 2-layer, hidden-48 BERT (another width than tiny_bert's 32) with the MiniLM tokenizer."""
    return _random_bert(tmp_path_factory.mktemp("wide_teacher"), 1, hidden_size=48, num_hidden_layers=2)


@pytest.fixture
def files(tmp_path):
    return (write_jsonl(tmp_path / "corpus.jsonl", [{"docid": k, **v} for k, v in corpus().items()]),
            write_jsonl(tmp_path / "groups.jsonl", groups()))


def _encode(model, texts=TEXTS):
    from retrctl.models import Encoder

    return Encoder.load(model, device="cpu").encode(texts)


def test_a_student_distilled_from_itself_stays_where_it_is(no_dropout_bert, files, tmp_path):
    c, _ = files
    # at the default learning rate of a corpus alone (3e-4): Adam turns float noise into steps of about lr
    out = train(None, corpus=str(c), output=tmp_path / "m", model=str(no_dropout_bert), teacher=str(no_dropout_bert),
                max_steps=5, **{**FAST, "lr": None})
    assert losses(out)[0] < 1e-9 and max(losses(out)) < 1e-3  # a new student starts near 1
    cos = (_encode(out) * _encode(no_dropout_bert)).sum(1)
    assert cos.min() > 0.999, cos


def test_the_embedding_loss_falls_and_a_teacher_of_another_width_is_learned_through_a_dropped_projection(
        tiny_bert, wide_teacher, files, tmp_path):
    from safetensors import safe_open
    from sentence_transformers import SentenceTransformer

    c, _ = files
    out = train(None, corpus=str(c), output=tmp_path / "m", model=str(tiny_bert), teacher=str(wide_teacher),
                max_steps=30, **{**FAST, "lr": 3e-3})
    seen = losses(out)
    assert np.mean(seen[-5:]) < 0.7 * np.mean(seen[:5]), seen
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert "embed_mse" in metrics
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert not [k for k in f.keys() if "projection" in k]
    assert not [p for p in out.rglob("*") if "projection" in p.name]
    stock = SentenceTransformer(str(out), device="cpu")
    assert stock.encode(TEXTS).shape == (3, 32)
    cfg = json.loads((out / "train_config.json").read_text())
    assert cfg["teacher"] == str(wide_teacher) and cfg["embed_distill_weight"] == 1.0 and cfg["epochs"] == 2


def test_a_teacher_with_another_tokenizer_encodes_its_own_texts(tiny_bert, tiny_llama, files, tmp_path):
    """tiny_llama pads left and ends with EOS: it tokenizes the raw texts itself, so it teaches tiny_bert as is."""
    c, g = files
    out = train(str(g), corpus=str(c), output=tmp_path / "m", model=str(tiny_bert), teacher=str(tiny_llama),
                embed_distill_weight=0.5, max_steps=2, **FAST)
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"ce", "kl", "embed_mse"} <= set(last)
    cfg = json.loads((out / "train_config.json").read_text())
    assert cfg["distill_weight"] == 1.0 and cfg["epochs"] == 3  # the defaults with a teacher and groups


def test_the_teachers_scores_are_distilled_with_groups(no_dropout_bert, tiny_bert, files, tmp_path, runner):
    c, g = files
    out = tmp_path / "m"
    r = runner("train", g, "--corpus", c, "--model", tiny_bert, "--teacher", no_dropout_bert, "--distill-loss",
               "margin-mse", "--max-steps", 2, "--train-batch-size", 4, "--train-group-size", 3, "--query-max-len", 16,
               "--passage-max-len", 24, "-o", out)
    assert r.exit_code == 0, r.stderr
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert "margin_mse" in last and "embed_mse" not in last


def test_a_corpus_alone_trains_through_the_cli(tiny_bert, no_dropout_bert, files, tmp_path, runner):
    c, _ = files
    out = tmp_path / "healed"
    r = runner("train", "--corpus", c, "--model", tiny_bert, "--teacher", no_dropout_bert, "-o", out, "--max-steps", 2,
               "--train-batch-size", 4, "--query-max-len", 16, "--passage-max-len", 24)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == ""
    assert (out / "model.safetensors").is_file() and not out.with_name("healed.partial").exists()
    assert not (out / "teacher").exists()  # the teacher's cached vectors are not shipped with the model
    assert len(losses(out)) == 2
    plan = json.loads((out / "train_config.json").read_text())["plan"]
    assert plan["teacher_bytes"] > 0  # the teacher's forward is part of the memory plan


def test_resume_with_another_teacher_is_refused_naming_the_key(tiny_bert, no_dropout_bert, wide_teacher, files, tmp_path,
                                                              runner):
    c, _ = files
    out = tmp_path / "m"

    def crash(step, metrics):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(None, corpus=str(c), output=out, model=str(tiny_bert), teacher=str(no_dropout_bert), max_steps=4,
              save_steps=1, on_step=crash, **FAST)
    partial = out.with_name("m.partial")
    assert (partial / "checkpoints" / "step-1").is_dir() and list((partial / "teacher").glob("passage-*.npy"))
    r = runner("train", "--corpus", c, "--model", tiny_bert, "--teacher", wide_teacher, "-o", out, "--max-steps", 4,
               "--save-steps", 1, "--train-batch-size", 4, "--train-group-size", 3, "--lr", 1e-3, "--query-max-len", 16, "--passage-max-len", 24,
               "--logging-steps", 1, "--resume")
    assert r.exit_code == 2, r.stderr
    assert "differs from the checkpoint in teacher" in r.stderr and str(wide_teacher) in r.stderr
    assert not out.exists()
    r = runner("train", "--corpus", c, "--model", tiny_bert, "--teacher", no_dropout_bert, "-o", out, "--max-steps", 4,
               "--save-steps", 1, "--train-batch-size", 4, "--train-group-size", 3, "--lr", 1e-3, "--query-max-len", 16, "--passage-max-len", 24,
               "--logging-steps", 1, "--resume")
    assert r.exit_code == 0, r.stderr
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]


def test_a_teacher_that_does_not_load_or_is_the_output_exits_2_naming_it(tiny_bert, files, tmp_path, runner):
    c, g = files
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    out = tmp_path / "m"
    for groups_arg in ([], [g]):
        r = runner("train", *groups_arg, "--corpus", c, "--model", tiny_bert, "--teacher", broken, "-o", out,
                   "--max-steps", 1)
        assert r.exit_code == 2, r.stderr
        assert str(broken) in r.stderr and "--teacher" in r.stderr
        assert not out.exists() and not out.with_name("m.partial").exists()
    trained = tmp_path / "trained"
    trained.mkdir()
    r = runner("train", "--corpus", c, "--model", tiny_bert, "--teacher", trained, "-o", trained, "--max-steps", 1)
    assert r.exit_code == 2, r.stderr
    assert str(trained) in r.stderr and "nothing written" in r.stderr
    assert list(trained.iterdir()) == []


def test_without_a_teacher_an_embedding_weight_or_a_corpus_alone_is_refused(tiny_bert, files, tmp_path, runner):
    c, g = files
    r = runner("train", g, "--corpus", c, "--model", tiny_bert, "--embed-distill-weight", 1, "-o", tmp_path / "m")
    assert r.exit_code == 2 and "--teacher" in r.stderr, r.stderr
    r = runner("train", "--corpus", c, "--model", tiny_bert, "--teacher", tiny_bert, "--embed-distill-weight", 0,
               "-o", tmp_path / "m")
    assert r.exit_code == 2 and "--embed-distill-weight" in r.stderr, r.stderr
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("heal_teacher", ["--heal-teacher", "--no-heal-teacher"])
def test_prune_heals_a_trained_retriever_by_distilling_its_unpruned_self(tiny_llama, files, tmp_path, runner, heal_teacher):
    from retrctl.models import Encoder

    c, g = files
    source = tmp_path / "retriever"
    Encoder.load(tiny_llama, device="cpu", bidirectional=True, pooling="mean").save(source)  # a retrctl model dir
    small = tmp_path / "small"
    r = runner("prune", source, "-o", small, "--slim-mlp", 0.5, "--groups", g, "--corpus", c, "--slim-steps", 1,
               "--heal-steps", 2, "--train-batch-size", 4, "--lr", 1e-3, "--passage-max-len", 24, "--query-max-len", 16,
               heal_teacher)
    assert r.exit_code == 0, r.stderr
    slim = json.loads((small / "prune.json").read_text())["slimming"]
    if heal_teacher == "--heal-teacher":
        assert slim["heal_teacher"] == str(source)
        assert {"ce", "kl", "embed_mse"} <= set(slim["metrics"]["heal"])
    else:
        assert slim["heal_teacher"] is None and "embed_mse" not in slim["metrics"]["heal"]


@pytest.fixture(scope="module")
def other_vocab_teacher(tmp_path_factory) -> Path:
    """A 2-layer, hidden-48 BERT with its own small WordPiece vocabulary (not MiniLM's): token ids of the student's
    tokenizer are out of its range, so it only works if it tokenizes the texts itself."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    torch.manual_seed(2)
    out = tmp_path_factory.mktemp("other_vocab_teacher")
    words = sorted({w for d in corpus().values() for w in (d.get("title", "") + " " + d["text"]).lower().split()})
    letters = sorted({c for w in words for c in w})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *(f"##{c}" for c in letters), *words]
    (out / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    tok = BertTokenizerFast(vocab_file=str(out / "vocab.txt"))
    tok.save_pretrained(out)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=48, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    BertModel(cfg).save_pretrained(out)
    return out


def test_a_corpus_alone_is_distilled_from_a_teacher_with_another_vocabulary(tiny_bert, other_vocab_teacher, files,
                                                                              tmp_path):
    from transformers import AutoTokenizer

    c, _ = files
    student_tok, teacher_tok = (AutoTokenizer.from_pretrained(str(m)) for m in (tiny_bert, other_vocab_teacher))
    assert len(teacher_tok) < 200 < len(student_tok)  # the student's ids would index past the teacher's embeddings
    out = train(None, corpus=str(c), output=tmp_path / "m", model=str(tiny_bert), teacher=str(other_vocab_teacher),
                max_steps=30, **{**FAST, "lr": 3e-3})
    seen = losses(out)
    assert np.mean(seen[-5:]) < 0.7 * np.mean(seen[:5]), seen
    assert _encode(out).shape == (3, 32)


@pytest.mark.parametrize("where", ["is", "inside"])
def test_a_teacher_that_holds_the_output_is_refused_even_with_overwrite(tiny_bert, files, tmp_path, runner, where):
    """`train --model small/ --teacher healed/ -o healed/ --overwrite` would replace the teacher it reads."""
    c, _ = files
    teacher = train(None, corpus=str(c), output=tmp_path / "healed", model=str(tiny_bert), teacher=str(tiny_bert),
                    max_steps=1, **FAST)
    before = {p: p.read_bytes() for p in teacher.rglob("*") if p.is_file()}
    out = teacher if where == "is" else teacher / "sub"
    r = runner("train", "--corpus", c, "--model", tiny_bert, "--teacher", teacher, "-o", out, "--overwrite",
               "--max-steps", 1)
    assert r.exit_code == 2, r.stderr
    assert str(teacher) in r.stderr and "nothing written" in r.stderr
    assert {p: p.read_bytes() for p in teacher.rglob("*") if p.is_file()} == before
    assert not out.with_name(out.name + ".partial").exists()


@pytest.fixture(scope="module")
def attention_dropout_bert(tiny_bert, tmp_path_factory) -> Path:
    """tiny_bert with dropout on the attention probabilities only (0.5), none elsewhere."""
    return with_config(tiny_bert, tmp_path_factory.mktemp("bert_attn_dropout"), hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.5)


def test_a_corpus_alone_trains_without_attention_dropout_and_the_saved_config_keeps_the_models(
        attention_dropout_bert, files, tmp_path):
    c, _ = files
    # distilled from itself: any dropout would make the first step's loss far from 0
    out = train(None, corpus=str(c), output=tmp_path / "m", model=str(attention_dropout_bert),
                teacher=str(attention_dropout_bert), max_steps=2, **{**FAST, "lr": None})
    assert losses(out)[0] < 1e-9
    assert json.loads((out / "config.json").read_text())["attention_probs_dropout_prob"] == 0.5
    with_dropout = train(None, corpus=str(c), output=tmp_path / "d", model=str(attention_dropout_bert),
                         teacher=str(attention_dropout_bert), max_steps=2, attention_dropout=0.5, **{**FAST, "lr": None})
    assert losses(with_dropout)[0] > 1e-7  # the first check fails with it: dropout moves the loss off 0


def test_attention_dropout_is_set_on_encoders_and_decoders_and_checked(tiny_bert, tiny_llama, runner, files, tmp_path):
    from transformers import AutoModel

    from retrctl.models.backbone import set_attention_dropout
    from retrctl.train.config import TrainConfig

    for path in (tiny_bert, tiny_llama):
        model = AutoModel.from_pretrained(str(path), attn_implementation="sdpa")
        assert set_attention_dropout(model, 0.25) == 2, path.name  # one attention module per layer
        rates = [m.dropout.p if type(m).__name__.endswith("SelfAttention") else m.attention_dropout
                 for m in model.modules()
                 if type(m).__name__.endswith("SelfAttention") or isinstance(getattr(m, "attention_dropout", None), float)]
        assert rates == [0.25, 0.25], (path.name, rates)
        assert model.config.to_dict().get("attention_probs_dropout_prob", 0.0) != 0.25  # the config is left alone
    assert TrainConfig().settle(teacher=True, groups=False).attention_dropout == 0.0
    assert TrainConfig().settle(teacher=True, groups=True).attention_dropout is None  # the model's own
    c, g = files
    r = runner("train", g, "--corpus", c, "--model", tiny_bert, "--attention-dropout", 1, "-o", tmp_path / "m")
    assert r.exit_code == 2 and "--attention-dropout" in r.output
    assert not (tmp_path / "m").exists()


def _reseeded(model: Path, out: Path) -> Path:
    """``model``'s config and tokenizer with other random weights: a student as wide, reading the same tokens."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, BertModel

    torch.manual_seed(7)
    BertModel(AutoConfig.from_pretrained(model)).save_pretrained(out)
    AutoTokenizer.from_pretrained(model).save_pretrained(out)
    return out


def test_token_distillation_from_itself_is_zero_and_its_loss_falls_for_a_cut_student(no_dropout_bert, files, tmp_path):
    c, _ = files
    same = train(None, corpus=str(c), output=tmp_path / "same", model=str(no_dropout_bert),
                 teacher=str(no_dropout_bert), token_distill_weight=1.0, max_steps=2, **{**FAST, "lr": None})
    first = json.loads((same / "metrics.jsonl").read_text().splitlines()[0])
    assert first["token_mse"] < 1e-9 and first["loss"] < 1e-9
    out = train(None, corpus=str(c), output=tmp_path / "m", model=str(_reseeded(no_dropout_bert, tmp_path / "other")),
                teacher=str(no_dropout_bert),
                token_distill_weight=1.0, max_steps=30, **{**FAST, "lr": 3e-3})
    seen = [json.loads(line)["token_mse"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert seen[0] > 0.01 and np.mean(seen[-5:]) < 0.7 * np.mean(seen[:5]), seen


def test_token_blocks_line_up_whatever_the_padding():
    import torch

    from retrctl.models.layout import token_block

    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).view(2, 4, 3)
    right = token_block(hidden, torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]), 5).view(2, 5, 3)
    left = token_block(hidden, torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]), 5).view(2, 5, 3)
    assert torch.equal(right[0, :2], hidden[0, :2]) and torch.equal(left[0, :2], hidden[0, 2:])
    assert not right[0, 2:].any() and not left[0, 2:].any() and torch.equal(right[1, :4], hidden[1])
    with pytest.raises(ValueError, match="exceeds"):
        token_block(hidden, torch.ones(2, 4), 3)


def test_token_distillation_refuses_groups_and_a_teacher_of_another_tokenizer_or_width(
        tiny_bert, wide_teacher, other_vocab_teacher, files, tmp_path, runner):
    c, g = files
    base = ["--model", tiny_bert, "--token-distill-weight", 1, "--max-steps", 1, "--train-batch-size", 4,
            "--query-max-len", 16, "--passage-max-len", 24]
    for args, named in (([g, "--corpus", c, "--teacher", tiny_bert], "corpus alone"),
                        (["--corpus", c, "--teacher", other_vocab_teacher], "different tokenizers"),
                        (["--corpus", c, "--teacher", wide_teacher], "same width")):
        out = tmp_path / "m"
        r = runner("train", *args, *base, "-o", out)
        assert r.exit_code == 2 and named in r.stderr, r.stderr
        assert not out.exists() and not out.with_name("m.partial").exists()


@pytest.fixture(scope="module")
def bert4(tmp_path_factory) -> Path:
    """A 4-layer, hidden-32 BERT without dropout, with the MiniLM tokenizer: a teacher to cut blocks from."""
    return _random_bert(tmp_path_factory.mktemp("bert4"), 3, hidden_size=32, num_hidden_layers=4,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def test_layer_distillation_follows_the_blocks_prune_kept_and_its_loss_falls(bert4, no_dropout_bert, files, tmp_path):
    import torch

    from retrctl.models import Encoder
    from retrctl.train.teacher import TeacherTokens, block_map
    from stages.prune import prune

    c, _ = files
    scored = prune(str(bert4), output=tmp_path / "scored", calibration=str(c), drop_layers=1)
    report = json.loads((scored / "prune.json").read_text())
    report["scores"]["block"] = [0.1, 0.9, 0.2, 0.8]  # blocks 0 and 2 least important: the student keeps 1 and 3
    (tmp_path / "scores.json").write_text(json.dumps(report))
    small = prune(str(bert4), output=tmp_path / "small", scores=tmp_path / "scores.json", drop_layers=2)
    teacher, student = Encoder.load(bert4, device="cpu"), Encoder.load(small, device="cpu")
    kept = [1, 3]
    assert block_map(student, teacher, "t") == kept
    assert block_map(teacher, teacher, "t") == [0, 1, 2, 3]  # as deep, no prune.json: each block itself
    # the cut's targets are the teacher's states after the blocks it kept: those rows of the teacher's full set
    targets = TeacherTokens(teacher, student, "t", tokens=False, layers=True)(TEXTS, "passage")
    cap = student.config.passage_max_len
    assert set(targets) == {"vectors", "layers"} and targets["layers"].shape == (3, cap * 1 * 32)
    whole = TeacherTokens(teacher, teacher, "t", tokens=False, layers=True)(TEXTS, "passage")["layers"]
    assert torch.allclose(targets["layers"].view(3, cap, 32), whole.view(3, cap, 3, 32)[:, :, kept[0]], atol=1e-5)

    same = train(None, corpus=str(c), output=tmp_path / "same", model=str(no_dropout_bert),
                 teacher=str(no_dropout_bert), layer_distill_weight=1.0, max_steps=2, **{**FAST, "lr": None})
    first = json.loads((same / "metrics.jsonl").read_text().splitlines()[0])
    assert first["layer_mse"] < 1e-9 and first["loss"] < 1e-9
    _reseeded(small, small)  # the cut's map with other weights: far from its teacher at the start
    out = train(None, corpus=str(c), output=tmp_path / "m", model=str(small), teacher=str(bert4),
                layer_distill_weight=1.0, token_distill_weight=1.0, max_steps=30, **{**FAST, "lr": 3e-3})
    seen = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for key in ("layer_mse", "token_mse"):
        assert seen[0][key] > 0.01 and np.mean([m[key] for m in seen[-5:]]) < 0.7 * np.mean([m[key] for m in seen[:5]])


def test_layer_distillation_weighs_each_token_by_its_own_state():
    """A state 100× the others' norm (a decoder's massive activation) counts as one token, not as all of them."""
    import torch

    from retrctl.train.losses import layer_distill

    teacher = torch.ones(1, 4, 2, 8)
    teacher[0, 0, 0] *= 100
    teacher[0, 3] = 0  # padding: no token
    student = teacher.clone()
    student[0, 1, 1] *= 1.5  # one ordinary state off by half its norm: 0.25 of its own
    assert layer_distill(student, teacher).item() == pytest.approx(0.25 / 6)
    student[0, 3] = 5  # what the student puts on padding rows is not scored
    assert layer_distill(student, teacher).item() == pytest.approx(0.25 / 6)


def test_layer_distillation_refuses_a_student_it_cannot_map(bert4, no_dropout_bert, files, tmp_path, runner):
    from stages.prune import prune

    c, g = files
    base = ["--layer-distill-weight", 1, "--max-steps", 1, "--train-batch-size", 4, "--query-max-len", 16,
            "--passage-max-len", 24]
    other = prune(str(no_dropout_bert), output=tmp_path / "other", calibration=str(c), drop_layers=1)
    for args, named in (([g, "--corpus", c, "--model", no_dropout_bert, "--teacher", no_dropout_bert], "corpus alone"),
                        (["--corpus", c, "--model", no_dropout_bert, "--teacher", bert4], "no prune.json"),
                        (["--corpus", c, "--model", other, "--teacher", bert4], "cut from another model")):
        out = tmp_path / "m"
        r = runner("train", *args, *base, "-o", out)
        assert r.exit_code == 2 and named in r.stderr, r.stderr
        assert not out.exists() and not out.with_name("m.partial").exists()


SENTENCES = [["Cats purr when they feel safe.", "Tea leaves steep in hot water.", "Rust checks memory safety early."],
             ["Python code runs on many machines.", "Green tea tastes of grass and smoke.", "A cat sleeps in the sun."]]


def _sentence_corpus(n=12) -> dict[str, dict]:
    """Docs of three sentences each (trainkit's corpus has one per doc, so every crop of it is the same)."""
    return {f"s{i}": {"title": f"t{i}", "text": " ".join(f"{s[:-1]} number {i}." for s in SENTENCES[i % 2])}
            for i in range(n)}


def test_fresh_crops_cycle_through_distinct_sentences_pass_by_pass():
    from retrctl.train.distill import TextBatches, corpus_texts

    docs = {**_sentence_corpus(2), "short": {"text": "Too few words. Here."}}
    fixed, fresh = corpus_texts(docs, seed=0), corpus_texts(docs, seed=0, passes=4)
    assert [p.crops for p in fixed] == [(), (), ()] and fixed[0].query in docs["s0"]["text"]
    assert len(set(fresh[0].crops)) == 3 and all(c in docs["s0"]["text"] for c in fresh[0].crops)
    assert fresh[2].crops == ("Too few words. Here.",)  # no sentence of 4 words: its first words, every pass
    batches = TextBatches(fresh, global_batch=3, seed=0)
    seen = [{p.index: p.query for b in batches.epoch(e) for p in b} for e in range(4)]
    assert [s[0] for s in seen] == [*fresh[0].crops, fresh[0].crops[0]]  # one sentence a pass, then again
    assert {p.index: p.query for b in TextBatches(fixed, global_batch=3, seed=0).epoch(1) for p in b}[0] == fixed[0].query


def test_fresh_crops_are_distilled_against_the_teachers_vectors_of_each_passs_crop(no_dropout_bert, files, tmp_path,
                                                                                  runner):
    from retrctl import records
    from retrctl.train.config import TrainConfig
    from retrctl.train.distill import CorpusDistiller

    corpus = _sentence_corpus()
    for extra in ({}, {"token_distill_weight": 1.0}):  # the teacher's vectors kept, or from each step's forward
        cfg = TrainConfig().replace(model=str(no_dropout_bert), teacher=str(no_dropout_bert), fresh_crops=True, epochs=2,
                                    **{**FAST, "lr": 1e-5}, **extra)  # Adam's steps of ~lr keep it near itself
        run = CorpusDistiller.build(cfg, None, corpus, tmp_path / f"m{len(extra)}")
        encoded = []
        run.vectors.teacher.encode = lambda texts, kind, _encode=run.vectors.teacher.encode, _seen=encoded, **kw: (
            _seen.extend(texts) or _encode(texts, kind=kind, **kw))
        out = run.fit()
        # distilled from itself: a target of another text than the student read would move the loss off 0
        assert len(losses(out)) == 6 and max(losses(out)) < 1e-5, losses(out)
        if not extra:  # two passes, a crop of another sentence each, encoded as read and not kept
            crops = set(encoded) - {records.passage_text(d) for d in corpus.values()}
            assert len(crops) == 2 * len(corpus) and not run.vectors.cache["query"], len(crops)
    c, g = files
    r = runner("train", g, "--corpus", c, "--model", no_dropout_bert, "--teacher", no_dropout_bert, "--fresh-crops",
               "-o", tmp_path / "g")
    assert r.exit_code == 2 and "--fresh-crops" in r.stderr and "corpus alone" in r.stderr, r.stderr
    assert not (tmp_path / "g").exists()


def test_a_fresh_crop_run_resumed_in_its_second_pass_reads_that_passs_crops(no_dropout_bert, tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"docid": k, **v} for k, v in _sentence_corpus().items()])
    kw = {"corpus": str(corpus), "model": str(no_dropout_bert), "teacher": str(no_dropout_bert), "fresh_crops": True,
          "epochs": 2, "save_steps": 3, **FAST}  # 3 steps a pass: the checkpoint ends pass 1
    whole = train(None, output=tmp_path / "a", **kw)

    def crash(step, metrics):
        if step == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(None, output=tmp_path / "b", on_step=crash, **kw)
    resumed = train(None, output=tmp_path / "b", resume=True, **kw)
    assert len(losses(whole)) == 6 and np.allclose(losses(whole), losses(resumed), atol=1e-6), (losses(whole),
                                                                                               losses(resumed))
