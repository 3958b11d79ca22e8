"""accelerator_config's gradient_accumulation_kwargs (num_steps, sync_each_batch) against the reference.

Bar: equal global_step, log_history and final weights (as tests/parity/test_train_parity.py).
"""

from __future__ import annotations

import contextlib

from hf_lightning import TrainingArguments
from hf_lightning.engine.trainer import HFLightningTrainer
from tests.parity.harness import assert_parity, run_parity
from tests.parity.models import RegressionMLP, make_regression_mlp, regression_data

ARGS = dict(per_device_train_batch_size=4, learning_rate=1e-2, logging_steps=1, num_train_epochs=1)


def _accumulation(**kwargs) -> dict:
    return {"gradient_accumulation_kwargs": dict(kwargs)}


def test_num_steps_sets_the_accumulation_window(tmp_path):
    # 32 samples, batch 4: 8 micro-batches, so 4 updates of 2 (8 would mean num_steps was ignored).
    result = run_parity(
        make_regression_mlp(),
        regression_data(32),
        tmp_path,
        accelerator_config=_accumulation(num_steps=2),
        **ARGS,
    )
    assert_parity(result)
    assert result.ours.trainer.state.global_step == 4
    assert [entry["step"] for entry in result.ours.log_history[:-1]] == [1, 2, 3, 4]
    # Documented divergence: the reference writes the window into its arguments, ours plan it.
    assert result.reference.trainer.args.gradient_accumulation_steps == 2
    assert result.ours.trainer.args.gradient_accumulation_steps == 1
    assert result.ours.trainer.plan.module.gradient_accumulation_steps == 2


def test_num_steps_changes_the_run_against_plain_arguments(tmp_path):
    # The same run without num_steps makes one update per micro-batch: the setting is what changes it.
    plain = run_parity(make_regression_mlp(), regression_data(32), tmp_path / "plain", **ARGS)
    assert plain.ours.trainer.state.global_step == plain.reference.trainer.state.global_step == 8


def test_sync_each_batch_trains_like_the_reference(tmp_path):
    result = run_parity(
        make_regression_mlp(),
        regression_data(32),
        tmp_path,
        accelerator_config=_accumulation(sync_each_batch=True),
        gradient_accumulation_steps=2,
        **ARGS,
    )
    assert_parity(result)


class _NoSyncCounting(RegressionMLP):
    """A model that records when the engine skips the gradient all-reduce (`no_sync`, as DDP's wrapper)."""

    def __init__(self) -> None:
        super().__init__()
        self.no_sync_entries = 0

    @contextlib.contextmanager
    def no_sync(self):
        self.no_sync_entries += 1
        yield


def _no_sync_entries(tmp_path, **accumulation) -> int:
    model = _NoSyncCounting()
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        gradient_accumulation_steps=4,
        accelerator_config=_accumulation(**accumulation),
        **ARGS,
    )
    HFLightningTrainer(model=model, args=args, train_dataset=regression_data(32)).train()
    return model.no_sync_entries


def test_sync_each_batch_never_enters_no_sync(tmp_path):
    # 8 micro-batches in windows of 4: three of each four skip the all-reduce, unless every batch syncs.
    assert _no_sync_entries(tmp_path / "default") == 6
    assert _no_sync_entries(tmp_path / "each", sync_each_batch=True) == 0
