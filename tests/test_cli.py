"""The CLI edge: lazy stage list without torch, exit statuses (usage 2, bad input 2, our failure 1), one-line
errors, tracebacks only with --log-level debug, and quiet ends on closed pipes. The eval stage is the probe."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "bin" / "retrctl"


def sh(cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=120, **kw)


@pytest.fixture
def run_and_qrels(tmp_path):
    """3000 judged queries, 20 docs each: --per-query output is far larger than a pipe buffer."""
    run = tmp_path / "run.trec"
    qrels = tmp_path / "qrels.trec"
    run.write_text("".join(f"q{i} Q0 d{i}_{j} {j + 1} {20 - j} t\n" for i in range(3000) for j in range(20)))
    qrels.write_text("".join(f"q{i} 0 d{i}_{i % 20} 1\n" for i in range(3000)))
    return run, qrels


def test_help_lists_stages_without_importing_torch():
    code = (
        "import sys\n"
        "from retrctl.cli import main, STAGES\n"
        "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
        "assert 'torch' not in sys.modules, 'retrctl --help imported torch'\n"
        "try:\n    main(['eval', '--help'])\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
        "assert 'torch' not in sys.modules, 'retrctl eval --help imported torch'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    stages = out.stdout.split("Stages:")[1].split("Usage:")[0]
    listed = [line.split()[0] for line in stages.strip().splitlines() if line.startswith("  ") and line.split()]
    from retrctl.cli import STAGES

    assert "eval" in listed and set(listed) <= set(STAGES)
    assert "--qrels" in out.stdout  # eval's own help followed


def test_launcher_and_module_entry_points():
    assert sh(f"{BIN} --version").stdout.startswith("retrctl")
    out = subprocess.run([sys.executable, "-m", "retrctl", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Stages:" in out.stdout


@pytest.mark.parametrize("args", [["eval"], ["eval", "--no-such-flag", "x"], ["no-such-stage"], ["eval", "r", "--alpha", "x"]])
def test_usage_errors_exit_2(runner, args):
    result = runner(*args)
    assert result.exit_code == 2
    assert "Usage:" in result.stderr or "Error:" in result.stderr
    assert result.stdout == ""


def test_bad_input_exits_2_with_one_line(runner, tmp_path, qrels_file):
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d1 1 1.0 t\nq1 Q0 d2 2\n")
    result = runner("eval", run, "--qrels", qrels_file)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"retrctl eval: {run}:2: expected 6 columns 'qid Q0 docid rank score tag', got 4"]


def test_our_failure_exits_1_with_one_line_and_traceback_only_in_debug(runner, monkeypatch, run_and_qrels):
    import stages.eval

    def boom(*a, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(stages.eval.metrics, "evaluate", boom)
    run, qrels = run_and_qrels
    result = runner("eval", run, "--qrels", qrels)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == ["retrctl eval: RuntimeError: boom"]
    debug = runner("eval", run, "--qrels", qrels, "--log-level", "debug")
    assert debug.exit_code == 1 and "Traceback" in debug.stderr and debug.stderr.rstrip().endswith("retrctl eval: RuntimeError: boom")
    again = runner("eval", run, "--qrels", qrels)  # the debug run's setting does not outlive it
    assert again.stderr.splitlines() == ["retrctl eval: RuntimeError: boom"]


def test_closed_pipe_ends_quietly(run_and_qrels, tmp_path):
    run, qrels = run_and_qrels
    err = tmp_path / "err"
    out = sh(f"set -o pipefail; {BIN} eval {run} --qrels {qrels} --per-query -q 2>{err} | head -1; echo \"status=${{PIPESTATUS[0]}}\"")
    lines = out.stdout.splitlines()
    assert lines[0].startswith("# qrels:") and len(lines) == 2
    assert err.read_text() == ""  # no BrokenPipeError, no traceback
    assert lines[1] == f"status={128 + signal.SIGPIPE}"  # stopped by SIGPIPE at once, like cat or grep


def test_in_process_calls_leave_sigpipe_alone(runner, run_and_qrels):
    before = signal.getsignal(signal.SIGPIPE)
    run, qrels = run_and_qrels
    assert runner("eval", run, "--qrels", qrels, "-q").exit_code == 0
    assert signal.getsignal(signal.SIGPIPE) == before


def test_shared_flags_are_spelled_alike_in_every_stage():
    """FORMATS.md's flag vocabulary: a stage that takes a shared flag takes it with the shared name, type and short
    form (tests/test_flags.py checks that it reads alike too)."""
    import importlib

    import click

    from retrctl.cli import STAGES
    from retrctl.options import OPTIONS

    shared = {}
    for deco in OPTIONS.values():
        probe = deco(click.command()(lambda **kw: None))
        shared.update({p.opts[-1]: p for p in probe.params if p.name != "output"})  # -o is a file or a dir by stage
    checked = 0
    for stage in STAGES:
        for p in importlib.import_module(f"stages.{stage}").command.params:
            if isinstance(p, click.Option) and not p.hidden and p.opts[-1] in shared:
                want = shared[p.opts[-1]]
                assert (p.opts, p.secondary_opts, p.type.name) == (want.opts, want.secondary_opts, want.type.name), (stage, p.opts)
                checked += 1
    assert checked > 20
