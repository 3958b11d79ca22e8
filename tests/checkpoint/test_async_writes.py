"""Asynchronous checkpoint writes (Lightning's `AsyncCheckpointIO` in `lightning_trainer_overrides`).

What blocks is proven with events at named points, not with wall time: the writer thread is held at a save point
while the training thread reaches the next step boundary.
"""

from __future__ import annotations

import json
import os
import shutil
import threading

import pytest
import safetensors.torch
import torch
from lightning.pytorch.plugins.io import AsyncCheckpointIO

from hf_lightning import TrainingArguments
from hf_lightning.callbacks import TrainerCallback
from hf_lightning.checkpoint.async_writes import BackgroundCheckpointWriter, copy_state
from hf_lightning.checkpoint.fault_points import fault_hook
from hf_lightning.checkpoint.files import is_complete_checkpoint
from hf_lightning.core.checkpoint_files import (
    COMPLETE_MARKER_NAME,
    SAFE_WEIGHTS_NAME,
    TRAINING_ARGS_NAME,
    numpy_safe_globals,
)
from hf_lightning.engine.lightning_bridge import check_lightning_overrides
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.checkpoint.test_resume_safety import SETTINGS, assert_bit_identical, step_logs, weights
from tests.models import DropoutMLP, regression_data


def make_trainer(
    output_dir, *, asynchronous: bool, model_seed: int = 0, eval_dataset=None, **overrides
) -> HFLightningTrainer:
    trainer = HFLightningTrainer(
        model=DropoutMLP(model_seed),
        args=TrainingArguments(output_dir=str(output_dir), **{**SETTINGS, **overrides}),
        train_dataset=regression_data(10),
        eval_dataset=eval_dataset,
    )
    if asynchronous:
        trainer.lightning_trainer_overrides = {"plugins": [AsyncCheckpointIO()]}
    return trainer


def load_file(path):
    name = os.path.basename(path)
    if name.endswith(".safetensors"):
        return safetensors.torch.load_file(path)
    if name.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    with numpy_safe_globals():
        return torch.load(path, weights_only=True)


def assert_same_content(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for key in a:
            assert_same_content(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b)):
            assert_same_content(x, y, f"{where}[{index}]")
    elif hasattr(a, "shape") and hasattr(a, "dtype"):  # numpy arrays of the RNG state
        assert (a == b).all(), where
    else:
        assert a == b, where


@pytest.fixture(scope="module")
def sync_and_async(tmp_path_factory):
    base = tmp_path_factory.mktemp("async-writes")
    sync = make_trainer(base / "sync", asynchronous=False)
    sync.train()
    reached: list[tuple[str, bool]] = []
    with fault_hook(lambda point: reached.append((point, threading.current_thread() is threading.main_thread()))):
        asynchronous = make_trainer(base / "async", asynchronous=True)
        asynchronous.train()
    return base, sync, asynchronous, reached


def test_async_checkpoints_hold_the_same_content_as_sync_ones(sync_and_async):
    base, sync, asynchronous, _ = sync_and_async
    assert sorted(os.listdir(base / "async")) == sorted(os.listdir(base / "sync")) == [
        "checkpoint-6", "checkpoint-8"
    ]
    for folder in ("checkpoint-6", "checkpoint-8"):
        sync_files, async_files = sorted(os.listdir(base / "sync" / folder)), sorted(os.listdir(base / "async" / folder))
        assert sync_files == async_files and COMPLETE_MARKER_NAME in async_files
        assert is_complete_checkpoint(str(base / "async" / folder))
        for name in sync_files:
            expected, got = load_file(str(base / "sync" / folder / name)), load_file(str(base / "async" / folder / name))
            if name == TRAINING_ARGS_NAME:
                expected.pop("output_dir"), got.pop("output_dir")
            if name == "trainer_state.json":
                for entries in (expected["log_history"], got["log_history"]):
                    for entry in entries:  # wall-clock speeds differ from run to run
                        for key in [k for k in entry if k.endswith(("_runtime", "_per_second"))]:
                            entry.pop(key)
            assert_same_content(expected, got, f"{folder}/{name}")
    assert_bit_identical(weights(asynchronous), weights(sync))
    assert step_logs(asynchronous) == step_logs(sync)


