"""Compile a source tree's bytecode before it is timed, as a wheel install does when pip installs it.

The project is installed editable here, and with `PYTHONDONTWRITEBYTECODE=1` (set on the benchmark machine) a
fresh process then compiles every hf_lightning module it imports, in every timed run: about 50 ms of CPU to the
first step that a user's installed copy does not pay and that transformers, compiled by pip, never pays.
`compileall` writes the `.pyc` files whatever that variable says; later processes only read them.
"""

from __future__ import annotations

import compileall
from pathlib import Path


def compile_tree(root: Path, packages: tuple[str, ...] = ("hf_lightning", "benchmarks")) -> bool:
    """Write up-to-date bytecode for `packages` under `root`; True when every file compiled."""
    # Every package is compiled, even after one that failed (a generator inside all() would stop there).
    compiled = [
        compileall.compile_dir(str(root / package), quiet=1)
        for package in packages
        if (root / package).is_dir()
    ]
    return all(compiled)
