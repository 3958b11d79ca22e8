"""No module of `hf_lightning.translation` is part of an import cycle.

Every import counts: at module level, inside functions and under `TYPE_CHECKING`; importing
`a.b.c` also runs the `__init__` of `a` and `a.b`, so those are edges too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hf_lightning

PACKAGE = Path(hf_lightning.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}

    def targets(name: str) -> set[str]:
        # The module itself (or the package whose attribute it names) and every package above it.
        found = set()
        while name:
            if name in modules:
                found.add(name)
            name = name.rpartition(".")[0]
        return found

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    edges |= targets(alias.name)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                edges |= targets(node.module)
                for alias in node.names:  # `from package import submodule`
                    edges |= targets(f"{node.module}.{alias.name}") - targets(node.module)
        graph[name] = {edge for edge in edges if edge != name and edge != "hf_lightning"}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(component)
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components


def test_no_translation_module_is_in_an_import_cycle():
    cycles = [
        sorted(c)
        for c in _cycles(_import_graph())
        if any(m.startswith("hf_lightning.translation") for m in c)
    ]
    assert cycles == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert _cycles({"a": {"b"}, "b": set()}) == []
