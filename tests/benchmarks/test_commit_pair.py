"""benchmarks/commit_pair.py: a commit is exported as the tree it holds, and the public import it times runs there."""

from __future__ import annotations

import subprocess
from pathlib import Path

from benchmarks.commit_pair import export, import_cpu

REPO = Path(__file__).resolve().parents[2]


def test_export_writes_the_commits_tree_and_its_import_runs(tmp_path: Path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, check=True, capture_output=True, text=True).stdout
    tree = export(head.strip(), tmp_path / "head")
    committed = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", "HEAD", "hf_lightning/trainer"], cwd=REPO, check=True,
        capture_output=True, text=True,
    ).stdout.split()
    assert committed and all((tree / name).is_file() for name in committed)
    assert not (tree / ".git").exists()
    assert 0 < import_cpu(tree) < 60
