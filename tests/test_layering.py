"""The import graph of the core (issue 13): no circle among retrctl modules (every import statement at any depth,
TYPE_CHECKING ones included; the old engines ↔ trainer circle was one of those), and no core module imports a stage."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    mods = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in (ROOT / "retrctl").rglob("*.py")}
    graph, stages = {}, []
    for m, p in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:  # `from pkg import sub` depends on pkg.sub
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module for a in node.names]
            else:
                continue
            stages += [f"{m} imports {n}" for n in names if n == "stages" or n.startswith("stages.")]
            deps |= {n for n in names if n in mods and n != m}
        graph[m] = deps
    return graph, stages


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                found.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    return found


def test_no_import_circle_and_no_core_module_imports_a_stage():
    graph, stages = _graph()
    assert "retrctl.train.loop" in graph and "retrctl.models.encoder" in graph
    assert _cycles(graph) == []
    assert stages == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]
