"""Ctrl+C during `hf-lightning fit` ends with one line naming the last complete checkpoint and the command that
resumes from it (exit status 130, no traceback); that command resumes the run."""

from __future__ import annotations

import lightning.pytorch as pl
import yaml

from hf_lightning.cli.data_sources import CLI_VOCAB_SIZE
from hf_lightning.cli.lightning_cli import main, resume_command
from hf_lightning.engine.interrupt_report import resume_line


class InterruptAtStep(pl.Callback):
    """Stands in for Ctrl+C: a KeyboardInterrupt once training has reached `step` (Lightning's global step)."""

    def __init__(self, step: int = 3):
        self.step = step

    def on_train_batch_end(self, trainer, *args, **kwargs):
        if trainer.global_step == self.step:
            raise KeyboardInterrupt


def _config(tmp_path, interrupt: bool) -> str:
    config = {
        "args": {"output_dir": str(tmp_path / "out"), "max_steps": 4, "save_steps": 2, "report_to": "none",
                 "use_cpu": True, "disable_tqdm": True, "logging_steps": 1},
        "model": {"class_path": "hf_lightning.cli.embedded.TinyTransformerClassifier",
                  "init_args": {"vocab_size": CLI_VOCAB_SIZE, "d_model": 16, "dim_feedforward": 32, "num_layers": 1}},
        "data": {"class_path": "hf_lightning.cli_data.EmbeddedClassificationData",
                 "init_args": {"train_size": 64, "eval_size": 8, "test_size": 8}},
    }  # fmt: skip
    if interrupt:
        config["trainer"] = {"callbacks": [{"class_path": f"{__name__}.InterruptAtStep"}]}
    path = tmp_path / ("interrupted.yaml" if interrupt else "run.yaml")
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return str(path)


def test_ctrl_c_in_fit_names_the_checkpoint_and_the_command_that_resumes(tmp_path, capsys):
    assert main(["fit", "--config", _config(tmp_path, interrupt=True)]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("hf_lightning: train() interrupted")]
    checkpoint = str(tmp_path / "out" / "checkpoint-2")
    expected = (
        f"hf_lightning: train() interrupted (Ctrl+C) at step 3; last complete checkpoint: {checkpoint}; resume "
        f"with: hf-lightning fit --config {tmp_path / 'interrupted.yaml'} --ckpt_path {checkpoint}"
    )
    assert lines == [expected], err[-3000:]
    # The named command (the interrupting callback left out of the config) resumes and finishes the run.
    assert main(["fit", "--config", _config(tmp_path, interrupt=False), "--ckpt_path", checkpoint]) == 0
    assert (tmp_path / "out" / "checkpoint-4").is_dir()
    # The command was this run's only: a later train() in the same process names the call again.
    assert "resume with: trainer.train(resume_from_checkpoint=" in resume_line(str(tmp_path / "out"), 4, "x")


def test_the_resume_command_replaces_an_earlier_ckpt_path():
    assert resume_command(["fit", "--config", "a b.yaml", "--ckpt_path", "x", "--ckpt_path=y"]) == (
        "hf-lightning fit --config 'a b.yaml' --ckpt_path {checkpoint}"
    )


def test_without_a_checkpoint_the_line_says_a_new_run_starts_over(tmp_path):
    line = resume_line(str(tmp_path), 7, "train() interrupted (Ctrl+C)")
    assert line.startswith("hf_lightning: train() interrupted (Ctrl+C) at step 7;") and "starts over" in line
