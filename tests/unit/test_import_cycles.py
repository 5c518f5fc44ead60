"""No import cycle between bigtrain's modules: every import (inside functions too) is an edge, and the graph has no
strongly connected component of more than one module. A cycle is what lets a change of one module break another
that looks unrelated (the planner's memory estimates once imported each other: memory.py imported
deepspeed_memory.py and pipeline_memory.py, which imported it back)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "bigtrain"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(path: Path) -> set[str]:
    """The bigtrain modules a file imports (``from pkg import mod`` counts as the module when it is one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return {name for name in found if name in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm), or a module that imports
    itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_of_bigtrain_is_part_of_an_import_cycle():
    graph = {name: imports_of(path) - {name} for name, path in MODULES.items()}
    assert cycles(graph) == []


def test_the_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_script_folder_of_bench_is_part_of_an_import_cycle():
    """bench/'s scripts import their neighbours by bare name (``import peers``): the same rule within each folder
    (side_by_side.py and peers.py once imported each other)."""
    for folder in sorted({p.parent for p in (PACKAGE.parent / "bench").rglob("*.py")}):
        local = {p.stem: p for p in folder.glob("*.py")}
        graph = {}
        for name, path in local.items():
            names = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {alias.name for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names.add(node.module)
            graph[name] = (names & set(local)) - {name}
        assert cycles(graph) == [], folder
