"""A launcher's restart continues the run (checkpoint/restart.py); a first start is the reference's."""

from __future__ import annotations

import pytest

from hf_lightning.checkpoint.restart import RESUME_ON_RESTART_ENV, LauncherRestart, launcher_restart
from tests.checkpoint.test_resume_safety import assert_bit_identical, train, weights


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"TORCHELASTIC_RESTART_COUNT": "0"}, None),
        ({"TORCHELASTIC_RESTART_COUNT": "2"}, LauncherRestart("torchrun's elastic agent", 2)),
        ({"SLURM_RESTART_COUNT": "1"}, LauncherRestart("a SLURM requeue", 1)),
        ({"SLURM_RESTART_COUNT": "x"}, None),
    ],
)
def test_the_restart_is_read_from_the_launchers_counter(environ, expected):
    assert launcher_restart(environ) == expected


def test_a_requeued_slurm_job_continues_from_its_last_checkpoint(tmp_path, monkeypatch, capsys):
    """The requeued script calls train() as the first run did; it continues and ends where an uninterrupted run ends."""
    uninterrupted = train(tmp_path / "full")
    train(tmp_path / "run", stop_at=5)  # the job stopped after update 5; checkpoint-4 is its last
    capsys.readouterr()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    requeued = train(tmp_path / "run")
    err = capsys.readouterr().err
    assert f"restart 1 by a SLURM requeue: continuing from {tmp_path / 'run' / 'checkpoint-4'}" in err
    assert requeued.state.global_step == 8
    assert_bit_identical(weights(requeued), weights(uninterrupted))


def _first_logged_step(trainer) -> int:
    return [entry["step"] for entry in trainer.state.log_history if "loss" in entry][0]


def test_the_opt_out_and_a_first_start_start_over(tmp_path, monkeypatch):
    train(tmp_path / "run", stop_at=5)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setenv(RESUME_ON_RESTART_ENV, "0")
    assert _first_logged_step(train(tmp_path / "run")) == 1  # from step 0, as the reference
    monkeypatch.delenv(RESUME_ON_RESTART_ENV)
    monkeypatch.delenv("SLURM_RESTART_COUNT")
    assert _first_logged_step(train(tmp_path / "run")) == 1  # no restart: the checkpoints there are not used
