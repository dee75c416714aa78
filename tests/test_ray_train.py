"""train --ray (retrctl/train/on_ray.py) on a loopback Ray cluster: two Ray Train workers give the loss curve and the
weights of ``torchrun --nproc_per_node 2`` with the same flags (the reference of test_train.py's ZeRO test), a worker
SIGKILLed mid-run restarts the run from the newest checkpoint and ends with the same weights, and the refusals.

One cluster for the module (more logical CPUs than cores, as in test_ray.py), one torchrun reference run shared by
the comparisons. This module's helpers travel to the workers by value (a worker cannot import a test module).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import raykit
from test_train import _files, _free_port, _torchrun
from trainkit import losses as _losses

ray = pytest.importorskip("ray")

from retrctl.distributed import RaySettings  # noqa: E402
from stages.train import train  # noqa: E402

STEPS = 6
SETTINGS = {"train_group_size": 3, "lr": 1e-3, "max_steps": STEPS, "save_steps": 2, "batch_size": 2, "zero_stage": 2,
            "query_max_len": 16, "passage_max_len": 24}
FLAGS = [a for k, v in SETTINGS.items() for a in (f"--{k.replace('_', '-')}", v)]
LOSS_TOLERANCE = 1e-5  # the same processes, batches and collectives as torchrun: only float noise may differ
WEIGHT_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def cluster():
    """A one-node cluster whose workers run with one torch thread each, as torchrun's processes do here."""
    auth = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    raykit.init_local(runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        yield
    finally:
        ray.shutdown()
        if auth is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = auth


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("raytrain")
    corpus_file, groups_file = _files(d)
    return d, corpus_file, groups_file


@pytest.fixture(scope="module")
def reference(data, no_dropout_bert):
    """The two-process torchrun run with the same flags: what every Ray run must reproduce."""
    d, corpus_file, groups_file = data
    r = _torchrun(2, [groups_file, "--corpus", corpus_file, "--model", no_dropout_bert, *FLAGS, "-o", d / "torchrun"], d,
                  _free_port())
    assert r.returncode == 0, r.stderr[-3000:]
    return d / "torchrun"


def _weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(model_dir / "model.safetensors")


def _max_weight_difference(a: Path, b: Path) -> float:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


def _steps(model_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (model_dir / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- the same run as torchrun


def test_two_ray_workers_match_torchrun(cluster, reference, data, no_dropout_bert, runner, capfd):
    d, corpus_file, groups_file = data
    out = d / "ray"
    res = runner("train", groups_file, "--corpus", corpus_file, "--model", no_dropout_bert, *FLAGS, "-o", out,
                 "--ray", "local", "--workers", 2, "--worker-cpus", 1)
    assert res.exit_code == 0, res.stderr[-3000:]
    assert res.stdout == "" and "training on 2 Ray workers" in res.stderr
    assert _steps(out) == list(range(1, STEPS + 1))
    a, b = _losses(reference), _losses(out)
    gap = max(abs(x - y) for x, y in zip(a, b, strict=True))
    print(f"loss curves: max |torchrun - ray| = {gap:.3g} over {STEPS} steps", file=sys.stderr)
    assert gap <= LOSS_TOLERANCE
    assert _max_weight_difference(reference, out) <= WEIGHT_TOLERANCE
    assert not (d / "ray.partial").exists()
    assert capfd.readouterr().out == ""  # nothing from the workers or Ray on the process's stdout


# ---------------------------------------------------------------- a worker killed mid-run


class KillRank1Once:
    """An ``on_step`` hook: rank 1 notes each step it finishes and SIGKILLs itself after step ``step`` when
    ``marker`` does not exist yet (creating it), so exactly one worker dies once, between checkpoints."""

    def __init__(self, step: int, marker: Path, seen: Path):
        self.step, self.marker, self.seen = step, str(marker), str(seen)

    def __call__(self, step: int, metrics: dict) -> None:
        if os.environ.get("RANK") != "1":
            return
        with open(self.seen, "a") as f:
            f.write(f"{os.getpid()} {step}\n")
        if step == self.step and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_worker_restarts_the_run_from_the_newest_checkpoint(cluster, reference, data, no_dropout_bert):
    d, corpus_file, groups_file = data
    marker, seen, out = d / "killed", d / "rank1-steps", d / "killed-run"
    # killed after step 3: step-2 is the newest checkpoint, so step 3 runs twice
    train(str(groups_file), corpus=str(corpus_file), output=out, model=str(no_dropout_bert),
          on_step=KillRank1Once(3, marker, seen), ray=RaySettings("local", workers=2, timeout=600), **SETTINGS)
    assert marker.exists()
    steps = [tuple(map(int, line.split())) for line in seen.read_text().splitlines()]
    killed = int(marker.read_text())
    assert [s for pid, s in steps if pid == killed] == [1, 2, 3]
    assert [s for pid, s in steps if pid != killed] == [3, 4, 5, 6]  # the restarted rank 1 resumed after step 2
    assert _steps(out) == list(range(1, STEPS + 1))  # one metrics line per step: the rerun step's replaced
    assert np.allclose(_losses(reference), _losses(out), atol=LOSS_TOLERANCE)
    assert _max_weight_difference(reference, out) <= WEIGHT_TOLERANCE
    assert not (d / "killed-run.partial").exists()


def test_bad_input_on_the_workers_exits_2_naming_file_line_field(cluster, data, no_dropout_bert, runner):
    """Found by every worker as it reads the groups, handed back rather than retried by Ray."""
    d, corpus_file, groups_file = data
    lines = groups_file.read_text().splitlines()
    bad_group = json.loads(lines[2])
    bad_group["negative_document_ids"] = ["d50", "nope"]
    bad = d / "bad-groups.jsonl"
    bad.write_text("\n".join([*lines[:2], json.dumps(bad_group), *lines[3:]]) + "\n")
    res = runner("train", bad, "--corpus", corpus_file, "--model", no_dropout_bert, *FLAGS, "-o", d / "bad",
                 "--ray", "local", "--workers", 2)
    assert res.exit_code == 2, res.stderr[-3000:]
    assert f"{bad}:3: field 'negative_document_ids': doc 'nope' is not in the corpus" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (d / "bad").exists() and not (d / "bad.partial").exists()


# ---------------------------------------------------------------- refusals, before any cluster work


@pytest.mark.parametrize("extra, message", [
    (["--workers", 0], "0 is not in the range x>=1"),
    (["--worker-gpus", 0.5], "each training process takes whole GPUs"),
])
def test_bad_worker_settings_exit_2(data, no_dropout_bert, runner, extra, message):
    d, corpus_file, groups_file = data
    res = runner("train", groups_file, "--corpus", corpus_file, "--model", no_dropout_bert, "-o", d / "refused",
                 "--ray", "local", *extra)
    assert res.exit_code == 2 and message in res.stderr, res.stderr
    assert not (d / "refused").exists() and not (d / "refused.partial").exists()


def test_ray_under_a_launcher_exits_2(data, no_dropout_bert, runner, monkeypatch):
    d, corpus_file, groups_file = data
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    res = runner("train", groups_file, "--corpus", corpus_file, "--model", no_dropout_bert, "-o", d / "refused",
                 "--ray", "local", "--workers", 2)
    assert res.exit_code == 2 and "started by a launcher (RANK, WORLD_SIZE set)" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_ray_with_groups_on_stdin_exits_2(data, no_dropout_bert, runner):
    d, corpus_file, groups_file = data
    res = runner("train", "--corpus", corpus_file, "--model", no_dropout_bert, "-o", d / "refused", "--ray", "local",
                 input=groups_file.read_text())
    assert res.exit_code == 2 and "not stdin" in res.stderr, res.stderr


def test_ray_settings_without_ray_exit_2(data, no_dropout_bert, runner):
    d, corpus_file, groups_file = data
    res = runner("train", groups_file, "--corpus", corpus_file, "--model", no_dropout_bert, "-o", d / "refused",
                 "--workers", 2)
    assert res.exit_code == 2 and "need --ray" in res.stderr, res.stderr
