"""The subpackages form layers: an import points down (or across, without a loop), never up.

The import graph of every module (module level, inside functions and under `if TYPE_CHECKING:`, as
`test_import_cycles.py` reads it) is collapsed onto the subpackages. Two rules hold on that graph:
- no subpackage imports one of a higher layer (docs/design.md, "Layers");
- the collapsed graph has no loop, also among the subpackages of one layer.
"""

from __future__ import annotations

from pathlib import Path

from tests.architecture.test_import_cycles import PACKAGE, ROOT, import_cycles, import_graph

# Bottom to top. The top-level modules (`hf_lightning/__init__.py`, the documented import paths
# `field_registry.py` and `cli_data.py`) are the public face, above every subpackage.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("args",),
    ("translation",),
    ("data", "optim", "strategies"),
    ("callbacks", "checkpoint", "evaluation", "integrations"),
    ("engine",),
    ("trainer",),
    ("trl", "adapted", "cli"),
)
PUBLIC_FACE = "(top level)"
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names} | {PUBLIC_FACE: len(LAYERS)}


def subpackage(module: str, root: Path = ROOT) -> str:
    """`hf_lightning.<sub>.x` -> `<sub>`; a top-level module -> the public face."""
    parts = module.split(".")
    if len(parts) >= 2 and (root / parts[1]).is_dir():
        return parts[1]
    return PUBLIC_FACE


def collapsed_graph(graph: dict[str, dict[str, int]], root: Path = ROOT) -> dict[str, dict[str, list[str]]]:
    """subpackage -> {imported subpackage: ["module:line -> module", ...]} (imports inside one subpackage left out)."""
    collapsed: dict[str, dict[str, list[str]]] = {}
    for module, targets in graph.items():
        source = subpackage(module, root)
        collapsed.setdefault(source, {})
        for target, line in targets.items():
            destination = subpackage(target, root)
            if destination != source:
                collapsed[source].setdefault(destination, []).append(f"{module}:{line} -> {target}")
    return collapsed


def test_every_subpackage_has_a_layer():
    subpackages = {subpackage(module) for module in import_graph()}
    assert subpackages - set(LEVEL) == set(), "add the new subpackage to LAYERS and to docs/design.md"


def test_no_subpackage_imports_a_higher_layer():
    upward = [
        f"{source} (layer {LEVEL[source]}) imports {destination} (layer {LEVEL[destination]}): {', '.join(imports)}"
        for source, targets in collapsed_graph(import_graph()).items()
        for destination, imports in targets.items()
        if LEVEL[destination] > LEVEL[source]
    ]
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def subpackage_loops(collapsed: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    return import_cycles({source: dict.fromkeys(targets, 0) for source, targets in collapsed.items()})


def test_the_subpackages_form_no_loop():
    collapsed = collapsed_graph(import_graph())
    loops = subpackage_loops(collapsed)
    details = [
        f"{members}: " + "; ".join(
            f"{source} -> {destination} ({imports[0]})"
            for source in members
            for destination, imports in collapsed[source].items()
            if destination in members
        )
        for members in loops
    ]
    assert not loops, "subpackage loops:\n" + "\n".join(details)


def test_the_collapse_sees_a_loop_hidden_in_a_function(tmp_path):
    """A loop closed by a function-local import counts, as a module-level one does."""
    package = tmp_path / PACKAGE
    for name, text in {
        "__init__.py": "",
        "data/__init__.py": "",
        "data/a.py": "def f():\n    from hf_lightning.optim.b import g\n",
        "optim/__init__.py": "",
        "optim/b.py": "from hf_lightning.data.a import f\n",
    }.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    collapsed = collapsed_graph(import_graph(package), package)
    assert set(collapsed["data"]) == {"optim"} and set(collapsed["optim"]) == {"data"}
    assert subpackage_loops(collapsed) == [["data", "optim"]]
