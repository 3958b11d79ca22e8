"""A module imports the package's own modules at its top; an import inside a function is there only to keep a
public import or the console script light, and says so in a `# lazy: <why>` comment above it (or above the run of
imports it belongs to). The layers (test_layers.py), not function-local imports, keep the package free of loops."""

from __future__ import annotations

import ast

from tests.architecture.test_import_cycles import PACKAGE, ROOT


def local_package_imports(source: str) -> list[ast.stmt]:
    """The import statements of package modules that sit inside a function of `source`."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == PACKAGE):
                found.append(node)
            elif isinstance(node, ast.Import) and any(alias.name.split(".")[0] == PACKAGE for alias in node.names):
                found.append(node)
    return found


def unexplained(source: str) -> list[int]:
    """Lines of local package imports with no `# lazy:` comment above their run of imports."""
    lines = source.splitlines()
    statements = local_package_imports(source)
    import_lines = {line for node in statements for line in range(node.lineno, node.end_lineno + 1)}
    missing = []
    for node in statements:
        above = node.lineno - 1  # 1-based line number of the line above
        while above in import_lines:
            above -= 1
        if above < 1 or "# lazy:" not in lines[above - 1]:
            missing.append(node.lineno)
    return missing


def test_every_function_local_package_import_says_why():
    problems = [
        f"{path.relative_to(ROOT.parent)}:{line}"
        for path in sorted(ROOT.rglob("*.py"))
        for line in unexplained(path.read_text(encoding="utf-8"))
    ]
    assert not problems, "function-local imports without a `# lazy: <why>` comment (or move them to the top):\n" + (
        "\n".join(problems)
    )


def test_the_check_sees_a_bare_local_import_and_accepts_an_explained_run():
    source = (
        "def f():\n"
        "    # lazy: Lightning only when a run starts\n"
        "    from hf_lightning.engine import a\n"
        "    from hf_lightning.engine import b\n"
        "\n"
        "def g():\n"
        "    from .sibling import c\n"
        "    import hf_lightning.x\n"
    )
    assert unexplained(source) == [7, 8]
