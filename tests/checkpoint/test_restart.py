"""A launcher's restart continues the run (checkpoint/restart.py); a first start is the reference's."""

from __future__ import annotations

import shutil
import sys
import types

import pytest

from hf_lightning.checkpoint.restart import (
    RAY_TRAIN,
    RESUME_ON_RESTART_ENV,
    LauncherRestart,
    launcher_restart,
)
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


class _RayTrainSession:
    """`ray.train` as a restarted Ray Train worker sees it: `get_checkpoint()` hands over the last reported checkpoint
    (RayTrainReportCallback's layout: the trainer's folder under `checkpoint/`), or raises outside a session."""

    def __init__(self, path=None, outside=False):
        import pyarrow.fs

        self.checkpoint = None if path is None else types.SimpleNamespace(
            path=str(path), filesystem=pyarrow.fs.LocalFileSystem()
        )
        self.outside = outside

    def get_checkpoint(self):
        if self.outside:
            raise RuntimeError("Ray Train function utilities not initialized.")
        return self.checkpoint


def test_a_ray_train_restart_continues_from_rays_checkpoint(tmp_path, monkeypatch, capsys):
    """A group restarted by Ray (FailureConfig) gets its checkpoint from `ray.train.get_checkpoint()`, not from
    output_dir (the lost worker's disk may be gone); the opt-out and a process outside Ray Train start over."""
    uninterrupted = train(tmp_path / "full")
    train(tmp_path / "first", stop_at=5)
    reported = tmp_path / "ray" / "checkpoint_000000"
    shutil.copytree(tmp_path / "first" / "checkpoint-4", reported / "checkpoint")
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "ray.train", _RayTrainSession(reported))
    restarted = train(tmp_path / "elsewhere")  # a fresh disk: nothing of the first attempt's output_dir
    err = capsys.readouterr().err
    assert f"handed a checkpoint by {RAY_TRAIN}: continuing from Ray's checkpoint {reported}" in err
    assert f"resuming from {reported / 'checkpoint'} at step 4 of 8" in err and restarted.state.global_step == 8
    assert_bit_identical(weights(restarted), weights(uninterrupted))

    monkeypatch.setenv(RESUME_ON_RESTART_ENV, "0")
    assert _first_logged_step(train(tmp_path / "opted_out")) == 1
    monkeypatch.delenv(RESUME_ON_RESTART_ENV)
    monkeypatch.setitem(sys.modules, "ray.train", _RayTrainSession(outside=True))
    assert _first_logged_step(train(tmp_path / "driver")) == 1

    (reported / "checkpoint" / "trainer_state.json").unlink()
    monkeypatch.setitem(sys.modules, "ray.train", _RayTrainSession(reported))
    with pytest.raises(ValueError, match=r"Ray Train handed the run checkpoint .*RayTrainReportCallback"):
        train(tmp_path / "broken")
