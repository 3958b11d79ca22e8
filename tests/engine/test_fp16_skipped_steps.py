"""fp16 loss scaling: a step the gradient scaler skips does not step the scheduler (R5.6, R7.6).

The reference trains fp16 on CPU without a scaler, so the scaler path only runs on a GPU there. Here the
Lightning fp16 plugin is given a CPU `GradScaler` so the update logic around it runs on this machine:
the steps whose gradients are not finite are skipped by the scaler, the scheduler lags the optimizer-step
count by exactly those steps, and `global_step` still counts every update, as in the reference.
"""

from __future__ import annotations

import torch
from torch import nn

import hf_lightning.engine.lightning_bridge as bridge
from hf_lightning import Trainer, TrainerCallback, TrainingArguments
from hf_lightning.engine.precision import forward_only_mixed_precision_class
from tests.models import regression_data

OVERFLOW_AT_STEPS = {2, 5}  # 1-based updates whose loss is made infinite


class OverflowingRegressor(nn.Module):
    """A linear regressor whose loss is inf on chosen updates (the trainer sets `next_step`)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 1)
        self.next_step = 1

    def forward(self, x, labels=None):
        logits = self.linear(x).squeeze(-1)
        out = {"logits": logits}
        if labels is not None:
            loss = nn.functional.mse_loss(logits, labels)
            out["loss"] = loss * float("inf") if self.next_step in OVERFLOW_AT_STEPS else loss
        return out


class StepTracker(TrainerCallback):
    """Tells the model which update comes next and records the scaler's scale and the scheduler's count."""

    def __init__(self, model: OverflowingRegressor) -> None:
        self.model = model
        self.trainer = None
        self.scales: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.model.next_step = state.global_step + 1

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.scales.append(float(self.trainer.lightning_trainer.precision_plugin.scaler.get_scale()))


def test_skipped_fp16_steps_do_not_step_the_scheduler(tmp_path, monkeypatch):
    plugin_class = forward_only_mixed_precision_class()
    monkeypatch.setattr(
        bridge,
        "lightning_precision_kwargs",
        lambda precision: {"plugins": [plugin_class("16-mixed", device="cpu")]},
    )
    model = OverflowingRegressor()
    tracker = StepTracker(model)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=6,
        per_device_train_batch_size=2,
        learning_rate=0.1,
        lr_scheduler_type="linear",
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
    )
    trainer = Trainer(model=model, args=args, train_dataset=regression_data(12), callbacks=[tracker])
    tracker.trainer = trainer
    trainer.train()

    assert trainer.state.global_step == 6
    # The scaler halves its scale after each skipped step and only then.
    drops = [i + 1 for i in range(1, len(tracker.scales)) if tracker.scales[i] < tracker.scales[i - 1]]
    first_drop = [1] if tracker.scales[0] < 2.0**16 else []
    assert first_drop + drops == sorted(OVERFLOW_AT_STEPS)
    # The scheduler stepped once per update that was not skipped.
    assert trainer.lr_scheduler.last_epoch == 6 - len(OVERFLOW_AT_STEPS)
    # The logged learning rate repeats after a skipped step (the schedule did not move).
    rates = [entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry]
    assert rates[2] == rates[1] and rates[5] == rates[4]
    assert len(set(rates)) == 6 - len(OVERFLOW_AT_STEPS)
