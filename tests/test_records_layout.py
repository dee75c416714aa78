"""The records package's layout: every name callers use still comes from ``retrctl.records``, the
modules import one way only, each imports on its own, and none pulls a heavy library in at import time."""

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from retrctl import records

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "retrctl" / "records"
MODULES = sorted(p.stem for p in PKG.glob("*.py") if p.stem != "__init__")

# what the tree, the tests and the benches call as records.X or import from retrctl.records (before the split)
USED = """ALIASES BEIR_FILES BusyError ID_FIELD KINDS NORMALIZERS RecordError atomic_dir atomic_path batched beir_qrels
check_outputs content_hash dumps is_parquet normalize_doc normalize_group normalize_query open_output open_text
passage_text read read_corpus read_jsonl read_objects read_parquet read_qrels read_run resolve run_rows text_id
trec_order versions write write_manifest_beside write_run""".split()


def test_every_public_name_is_still_reachable_from_the_package():
    assert set(USED) <= set(records.__all__)
    for name in records.__all__:
        obj = getattr(records, name)
        home = getattr(obj, "__module__", None)
        if home and home.startswith("retrctl.records."):  # re-exported, not copied: one object, one home
            assert getattr(importlib.import_module(home), name) is obj, name


def _imports(path: Path) -> set[str]:
    """retrctl.records.* modules that ``path`` imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("retrctl.records."):
            found.add(node.module.rsplit(".", 1)[1])
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path.name}: relative import (use retrctl.records.<module>)")
        elif isinstance(node, ast.Import):
            found |= {a.name.rsplit(".", 1)[1] for a in node.names if a.name.startswith("retrctl.records.")}
    return found


def test_modules_import_one_way_and_stay_small():
    graph = {m: _imports(PKG / f"{m}.py") for m in MODULES}
    order: list[str] = []
    while len(order) < len(graph):  # topological order exists iff there is no cycle
        ready = [m for m in graph if m not in order and graph[m] <= set(order)]
        assert ready, f"import cycle among {sorted(set(graph) - set(order))}: {graph}"
        order += sorted(ready)
    for m in MODULES:
        lines = len((PKG / f"{m}.py").read_text().splitlines())
        assert lines <= 400, f"records/{m}.py has {lines} lines"
        assert (PKG / f"{m}.py").read_text().lstrip().startswith('"""'), f"records/{m}.py has no docstring"


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_alone_and_light(module):
    code = (f"import sys\nimport retrctl.records.{module}\n"
            "heavy = sorted({'torch', 'pyarrow', 'zstandard', 'numpy'} & set(sys.modules))\n"
            "assert not heavy, heavy\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
