"""The package's modules import each other without cycles.

Every import of an hf_lightning module counts: at module level, inside functions and under
`if TYPE_CHECKING:`, since a cycle hidden in a function is still a cycle in the design (the two
modules cannot be understood, tested or moved apart). `from pkg import name` counts as importing
`pkg.name` when that is a module, else `pkg`; a package's `__init__` counts like any module.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "hf_lightning"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE
TRANSLATION = PACKAGE + ".translation"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _package_of(module: str, path: Path) -> str:
    """The package a relative import in `module` starts from."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _resolve(name: str, modules: set[str]) -> str | None:
    """The deepest module of the package `name` refers to (`pkg.func` -> `pkg`); None outside the package."""
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return None
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(tree: ast.AST, module: str, path: Path, modules: set[str]) -> dict[str, int]:
    """{imported module of the package: first line} for every import in `tree`, wherever it sits."""
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        target = _resolve(name, modules)
        if target is not None:
            found[target] = min(line, found.get(target, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: made absolute from the importing module's package
                package = _package_of(module, path).split(".")
                anchor = ".".join(package[: len(package) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                add(submodule if submodule in modules else base, node.lineno)
    return found


def import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """module -> {imported module of the package: first line importing it}."""
    paths = {_module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    modules = set(paths)
    return {
        module: _imports(
            ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), module, path, modules
        )
        for module, path in paths.items()
    }


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module, and modules importing themselves (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        # Iterative depth-first search: (node, iterator over its successors).
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    cycles.append(sorted(component))
    return sorted(cycles)


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    """One cycle as its modules and the imports that close it (with line numbers)."""
    members = set(cycle)
    lines = [f"cycle of {len(cycle)} module(s):"]
    for module in cycle:
        edges = ", ".join(
            f"{target} (line {line})" for target, line in sorted(graph[module].items()) if target in members
        )
        lines.append(f"  {module} imports {edges}")
    return "\n".join(lines)


def test_the_package_has_no_import_cycles():
    graph = import_graph()
    cycles = import_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(describe(cycle, graph) for cycle in cycles)


def test_no_import_cycles_outside_translation():
    """The graph without the translation subpackage is acyclic (translation's own cycle is tracked above)."""
    graph = {
        module: {target: line for target, line in edges.items() if not target.startswith(TRANSLATION)}
        for module, edges in import_graph().items()
        if not module.startswith(TRANSLATION)
    }
    cycles = import_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(describe(cycle, graph) for cycle in cycles)


def _write(root: Path, files: dict[str, str]) -> Path:
    package = root / PACKAGE
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return package


def test_the_detector_sees_every_kind_of_import(tmp_path):
    package = _write(
        tmp_path,
        {
            "__init__.py": "",
            "a/__init__.py": "from hf_lightning.a import b\n",
            "a/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hf_lightning.c import Thing\n",
            "a/d.py": "def f():\n    from ..c import helper\n",
            "c.py": "import hf_lightning.a.d as d\nfrom hf_lightning.a import CONSTANT\n",
            "e.py": "import os\nimport hf_lightning.e\n",
            "f.py": "from hf_lightning import c\n",
        },
    )
    graph = import_graph(package)
    assert graph["hf_lightning.a"] == {"hf_lightning.a.b": 1}  # a submodule, not the package itself
    assert graph["hf_lightning.a.b"] == {"hf_lightning.c": 3}  # under TYPE_CHECKING
    assert graph["hf_lightning.a.d"] == {"hf_lightning.c": 2}  # relative, inside a function
    assert graph["hf_lightning.c"] == {"hf_lightning.a.d": 1, "hf_lightning.a": 2}  # a name -> its package
    assert graph["hf_lightning.f"] == {"hf_lightning.c": 1}
    # c -> a -> a.b -> c (closed under TYPE_CHECKING) and c -> a.d -> c (closed inside a function).
    assert import_cycles(graph) == [
        ["hf_lightning.a", "hf_lightning.a.b", "hf_lightning.a.d", "hf_lightning.c"],
        ["hf_lightning.e"],  # imports itself
    ]


def test_the_detector_reports_a_long_cycle_with_its_imports(tmp_path):
    package = _write(
        tmp_path,
        {
            "__init__.py": "",
            "x.py": "import hf_lightning.y\n",
            "y.py": "\n\nfrom hf_lightning.z import g\n",
            "z.py": "from hf_lightning import x\n",
            "w.py": "import hf_lightning.x\n",  # leads into the cycle, is not on it
        },
    )
    graph = import_graph(package)
    cycles = import_cycles(graph)
    assert cycles == [["hf_lightning.x", "hf_lightning.y", "hf_lightning.z"]]
    message = describe(cycles[0], graph)
    assert "hf_lightning.y imports hf_lightning.z (line 3)" in message
    assert "hf_lightning.w" not in message