def test_files_are_written_by_the_background_thread_and_train_waits_for_the_last(sync_and_async):
    base, _, asynchronous, reached = sync_and_async
    writer_points = {point for point, on_main in reached if not on_main}
    assert {"write_begin", "model", "optimizer", "scheduler", "rng", "trainer_state", "fsync", "marker", "rename",
            "rotate"} <= writer_points
    assert {point for point, on_main in reached if on_main and not point.startswith("step:")} == {
        "snapshot", "wait_pending"
    }
    # A second save waits for the first: each snapshot after save 1 comes after the previous save's rotation.
    order = [point for point, _ in reached if point in ("snapshot", "rotate")]
    assert order == ["snapshot", "rotate"] * 4
    assert not asynchronous._checkpointer.writer.pending
    assert not [name for name in os.listdir(base / "async") if name.startswith(".")]


def test_training_continues_while_the_write_is_in_flight(tmp_path):
    """The writer is held at `fsync` of the step-2 save until the training thread reaches step 3's boundary."""
    held, release = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def hook(point: str) -> None:
        on_main = threading.current_thread() is threading.main_thread()
        if point == "fsync" and not on_main and "held" not in seen:
            seen["held"] = True
            held.set()
            seen["released"] = release.wait(timeout=30)
        elif point == "step:3" and on_main:
            # The training thread got here on its own; it only waits for the writer to be parked at its point.
            seen["step_3_while_held"] = held.wait(timeout=30) and not release.is_set()
            seen["checkpoint_2_absent"] = not os.path.exists(tmp_path / "checkpoint-2")
            release.set()

    with fault_hook(hook):
        make_trainer(tmp_path, asynchronous=True, max_steps=4, save_total_limit=None).train()
    assert seen == {"held": True, "released": True, "step_3_while_held": True, "checkpoint_2_absent": True}
    assert is_complete_checkpoint(str(tmp_path / "checkpoint-2"))
    assert is_complete_checkpoint(str(tmp_path / "checkpoint-4"))


def test_a_failed_background_write_is_raised_and_the_previous_checkpoint_stays(tmp_path):
    saves = []

    def hook(point: str) -> None:
        if point == "optimizer" and threading.current_thread() is not threading.main_thread():
            saves.append(point)
            if len(saves) == 2:
                raise OSError("disk full")

    trainer = make_trainer(tmp_path, asynchronous=True, save_total_limit=None)
    with fault_hook(hook), pytest.raises(RuntimeError, match=r"checkpoint-4 failed.*disk full"):
        trainer.train()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2"]
    assert is_complete_checkpoint(str(tmp_path / "checkpoint-2"))


def test_resume_waits_for_a_pending_write(tmp_path, sync_and_async):
    """A write still pending when train(resume_from_checkpoint=True) starts is committed before it chooses."""
    base, *_ = sync_and_async
    shutil.copytree(base / "sync" / "checkpoint-6", tmp_path / "checkpoint-6")
    entered_wait = threading.Event()

    def pending_write() -> None:  # commits checkpoint-8 only once the training thread waits for it
        if entered_wait.wait(timeout=30):
            shutil.copytree(base / "sync" / "checkpoint-8", tmp_path / ".checkpoint-8.tmp-x")
            os.rename(tmp_path / ".checkpoint-8.tmp-x", tmp_path / "checkpoint-8")

    trainer = make_trainer(tmp_path, asynchronous=True, model_seed=7)
    writer = trainer._checkpointer.writer = BackgroundCheckpointWriter()
    writer._thread = threading.Thread(target=pending_write)
    writer._thread.start()
    with fault_hook(lambda point: entered_wait.set() if point == "wait_pending" else None):
        trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 8
    # Resumed from the final checkpoint: nothing left to train, the weights are checkpoint-8's.
    saved = safetensors.torch.load_file(str(base / "sync" / "checkpoint-8" / SAFE_WEIGHTS_NAME))
    assert_bit_identical(weights(trainer), saved)


def test_copy_state_keeps_shared_storage_and_is_a_point_in_time_copy():
    weight = torch.arange(6.0).reshape(2, 3)
    state = {"a": weight, "tied": weight, "view": weight[1], "nested": [{"m": torch.ones(2)}], "step": 3}
    copied = copy_state(state)
    weight.add_(100)
    assert torch.equal(copied["a"], torch.arange(6.0).reshape(2, 3))
    assert copied["a"].untyped_storage().data_ptr() == copied["tied"].untyped_storage().data_ptr()
    assert copied["view"].untyped_storage().data_ptr() == copied["a"].untyped_storage().data_ptr()
    assert torch.equal(copied["view"], torch.tensor([3.0, 4.0, 5.0]))
    assert copied["step"] == 3 and torch.equal(copied["nested"][0]["m"], torch.ones(2))


