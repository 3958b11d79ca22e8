"""No host synchronisation on steps that do not log (issue: benchmarks, item 3), with the telemetry on (its
default): the data and optimizer clocks and the token counter read nothing from the device before a window closes.

Between the end of a step that does not log, evaluate or save and the end of the next one, the training
step must not call `.item()`, `.tolist()`, `.numpy()`, `.cpu()` or `float()/int()/bool()` on tensors: on a
GPU each would wait for the device. Here on CPU they are counted by call site (benchmarks/host_syncs.py).
Not the trainer's: the data loader's sampler turning its CPU permutation into a list (host-side work), and
the model's own forward (transformers' GPT-2 checks its padding mask with a Python `if`, whoever trains it).
"""

from __future__ import annotations

import pytest

from benchmarks.host_syncs import SyncCounter
from hf_lightning import RunGuard, Trainer, TrainerCallback, TrainingArguments
from tests.models import RegressionMLP, make_tiny_gpt2, padded_lm_data, regression_data

NOT_THE_TRAINER = ("torch/utils/data/", "transformers/models/", "transformers/masking_utils.py")


class QuietWindows(TrainerCallback):
    """Switch the counter on from the end of a step that did not log until the end of the next step."""

    def __init__(self, counter: SyncCounter) -> None:
        self.counter = counter

    def on_step_end(self, args, state, control, **kwargs):
        if self.counter.active:
            self.counter.active = False
            self.counter.windows += 1
        quiet = not (control.should_log or control.should_evaluate or control.should_save)
        self.counter.active = quiet and state.global_step < state.max_steps


def _count(tmp_path, model, data, guard=None, **arguments) -> SyncCounter:
    counter = SyncCounter()
    args = TrainingArguments(
        output_dir=str(tmp_path),
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=5,
        **arguments,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[QuietWindows(counter)] + ([guard] if guard is not None else []))
    assert trainer._telemetry is not None  # measured: the step's clocks and counters run in the counted windows
    counter.install()
    try:
        trainer.train()
    finally:
        counter.uninstall()
    return counter


@pytest.mark.parametrize(
    "scenario",
    ["regression", "causal_lm_accumulation", "run_guard_rollback", "run_guard_stop", "run_guard_skip"],
)
def test_no_host_sync_on_non_logging_steps(tmp_path, scenario):
    if scenario == "regression":
        counter = _count(
            tmp_path, RegressionMLP(), regression_data(64), per_device_train_batch_size=4, max_steps=12
        )
    elif scenario.startswith("run_guard"):
        # The run guard decides at training logs only (engine/run_guard.py), grad norm watched too; `skip` also
        # stages its snapshot there.
        guard = RunGuard(scenario.rsplit("_", 1)[1], grad_norm=True)
        counter = _count(
            tmp_path, make_tiny_gpt2(), padded_lm_data(48), guard=guard, per_device_train_batch_size=2,
            gradient_accumulation_steps=2, max_steps=12,
        )  # fmt: skip
        assert guard.summary == {"events": [], "skipped_windows": [], "rollbacks": 0}
    else:
        # Accumulation with num_items_in_batch counted over the window, the NaN/Inf loss filter on, clipping.
        counter = _count(
            tmp_path,
            make_tiny_gpt2(),
            padded_lm_data(48),
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            max_steps=12,
        )
    assert counter.windows >= 8
    syncs = {site: n for site, n in counter.sites.items() if not any(part in site for part in NOT_THE_TRAINER)}
    assert syncs == {}, f"host syncs on non-logging steps: {syncs}"


def test_the_counter_sees_a_sync_in_the_step(tmp_path, monkeypatch):
    """The check can fail: a training step that reads its loss each step is caught."""
    original = Trainer.training_step

    def reading_step(self, model, inputs, num_items_in_batch=None):
        loss = original(self, model, inputs, num_items_in_batch)
        loss.item()
        return loss

    monkeypatch.setattr(Trainer, "training_step", reading_step)
    counter = _count(
        tmp_path, RegressionMLP(), regression_data(64), per_device_train_batch_size=4, max_steps=12
    )
    assert any("test_host_syncs.py" in site for site in counter.sites)
