"""The layering ARCHITECTURE.md describes, checked: no import circle in the core, no core module importing
a stage or the CLI layer (stage.py, cli.py), stages independent of each other, and no core module longer than a
newcomer reads in one sitting.

The import rules are import-linter contracts (pyproject.toml, ``[tool.importlinter]``; `lint-imports`, also run by
``make lint``): grimp reads every import statement at any depth, function-local and TYPE_CHECKING ones included
(the old engines ↔ trainer circle went through one of those). The size rule has no contract there, so it is here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_CORE_LINES = 500


def _lint_imports(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lint-imports")
    exe = str(exe) if exe.exists() else shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    return subprocess.run([exe, "--no-cache", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_import_contracts_hold():
    out = _lint_imports(ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in out.stdout


def test_the_contracts_catch_a_circle_a_core_module_importing_a_stage_and_one_importing_the_cli_layer(tmp_path):
    """The same contracts on a toy tree with the three faults: import-linter must report each (else the test above
    could pass with contracts that check nothing)."""
    (tmp_path / "retrctl" / "sub").mkdir(parents=True)
    (tmp_path / "stages").mkdir()
    for init in ("retrctl", "retrctl/sub", "stages"):
        (tmp_path / init / "__init__.py").write_text("")
    (tmp_path / "retrctl" / "a.py").write_text("def f():\n    from retrctl.sub import b\n")
    (tmp_path / "retrctl" / "sub" / "b.py").write_text("from retrctl import a\nimport stages.one\n")
    (tmp_path / "stages" / "one.py").write_text("")
    (tmp_path / "retrctl" / "stage.py").write_text("")
    (tmp_path / "retrctl" / "options.py").write_text("")
    (tmp_path / "retrctl" / "cli.py").write_text("")
    (tmp_path / "retrctl" / "__main__.py").write_text("from retrctl import cli\n")  # the one import allowed
    (tmp_path / "retrctl" / "c.py").write_text("from retrctl.stage import shard\n")
    contracts = (ROOT / "pyproject.toml").read_text().split("[tool.importlinter]", 1)[1]
    (tmp_path / "pyproject.toml").write_text("[tool.importlinter]" + contracts)
    out = _lint_imports(tmp_path)
    assert out.returncode != 0
    assert "Contracts: 1 kept, 3 broken." in out.stdout, out.stdout[-3000:]
    assert "retrctl.c -> retrctl.stage" in out.stdout and "retrctl.__main__ ->" not in out.stdout, out.stdout[-3000:]


def test_no_core_module_is_longer_than_the_limit():
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "retrctl").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_CORE_LINES}
    assert not long, f"core modules over {MAX_CORE_LINES} lines: {long}"
