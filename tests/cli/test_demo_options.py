"""`hf-lightning train-demo` spells its options like TrainingArguments (--output_dir), keeps the dashed spellings,
and what it writes by default stays out of git."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hf_lightning.cli.main import DEFAULT_OUTPUT_DIR, _with_default_command, build_parser

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("spelling", ["underscore", "dash"])
def test_demo_takes_both_spellings(spelling):
    names = ["--output_dir", "--max_steps", "--num_threads"]
    if spelling == "dash":
        names = [name.replace("_", "-") for name in names]
    argv = [names[0], "somewhere", names[1], "3", names[2], "2"]
    options = build_parser().parse_args(_with_default_command(argv))
    assert (options.output_dir, options.max_steps, options.num_threads) == ("somewhere", 3, 2)


def test_what_the_commands_write_by_default_is_git_ignored():
    from hf_lightning.cli.embedded import default_training_args

    # train-demo's output_dir, the examples' output_dirs and the script example's default
    written = [DEFAULT_OUTPUT_DIR, "runs/cls", "runs/clm", "runs/seq2seq", "example_output"]
    assert default_training_args(DEFAULT_OUTPUT_DIR, 0)["output_dir"] == DEFAULT_OUTPUT_DIR
    for path in written:
        probe = f"{path.removeprefix('./')}/model.safetensors"
        ignored = subprocess.run(["git", "check-ignore", "-q", probe], cwd=ROOT).returncode == 0
        assert ignored, f"{probe} is not git-ignored"


def test_a_prefix_of_an_option_is_refused(capsys):
    """argparse would take `--epoch` for `--epochs` and `--max_step` for `--max_steps`; a typo is reported."""
    for argv in (["--epoch", "1"], ["--max_step", "3"]):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(_with_default_command(argv))
        assert exit_.value.code == 2 and f"unrecognized arguments: {argv[0]}" in capsys.readouterr().err


def test_the_main_jobs_output_folder_is_not_packaged(tmp_path):
    """The main job writes ./hf_lightning_demo into the checkout; the package search of pyproject.toml must not
    take it (or any other hf_lightning_* folder) for a top-level package at the next `pip install -e`."""
    from pathlib import Path

    import tomllib
    from setuptools import find_namespace_packages

    from hf_lightning.cli.main import DEFAULT_OUTPUT_DIR

    root = Path(__file__).resolve().parents[2]
    include = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    (tmp_path / "hf_lightning" / "engine").mkdir(parents=True)
    (tmp_path / "hf_lightning" / "__init__.py").write_text("")
    (tmp_path / "hf_lightning" / "engine" / "__init__.py").write_text("")
    (tmp_path / DEFAULT_OUTPUT_DIR / "checkpoint-5").mkdir(parents=True)
    found = find_namespace_packages(str(tmp_path), include=include)
    assert sorted(found) == ["hf_lightning", "hf_lightning.engine"]
