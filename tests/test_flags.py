"""Flags with one meaning: a long flag that several stages take has one help text everywhere (its default may
differ by stage, so a trailing "[default: …]" is not compared), and an old name kept after a rename is hidden."""

from __future__ import annotations

import importlib
import re
from collections import defaultdict

import click
import pytest

from retrctl.cli import STAGES

EXCEPTIONS = {"--output"}  # -o/--output names a file or a directory by the stage
DEFAULT = re.compile(r"\s*\[default: [^\]]*\]\s*$")


def _params(name: str) -> list[click.Parameter]:
    cmd = importlib.import_module(f"stages.{name}").command
    return cmd.get_params(click.Context(cmd))


def _helps() -> dict[str, dict[str, str]]:
    """long flag -> stage -> its help without the default, for every visible option of every stage."""
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for name in STAGES:
        for p in _params(name):
            if isinstance(p, click.Option) and not p.hidden:
                for flag in p.opts + p.secondary_opts:
                    if flag.startswith("--"):
                        out[flag][name] = DEFAULT.sub("", p.help or "")
    return out


def test_every_flag_shared_by_stages_has_one_help_text():
    helps = _helps()
    assert len(helps) > 100 and {"--hits", "--min-words", "--seed", "--lr"} <= helps.keys()  # the walk saw them
    differing = {flag: by_stage for flag, by_stage in helps.items()
                 if flag not in EXCEPTIONS and len(set(by_stage.values())) > 1}
    assert not differing, differing


@pytest.mark.parametrize(("stage", "old", "new"), [
    ("crop", "--max-tokens", "--max-words"),
    ("qgen", "--temperature", "--sampling-temperature"),
    ("mine", "--output-format", "--group-format"),
    ("train", "--batch-size", "--train-batch-size"),
    ("qgen", "--candidates", "--candidates-file"),
])
def test_a_renamed_flag_keeps_its_old_name_hidden(stage, old, new):
    by_flag = {o: p for p in _params(stage) if isinstance(p, click.Option) for o in p.opts}
    assert by_flag[old].hidden and not by_flag[new].hidden
    assert by_flag[old].name.endswith(new.lstrip("-").replace("-", "_"))  # its value goes to the new flag


def test_train_batch_size_old_name_gives_the_same_settings_with_a_warning(runner, tmp_path, monkeypatch):
    """train's --batch-size (query groups per step) is --train-batch-size; the old name still sets it."""
    import stages.train

    seen = []
    monkeypatch.setattr(stages.train, "train", lambda groups, **kw: seen.append(kw["config"].batch_size))
    out = tmp_path / "m"
    new = runner("train", "-", "--model", "minilm", "--train-batch-size", 3, "-o", out, input="")
    old = runner("train", "-", "--model", "minilm", "--batch-size", 3, "-o", out, input="")
    assert new.exit_code == old.exit_code == 0, old.stderr
    assert seen == [3, 3] and "--batch-size is now --train-batch-size" in old.stderr
    assert "--batch-size" not in new.stderr
