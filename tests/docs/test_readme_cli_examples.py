"""The README's Lightning CLI commands run as written, in order, each shrunk to a seconds-long run by a few
overrides (output_dir in a temporary folder, 2 steps, small data)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import torch
import yaml

from hf_lightning.cli.lightning_cli import main

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "OMP_NUM_THREADS=1 hf-lightning "


def readme_cli_commands() -> list[str]:
    """The `hf-lightning <config command>` lines of the README's Lightning CLI block, comments dropped."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Lightning CLI") :]
    block = section[section.index("```bash\n") + len("```bash\n") : section.index("```\n", section.index("```bash"))]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.startswith(PREFIX)]


def shrunk_argv(command: str, tmp_path: Path) -> tuple[list[str], str | None]:
    """The command's argv with the smoke-run overrides after its --config, and the file a `>` sends stdout to."""
    words = shlex.split(command.removeprefix(PREFIX))
    redirect = None
    if ">" in words:
        redirect = words[words.index(">") + 1]
        words = words[: words.index(">")]
    config = words[words.index("--config") + 1]
    overrides = [
        "--args.output_dir", str(tmp_path / Path(config).stem), "--args.max_steps", "2",
        "--args.disable_tqdm", "true", "--data.init_args.train_size", "32", "--data.init_args.eval_size", "8",
        "--data.init_args.test_size", "8",
    ]  # fmt: skip
    at = words.index("--config") + 2
    return [*words[:at], *overrides, *words[at:]], redirect


def test_readme_names_each_config_command():
    commands = [command.removeprefix(PREFIX).split()[0] for command in readme_cli_commands()]
    assert {"fit", "validate", "predict"} <= set(commands), commands
    assert any("--print_config" in command for command in readme_cli_commands())


@pytest.mark.slow  # several tiny fits and evaluations in turn
def test_readme_cli_commands_run_in_order(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands name examples/*.yaml relative to the checkout
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what OMP_NUM_THREADS=1 does for the commands
    try:
        for command in readme_cli_commands():
            argv, redirect = shrunk_argv(command, tmp_path)
            capsys.readouterr()
            assert main(argv) == 0, (command, capsys.readouterr().err[-3000:])
            out = capsys.readouterr().out
            if redirect is not None:
                config = yaml.safe_load(out)
                assert {"args", "model", "data"} <= set(config), command
                (tmp_path / redirect).write_text(out, encoding="utf-8")
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / "cls" / "validate_results.json").is_file()
    assert (tmp_path / "seq2seq" / "predictions.npz").is_file()
    # The printed config is reusable: it parses back as a run config.
    assert main(["fit", "--config", str(tmp_path / "run.yaml"), "--print_config"]) == 0
