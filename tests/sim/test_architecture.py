"""The simulator's layering, read from its source: no module imports itself back through others, and
neither the core nor the observers import a front end (the core is what both generations share; the
observers read the instruction record whatever front end wrote it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nki_ops.sim

pytestmark = pytest.mark.simulation

ROOT = Path(nki_ops.sim.__file__).parent
PACKAGE = "nki_ops.sim"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _type_checking_only(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def import_graph() -> dict[str, set[str]]:
    """Each simulator module and the simulator modules it imports (at any depth of its code, lazily
    or not; an import under ``if TYPE_CHECKING`` runs never and does not count)."""
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(tree):
            if _type_checking_only(node, parents):
                continue
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                for alias in node.names:  # ``from . import x`` depends on module x, not on the package
                    deps.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for dep in graph[node]:
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_simulator_has_no_import_cycle():
    graph = import_graph()
    assert f"{PACKAGE}.core.memory" in graph and f"{PACKAGE}.frontends.legacy.kernel" in graph
    assert cycles(graph) == []


def test_the_core_and_the_observers_import_no_front_end():
    upward = {name: sorted(d for d in deps if ".frontends" in d) for name, deps in import_graph().items()
              if name.startswith((f"{PACKAGE}.core", f"{PACKAGE}.observers"))}
    assert {name: deps for name, deps in upward.items() if deps} == {}


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
