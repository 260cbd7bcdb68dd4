"""The package's import graph keeps DESIGN.md's layering: no module imports itself
back through others (no circle), no layer imports one above it, verification and
scheduling import no model, and the load generator imports no engine and no torch.

The graph is read from the source with `ast` (every `import`, at the top of a module
or inside a function), so a lazy import that would close a circle counts as much as
a top-level one.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dspark"

#: each top-level part of the package and the parts it may import (besides itself).
#: Leaves first; a part may import only parts listed for it, which makes the graph of
#: parts a DAG. `calibration`, `sampling`, `cpuinfo` and `errors` are leaves of pure
#: functions, `presets` one of plain data (the named speculative configurations).
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "cpuinfo": set(),
    "calibration": set(),
    "presets": set(),
    "sampling": {"errors"},
    "verify": {"sampling", "errors"},
    "schedule": {"errors"},
    "runtime": {"cpuinfo", "errors"},
    "drafters": {"runtime", "sampling", "calibration", "schedule", "errors"},
    "profiling": {"runtime", "drafters", "schedule", "sampling", "errors"},
    "engine": {"drafters", "runtime", "schedule", "verify", "profiling", "calibration", "presets", "sampling",
               "errors"},
    "generate": {"engine", "runtime", "sampling", "errors"},
    "data": {"engine", "runtime", "sampling", "errors"},
    "train": {"drafters", "runtime", "verify", "data", "calibration", "sampling", "errors"},
    # offline measurement through the real engine and server (acceptance, the engine
    # bench, the server's reliability checks, the peers)
    "eval": {"serve", "engine", "drafters", "data", "generate", "runtime", "bench", "calibration", "presets",
             "sampling", "errors"},
    "serve": {"engine", "runtime", "sampling", "errors"},
    "bench": {"data", "presets", "cpuinfo", "errors"},
    "cli": {"serve", "engine", "drafters", "runtime", "train", "eval", "data", "profiling", "bench",
            "generate", "calibration", "presets", "sampling", "errors"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module a dotted name lives in (`dspark.a.b.func` -> `dspark.a.b`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the dspark modules it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(_resolve(a.name, modules) for a in node.names if a.name.startswith("dspark"))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    name = ".".join(base + ([node.module] if node.module else []))
                else:
                    name = node.module or ""
                if name.split(".")[0] != "dspark":
                    continue
                # `from pkg import submodule` imports the submodule; `from mod import f`, mod
                deps.update(_resolve(f"{name}.{a.name}", modules) for a in node.names)
        deps.discard(None)
        deps.discard(mod)
        graph[mod] = {d for d in deps if d is not None}
    return graph


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "dspark"


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_sees_a_circle_and_an_upward_import() -> None:
    """The checks below could pass by seeing nothing: a made-up graph with a circle is
    caught, and the real graph has the edges the layering is about."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = import_graph()
    assert "dspark.runtime.machine" in graph["dspark.runtime.precision"]  # a lazy import counts
    assert "dspark.verify.rejection" in graph["dspark.verify"]  # `from .rejection import` resolved
    assert "dspark.engine.engine" in graph["dspark.serve.app"]


def test_no_circles() -> None:
    assert circles(import_graph()) == []


def test_no_upward_imports() -> None:
    graph = import_graph()
    assert set(ALLOWED) | {"dspark"} >= {_part(m) for m in graph}, "a new part of the package: place it in ALLOWED"
    upward = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                    if _part(d) != _part(m) and _part(m) != "dspark" and _part(d) not in ALLOWED[_part(m)])
    assert upward == []


def test_allowed_parts_form_no_circle() -> None:
    assert circles({part: deps & set(ALLOWED) for part, deps in ALLOWED.items()}) == []


@pytest.mark.parametrize("part", ["verify", "schedule"])
def test_verify_and_schedule_import_no_model(part: str) -> None:
    """Pure functions of tensors and tables: nothing of the runtime or the engine, even
    through another module."""
    graph = import_graph()
    seen, todo = set(), [m for m in graph if _part(m) == part]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    assert sorted(m for m in seen if _part(m) in ("runtime", "engine", "drafters")) == []


def test_bench_imports_without_torch_or_the_engine() -> None:
    """The load generator speaks HTTP only: importing every module of dspark.bench
    loads neither torch nor any of the engine."""
    bench = sorted(m for m in _modules() if _part(m) == "bench")
    code = ("import sys\n" + "".join(f"import {m}\n" for m in bench)
            + "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith(("
              "'dspark.engine', 'dspark.runtime', 'dspark.drafters')))\nprint(' '.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(bench) > 5 and out.stdout.strip() == ""
