"""The README's set-up commands get the CPU build of torch wherever they run, not only where local wheels exist.

The pin in `.ci/constraints.txt` names a version, not a build: on Linux the torch that a package registry serves
under a bare requirement is the CUDA build. A dry run of pip against the registry that pip is configured with
(its index URLs, without any local wheel folder: `--isolated` drops `find-links` and the config files) shows
what such a requirement pulls, and the README's commands must therefore take torch from PyTorch's CPU index.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
DEFAULT_INDEX = "https://pypi.org/simple"


def setup_commands() -> list[list[str]]:
    """The pip commands of each bash block of the README's Set-up section, in order, as argument lists."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2, "the Set-up section has the main-job and the test commands"
    commands = []
    for block in blocks:
        steps = [shlex.split(step) for step in block.replace("\\\n", " ").split("&&")]
        commands.append([step for step in steps if step[:2] == ["pip", "install"]])
    return commands


def pinned_torch() -> str:
    lines = (ROOT / ".ci" / "constraints.txt").read_text().splitlines()
    pins = [line.strip() for line in lines if line.strip().startswith("torch==")]
    assert len(pins) == 1, ".ci/constraints.txt pins torch once"
    return pins[0]


def configured_indexes() -> list[str]:
    """The index URLs pip is configured with (config files and PIP_* variables); PyPI when none is."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    indexes = []
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        if key.rsplit(".", 1)[-1] in ("index-url", "extra-index-url"):
            indexes.extend(value.strip("'\"").split())
    return list(dict.fromkeys(indexes)) or [DEFAULT_INDEX]


def test_each_setup_command_installs_torch_from_the_cpu_index_before_the_project():
    pin = pinned_torch()
    for installs in setup_commands():
        first, project = installs[0], installs[-1]
        assert pin in first and first[first.index("--index-url") + 1] == CPU_INDEX, first
        assert "-e" in project and "-c" in project and ".ci/constraints.txt" in project, project


@pytest.mark.slow
def test_a_bare_torch_requirement_from_the_configured_registry_is_the_cuda_build(tmp_path):
    indexes = configured_indexes()
    report = tmp_path / "report.json"
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--isolated",
        "--ignore-installed",
        "--no-deps",
    ]
    registry = ["--index-url", indexes[0], *(f"--extra-index-url={url}" for url in indexes[1:])]
    output = ["--quiet", "--report", str(report), "--target", str(tmp_path / "target")]
    linux = ["--platform", "manylinux_2_28_x86_64", "--only-binary=:all:"]
    done = subprocess.run(
        [*pip, *registry, *output, *linux, "torch"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    (torch,) = json.loads(report.read_text())["install"]
    linux = [need for need in torch["metadata"].get("requires_dist", []) if "Linux" in need]
    cuda = [need for need in linux if need.startswith(("nvidia-", "cuda-", "triton"))]
    assert cuda, f"torch {torch['metadata']['version']} from {indexes} declares no CUDA packages: {linux}"
