"""accelerator_config's gradient_accumulation_kwargs (num_steps, sync_each_batch) against the reference.

Bar: equal global_step, log_history and final weights (as tests/parity/test_train_parity.py).
"""

from __future__ import annotations

import contextlib

from hf_lightning import TrainingArguments
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import RegressionMLP, make_regression_mlp, regression_data
from tests.parity.harness import assert_parity, run_parity

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
    # Both trainers write the window into their arguments and num_steps=1 into the kwargs, as the reference's
    # constructor does; the plan holds the same window.
    for side in (result.reference, result.ours):
        assert side.trainer.args.gradient_accumulation_steps == 2
        assert side.trainer.args.accelerator_config.gradient_accumulation_kwargs["num_steps"] == 1
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


def test_a_second_trainer_on_folded_arguments_is_refused_like_the_reference(tmp_path):
    # After the first trainer folded num_steps into the arguments, they hold a window of 2 next to num_steps=1:
    # the reference's constructor refuses that combination, and so does ours (naming the two settings).
    import pytest
    import transformers

    def build(trainer_cls, args_cls):
        args = args_cls(
            output_dir=str(tmp_path), use_cpu=True, report_to="none", accelerator_config=_accumulation(num_steps=2)
        )
        trainer_cls(model=make_regression_mlp(), args=args, train_dataset=regression_data(8))
        return args

    reference_args = build(transformers.Trainer, transformers.TrainingArguments)
    with pytest.raises(ValueError, match="num_steps"):
        transformers.Trainer(model=make_regression_mlp(), args=reference_args, train_dataset=regression_data(8))
    our_args = build(HFLightningTrainer, TrainingArguments)
    with pytest.raises(ValueError, match="num_steps"):
        HFLightningTrainer(model=make_regression_mlp(), args=our_args, train_dataset=regression_data(8))