def test_plugins_override_accepts_only_async_checkpoint_io():
    plugin = AsyncCheckpointIO()
    assert check_lightning_overrides({"plugins": plugin}) == {"plugins": [plugin]}
    yaml_entry = {"class_path": "lightning.pytorch.plugins.io.AsyncCheckpointIO"}
    assert check_lightning_overrides({"plugins": [yaml_entry]}) == {"plugins": [yaml_entry]}
    from lightning.pytorch.plugins import MixedPrecision

    for bad in (MixedPrecision("bf16-mixed", "cpu"), "16-mixed", {"class_path": "lightning.pytorch.plugins.io.TorchCheckpointIO"}):
        with pytest.raises(ValueError, match=r"'plugins'.*AsyncCheckpointIO.*bf16 / fp16"):
            check_lightning_overrides({"plugins": [bad]})


def test_yaml_trainer_section_instantiates_the_plugin():
    from hf_lightning.cli.lightning_cli import _lightning_overrides

    overrides = _lightning_overrides({"plugins": [{"class_path": "lightning.pytorch.plugins.io.AsyncCheckpointIO"}]})
    (plugin,) = overrides["plugins"]
    assert isinstance(plugin, AsyncCheckpointIO)


def test_best_model_tracking_and_rotation_match_the_synchronous_run(tmp_path):
    """With evaluation and `save_total_limit=1`, the best checkpoint, the kept folders and the loaded best model
    are the synchronous run's (the best folder of a previous save is committed before the next save looks)."""
    settings = dict(
        eval_strategy="steps", eval_steps=2, save_total_limit=1, load_best_model_at_end=True,
        metric_for_best_model="loss", greater_is_better=True,  # the best is the worst loss: not the last save
    )
    runs = {}
    for asynchronous in (False, True):
        trainer = make_trainer(
            tmp_path / str(asynchronous), asynchronous=asynchronous, eval_dataset=regression_data(4), **settings
        )
        trainer.train()
        runs[asynchronous] = trainer
    sync, background = runs[False], runs[True]
    assert os.path.basename(background.state.best_model_checkpoint) == os.path.basename(
        sync.state.best_model_checkpoint
    )
    assert sorted(os.listdir(tmp_path / "True")) == sorted(os.listdir(tmp_path / "False"))
    assert_bit_identical(weights(background), weights(sync))


# The reference's hooks that write a checkpoint's files (called from its `_save_checkpoint`).
SAVE_HOOKS = ("_save", "_save_optimizer_and_scheduler", "_save_rng_state", "_save_scaler", "save_model")


@pytest.mark.parametrize("hook", SAVE_HOOKS)
def test_an_overridden_save_hook_writes_on_the_training_thread_at_each_save(tmp_path, hook):
    """With background writes requested, a subclass's save hook needs the live trainer: it is called at each save
    step on the training thread, the save is written there (synchronously), and on_save comes at its own step."""
    calls, announced = [], []

    def override(self, *args, **kwargs):
        calls.append((self.state.global_step, threading.current_thread() is threading.main_thread()))
        return getattr(super(Overriding, self), hook)(*args, **kwargs)

    Overriding = type("Overriding", (HFLightningTrainer,), {hook: override})

    class Announced(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            announced.append((state.global_step, is_complete_checkpoint(f"{args.output_dir}/checkpoint-{state.global_step}")))

    args = TrainingArguments(output_dir=str(tmp_path), **{**SETTINGS, "max_steps": 4, "save_total_limit": None})
    trainer = Overriding(
        model=DropoutMLP(0), args=args, train_dataset=regression_data(10), callbacks=[Announced()]
    )
    trainer.lightning_trainer_overrides = {"plugins": [AsyncCheckpointIO()]}
    trainer.train()
    assert calls == [(2, True), (4, True)]
    assert announced == [(2, True), (4, True)]
    assert trainer._checkpointer.writer is None or not trainer._checkpointer.writer.pending
    for folder in ("checkpoint-2", "checkpoint-4"):
        assert is_complete_checkpoint(str(tmp_path / folder))
