"""Backward and optimizer step skip Lightning's hook dispatch only when nothing would see it (update_dispatch.py)."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from hf_lightning import TrainingArguments
from hf_lightning.engine.update_dispatch import hook_dispatch_is_idle
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import make_regression_mlp, regression_data


class HookCounter(pl.Callback):
    """Counts the three hooks Lightning dispatches around a manual backward and optimizer step."""

    def __init__(self) -> None:
        self.calls = {"on_before_backward": 0, "on_after_backward": 0, "on_before_optimizer_step": 0}

    def on_before_backward(self, trainer, pl_module, loss):
        self.calls["on_before_backward"] += 1

    def on_after_backward(self, trainer, pl_module):
        self.calls["on_after_backward"] += 1

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.calls["on_before_optimizer_step"] += 1


class UnrelatedCallback(pl.Callback):
    """Overrides none of the dispatched hooks: the direct path stays on."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pass


def _train(tmp_path, callbacks) -> HFLightningTrainer:
    # 14 samples, batch 3 -> 5 micro-batches per epoch; GA 2 -> 3 updates per epoch; 2 epochs.
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        per_device_train_batch_size=3,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=3,
    )
    trainer = HFLightningTrainer(
        model=make_regression_mlp(), args=args, train_dataset=regression_data(14), callbacks=callbacks
    )
    trainer.train()
    return trainer


def test_direct_and_dispatched_updates_are_the_same_run(tmp_path):
    direct = _train(tmp_path / "direct", [UnrelatedCallback()])
    counter = HookCounter()
    dispatched = _train(tmp_path / "dispatched", [counter])

    assert direct.lightning_trainer.lightning_module._update_dispatch.direct(direct.lightning_trainer) is True
    assert (
        dispatched.lightning_trainer.lightning_module._update_dispatch.direct(dispatched.lightning_trainer)
        is False
    )
    # Each hook ran for every micro-batch / every update on the dispatched run.
    assert counter.calls == {"on_before_backward": 10, "on_after_backward": 10, "on_before_optimizer_step": 6}
    for trainer in (direct, dispatched):
        assert trainer.state.global_step == 6
        assert trainer.lightning_trainer.global_step == 6  # Lightning's optimizer-step progress was counted
    assert [entry.get("loss") for entry in direct.state.log_history] == [
        entry.get("loss") for entry in dispatched.state.log_history
    ]
    for ours, theirs in zip(direct.model.state_dict().values(), dispatched.model.state_dict().values()):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("hook", ["on_before_backward", "on_after_backward", "on_before_optimizer_step"])
def test_any_callback_overriding_a_dispatched_hook_keeps_the_dispatch(hook):
    callback = type("OneHook", (pl.Callback,), {hook: lambda self, *args: None})()
    assert hook_dispatch_is_idle(pl.Trainer(accelerator="cpu", devices=1, logger=False)) is True
    assert (
        hook_dispatch_is_idle(pl.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[callback]))
        is False
    )


@pytest.mark.parametrize(
    "settings",
    [{"profiler": "simple"}, {"precision": "bf16-mixed"}, {"strategy": "ddp", "devices": 2}],
    ids=["profiler", "mixed-precision", "ddp"],
)
def test_profilers_other_precisions_and_strategies_keep_the_dispatch(settings):
    trainer = pl.Trainer(**{"accelerator": "cpu", "devices": 1, "logger": False, **settings})
    assert hook_dispatch_is_idle(trainer) is False


def test_a_profiler_subclassing_the_pass_through_one_keeps_the_dispatch():
    from lightning.pytorch.profilers import PassThroughProfiler

    class Timing(PassThroughProfiler):
        pass

    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, profiler=Timing())
    assert hook_dispatch_is_idle(trainer) is False


def test_a_module_overriding_backward_keeps_the_dispatch(tmp_path):
    from hf_lightning.engine.module import HFLightningModule

    class LoudBackward(HFLightningModule):
        def backward(self, loss, *args, **kwargs):
            loss.backward(*args, **kwargs)

    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False)
    facade = HFLightningTrainer(
        model=make_regression_mlp(),
        args=TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none"),
    )
    trainer.strategy.connect(LoudBackward(facade))
    assert hook_dispatch_is_idle(trainer) is False
    trainer.strategy.connect(HFLightningModule(facade))
    assert hook_dispatch_is_idle(trainer) is True
