"""Resume safety: no pickled code ever runs, and a run killed at any named point resumes bit-identically.

Loading uses safetensors for weights, JSON for the trainer state and `torch.load(weights_only=True)` for the
optimizer, scheduler, scaler and RNG files. The fault test SIGKILLs forked children of this (already imported)
process at named points: every write, rename and delete of a save (`checkpoint_files.SAVE_POINTS`, counted per
occurrence) and every optimizer-step boundary (`step:<N>`), selected with `HF_LIGHTNING_KILL_AT`.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import signal

import pytest
import torch

from hf_lightning import TrainingArguments
from hf_lightning.callbacks import TrainerCallback
from hf_lightning.checkpoint.fault_points import KILL_AT_ENV
from hf_lightning.checkpoint.files import is_complete_checkpoint
from hf_lightning.core.checkpoint_files import (
    COMPLETE_MARKER_NAME,
    OPTIMIZER_NAME,
    SAFE_WEIGHTS_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINING_ARGS_NAME,
    WEIGHTS_NAME,
)
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.checkpoint.chosen_checkpoints import record_chosen_checkpoints
from tests.checkpoint.forked_kill import run_in_killed_child
from tests.models import DropoutMLP, regression_data


class StopAt(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


# 10 items, batch 2, accumulation 2: 5 micro-batches per epoch in windows 2+2+1; saves at 2, 4, 6, 8.
SETTINGS = dict(
    use_cpu=True,
    report_to="none",
    disable_tqdm=True,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=2,
    max_steps=8,
    save_steps=2,
    save_total_limit=2,
    logging_steps=1,
    learning_rate=1e-2,
)


def train(output_dir, *, resume=None, stop_at=None, model_seed=0, asynchronous=False) -> HFLightningTrainer:
    trainer = HFLightningTrainer(
        model=DropoutMLP(model_seed),
        args=TrainingArguments(output_dir=str(output_dir), **SETTINGS),
        train_dataset=regression_data(10),
        callbacks=[StopAt(stop_at)] if stop_at is not None else [],
    )
    if asynchronous:  # checkpoints written by a background thread (hf_lightning/checkpoint/async_writes.py)
        from lightning.pytorch.plugins.io import AsyncCheckpointIO

        trainer.lightning_trainer_overrides = {"plugins": [AsyncCheckpointIO()]}
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def weights(trainer) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in trainer.model.state_dict().items()}


def step_logs(trainer) -> list[dict]:
    return [
        {k: v for k, v in entry.items() if not k.endswith(("_runtime", "_per_second"))}
        for entry in trainer.state.log_history
        if "train_loss" not in entry
    ]


def assert_bit_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    assert not [name for name in a if not torch.equal(a[name], b[name])]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run every resumed run must reproduce exactly."""
    return train(tmp_path_factory.mktemp("straight"))


# ---- pickled code never runs ------------------------------------------------------------------------------------


