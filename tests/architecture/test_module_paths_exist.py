"""Every package path the repository's text names (`checkpoint/resume.py`, `hf_lightning/core/outputs.py`) exists,
so comments, docstrings and docs do not point at modules a refactor moved or removed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUBPACKAGES = [path.name for path in (ROOT / "hf_lightning").iterdir() if (path / "__init__.py").is_file()]
ALTERNATIVES = "|".join(SUBPACKAGES)
PATH = re.compile(rf"(?<![\w/.])(?:hf_lightning/)?((?:{ALTERNATIVES})/[A-Za-z0-9_/]+\.py)")
SCANNED = ["hf_lightning", "docs", "tests", "benchmarks", "examples", "README.md"]
# Paths inside other projects that share a subpackage's name.
FOREIGN = {"integrations/integration_utils.py"}  # transformers' integration callbacks
SKIPPED = {Path(__file__).resolve(), ROOT / "tests" / "architecture" / "test_layers.py"}  # synthetic packages


def named_paths() -> list[tuple[Path, int, str]]:
    found = []
    for base in SCANNED:
        start = ROOT / base
        files = [start] if start.is_file() else start.rglob("*")
        for path in files:
            if path.suffix not in (".py", ".md", ".yaml", ".ipynb") or "__pycache__" in path.parts or path in SKIPPED:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8", errors="ignore").splitlines(), 1):
                found += [(path, number, match.group(1)) for match in PATH.finditer(line)]
    return found


def test_every_named_module_path_exists():
    missing = [
        f"{path.relative_to(ROOT)}:{number}: {named}"
        for path, number, named in named_paths()
        if named not in FOREIGN and not (ROOT / "hf_lightning" / named).exists()
    ]
    assert not missing, "paths to modules that do not exist:\n" + "\n".join(missing)


def test_the_scan_finds_the_paths_this_test_relies_on():
    named = {name for _, _, name in named_paths()}
    assert {"checkpoint/resume.py", "core/blocked_time.py", "trainer/trainer.py"} <= named