class Payload:
    """Unpickling this creates `marker`: a stand-in for arbitrary code."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def craft(path, marker, fmt: str) -> None:
    if fmt == "torch":
        torch.save({"state": Payload(str(marker))}, path)
    else:
        with open(path, "wb") as f:
            pickle.dump({"state": Payload(str(marker))}, f, protocol=2)


def assert_payload_is_live(path, marker, fmt: str) -> None:
    """The crafted file really runs code under an unsafe load (so the refusal below is meaningful)."""
    if fmt == "torch":
        torch.load(path, weights_only=False)
    else:
        with open(path, "rb") as f:
            pickle.load(f)
    assert marker.exists()
    marker.unlink()


@pytest.fixture
def stopped_run(tmp_path):
    """A run stopped at step 4 (checkpoints 2 and 4 on disk)."""
    run_dir = tmp_path / "run"
    train(run_dir, stop_at=4)
    return run_dir


@pytest.mark.parametrize("fmt", ["torch", "raw-pickle"])
@pytest.mark.parametrize("name", [OPTIMIZER_NAME, SCHEDULER_NAME, "rng_state.pth", SCALER_NAME, WEIGHTS_NAME])
def test_crafted_pickle_is_refused_and_never_runs(stopped_run, tmp_path, name, fmt):
    checkpoint = stopped_run / "checkpoint-4"
    if name == WEIGHTS_NAME:
        os.remove(checkpoint / SAFE_WEIGHTS_NAME)  # the .bin is only read when no safetensors file is there
    marker = tmp_path / "payload-ran"
    craft(checkpoint / name, marker, fmt)
    assert_payload_is_live(checkpoint / name, marker, fmt)
    with pytest.raises(ValueError, match=re.escape(str(checkpoint / name))):
        train(stopped_run, resume=str(checkpoint))
    assert not marker.exists()


def test_training_args_bin_is_never_loaded(stopped_run, tmp_path, straight):
    """As in the reference, resuming does not read training_args.bin: a crafted one is inert."""
    marker = tmp_path / "payload-ran"
    craft(stopped_run / "checkpoint-4" / TRAINING_ARGS_NAME, marker, "torch")
    resumed = train(stopped_run, resume=str(stopped_run / "checkpoint-4"), model_seed=7)
    assert not marker.exists()
    assert_bit_identical(weights(resumed), weights(straight))


def test_resume_true_skips_a_checkpoint_whose_files_are_not_plain(stopped_run, tmp_path, straight, monkeypatch):
    """A newest folder without our marker must be loadable to count as complete: a crafted one is passed over."""
    marker = tmp_path / "payload-ran"
    os.remove(stopped_run / "checkpoint-4" / COMPLETE_MARKER_NAME)
    craft(stopped_run / "checkpoint-4" / OPTIMIZER_NAME, marker, "torch")
    chosen = record_chosen_checkpoints(monkeypatch)
    resumed = train(stopped_run, resume=True, model_seed=7)
    assert chosen[-1] == str(stopped_run / "checkpoint-2")
    assert not marker.exists()
    assert_bit_identical(weights(resumed), weights(straight))


def test_reference_refuses_the_same_payload_with_another_error(stopped_run, tmp_path):
    """docs/divergences.md: transformers.Trainer refuses it too (weights_only=True), with `UnpicklingError`."""
    marker = tmp_path / "payload-ran"
    craft(stopped_run / "checkpoint-4" / OPTIMIZER_NAME, marker, "torch")
    with pytest.raises(pickle.UnpicklingError):
        reference_trainer(stopped_run).train(resume_from_checkpoint=str(stopped_run / "checkpoint-4"))
    assert not marker.exists()


def reference_trainer(output_dir):
    import transformers

    return transformers.Trainer(
        model=DropoutMLP(),
        args=transformers.TrainingArguments(output_dir=str(output_dir), **SETTINGS),
        train_dataset=regression_data(10),
    )


def test_checkpoint_without_trainer_state_is_refused(stopped_run):
    """docs/divergences.md: the reference fails with FileNotFoundError; ours is a ValueError naming the file."""
    os.remove(stopped_run / "checkpoint-4" / "trainer_state.json")
    with pytest.raises(ValueError, match=r"has no trainer_state\.json"):
        train(stopped_run, resume=str(stopped_run / "checkpoint-4"))
    with pytest.raises(FileNotFoundError):
        reference_trainer(stopped_run).train(resume_from_checkpoint=str(stopped_run / "checkpoint-4"))


def test_scaler_state_without_a_scaler_warns(stopped_run, straight, caplog):
    """docs/divergences.md: a `scaler.pt` (an fp16 run) resumed without fp16: the reference raises AttributeError
    (it has no scaler to load into); hf_lightning warns and resumes (the scaler only matters with fp16)."""
    torch.save(torch.amp.GradScaler("cpu").state_dict(), stopped_run / "checkpoint-4" / SCALER_NAME)
    # A copy for the reference: our resumed run rotates checkpoint-4 away (save_total_limit=2).
    shutil.copytree(stopped_run / "checkpoint-4", stopped_run / "fp16-checkpoint")
    with caplog.at_level("WARNING", logger="hf_lightning.checkpoint.resume"):
        resumed = train(stopped_run, resume=str(stopped_run / "checkpoint-4"), model_seed=7)
    assert "no grad scaler" in caplog.text
    assert_bit_identical(weights(resumed), weights(straight))
    with pytest.raises(AttributeError):
        reference_trainer(stopped_run).train(resume_from_checkpoint=str(stopped_run / "fp16-checkpoint"))


# ---- killed anywhere, resumed exactly ------------------------------------------------------------------------------

SAVE_POINTS_OF_A_RUN = (
    "model",
    "training_args",
    "optimizer",
    "scheduler",
    "rng",
    "trainer_state",
    "fsync",
    "marker",
)
KILL_POINTS = (
    [f"step:{step}" for step in range(3, 9)]
    + [f"{point}#2" for point in SAVE_POINTS_OF_A_RUN + ("rename", "rotate")]
    + [f"{point}#4" for point in ("model", "optimizer", "rng", "marker", "rename", "rotate")]
)


CHILD_TIMEOUT_S = 60


def killed_child(run_dir, kill_at: str, asynchronous: bool = False) -> int:
    """Train from scratch in a forked child that SIGKILLs itself at `kill_at`; returns its wait status."""

    def train_until_killed() -> None:
        os.environ[KILL_AT_ENV] = kill_at
        train(run_dir, asynchronous=asynchronous)

    return run_in_killed_child(train_until_killed, timeout_s=CHILD_TIMEOUT_S, what=kill_at)


@pytest.mark.slow
def test_kill_at_any_named_point_then_resume_is_bit_identical(tmp_path, straight):
    assert len(KILL_POINTS) >= 20
    for kill_at in KILL_POINTS:
        run_dir = tmp_path / kill_at.replace(":", "-").replace("#", "-")
        status = killed_child(run_dir, kill_at)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"{kill_at} was not reached"
        resumed = train(run_dir, resume=True, model_seed=7)
        assert resumed.state.global_step == 8, kill_at
        assert_bit_identical(weights(resumed), weights(straight))
        assert step_logs(resumed) == step_logs(straight), kill_at
        assert not [name for name in os.listdir(run_dir) if name.startswith(".")], kill_at
        shutil.rmtree(run_dir)


# With AsyncCheckpointIO the save points are reached by the writer thread while training goes on; `snapshot` and
# `wait_pending` by the training thread (the copy of a save; the next save, or the end of train(), waiting).
ASYNC_KILL_POINTS = [f"{point}#2" for point in ("snapshot", "write_begin") + SAVE_POINTS_OF_A_RUN + ("rename", "rotate")] + [
    "wait_pending#2",
    "wait_pending#4",
    "write_begin#4",
    "marker#4",
    "rotate#4",
]


@pytest.mark.slow
def test_kill_during_a_background_write_then_resume_is_bit_identical(tmp_path, straight):
    """A kill while the writer thread is writing leaves the previous checkpoint valid; the resume is exact."""
    for kill_at in ASYNC_KILL_POINTS:
        run_dir = tmp_path / kill_at.replace(":", "-").replace("#", "-")
        status = killed_child(run_dir, kill_at, asynchronous=True)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"{kill_at} was not reached"
        committed = sorted(name for name in os.listdir(run_dir) if name.startswith("checkpoint-"))
        if kill_at in ("write_begin#2", "model#2", "marker#2", "rename#2"):
            # The step-4 save had not committed: the step-2 checkpoint is there and complete.
            assert committed == ["checkpoint-2"], kill_at
        assert all(is_complete_checkpoint(str(run_dir / name)) for name in committed), kill_at
        resumed = train(run_dir, resume=True, model_seed=7, asynchronous=True)
        assert resumed.state.global_step == 8, kill_at
        assert_bit_identical(weights(resumed), weights(straight))
        assert step_logs(resumed) == step_logs(straight), kill_at
        assert not [name for name in os.listdir(run_dir) if name.startswith(".")], kill_at
        shutil.rmtree(run_dir)
