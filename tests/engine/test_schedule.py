"""Step and epoch arithmetic (R2.1-R2.10), table-driven."""

from __future__ import annotations

import sys

import pytest

import hf_lightning.engine.schedule as schedule


@pytest.mark.parametrize(
    "len_dl,ga,expected",
    [(4, 3, 2), (4, 2, 2), (5, 2, 3), (1, 4, 1), (0, 2, 1), (10, 1, 10)],
)
def test_updates_per_epoch(len_dl, ga, expected):
    assert schedule.updates_per_epoch(len_dl, ga) == expected


@pytest.mark.parametrize("len_dl,ga", [(4, 3), (4, 2), (5, 2), (7, 3), (3, 1)])
def test_sync_steps_match_window_sizes(len_dl, ga):
    """Optimizer steps per epoch (R2.5) equal the number of windows, and windows tile the epoch."""
    upe = schedule.updates_per_epoch(len_dl, ga)
    syncs = [b for b in range(len_dl) if schedule.is_sync_step(b, len_dl, ga)]
    windows = [schedule.window_size(u, upe, len_dl, ga) for u in range(upe)]
    assert len(syncs) == upe
    assert sum(windows) == len_dl
    assert [sum(windows[: i + 1]) - 1 for i in range(upe)] == syncs


def test_r2_1_last_window():
    # 10 samples, batch 3 -> 4 micro-batches, GA 3 -> windows of 3 and 1.
    assert schedule.last_window_size(4, 3) == 1
    assert schedule.last_window_size(6, 3) == 3


def test_r2_2_fractional_epochs():
    values = schedule.initial_training_values(
        max_steps_arg=-1,
        num_train_epochs_arg=2.5,
        gradient_accumulation_steps=2,
        len_dataloader=4,
        num_examples_in_loader=10,
        total_train_batch_size=6,
    )
    assert values.num_update_steps_per_epoch == 2
    assert values.max_steps == 5
    assert values.num_train_epochs == 3
    assert values.num_train_samples == 25.0


def test_r2_3_max_steps_bounds_epochs():
    values = schedule.initial_training_values(
        max_steps_arg=7,
        num_train_epochs_arg=3,
        gradient_accumulation_steps=1,
        len_dataloader=3,
        num_examples_in_loader=6,
        total_train_batch_size=2,
    )
    assert (values.max_steps, values.num_train_epochs, values.num_train_samples) == (7, 3, 14)


def test_r2_4_unsized():
    values = schedule.initial_training_values(
        max_steps_arg=4,
        num_train_epochs_arg=3,
        gradient_accumulation_steps=2,
        len_dataloader=None,
        num_examples_in_loader=None,
        total_train_batch_size=1,
    )
    assert values.num_train_epochs == sys.maxsize
    assert values.num_update_steps_per_epoch == 4
    assert values.steps_in_epoch == 8
    with pytest.raises(ValueError, match="max_steps"):
        schedule.initial_training_values(
            max_steps_arg=-1,
            num_train_epochs_arg=3,
            gradient_accumulation_steps=1,
            len_dataloader=None,
            num_examples_in_loader=None,
            total_train_batch_size=1,
        )


def test_r2_6_epoch_float():
    assert schedule.epoch_float(0, 2, 4) == 0.75
    assert schedule.epoch_float(1, 3, 4) == 2.0


@pytest.mark.parametrize("value,max_steps,expected", [(0.25, 10, 3), (0.1, 33, 4), (5, 10, 5), (1.0, 10, 1.0)])
def test_r2_9_ratio_steps(value, max_steps, expected):
    assert schedule.resolve_ratio_steps(value, max_steps) == expected


def test_matches_reference_set_initial_training_values(tmp_path):
    """Our tuple equals the reference's for a few loaders (sized, with max_steps, fractional epochs)."""
    import transformers
    from torch.utils.data import DataLoader

    from tests.models import make_regression_mlp, regression_data

    for kwargs in ({"num_train_epochs": 2.5}, {"max_steps": 7}, {"gradient_accumulation_steps": 3}):
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=3, report_to="none", **kwargs
        )
        trainer = transformers.Trainer(model=make_regression_mlp(), args=args)
        loader = DataLoader(regression_data(10), batch_size=3)
        expected = trainer.set_initial_training_values(args, loader)
        ours = schedule.initial_training_values(
            max_steps_arg=args.max_steps,
            num_train_epochs_arg=args.num_train_epochs,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            len_dataloader=len(loader),
            num_examples_in_loader=10,
            total_train_batch_size=trainer.get_total_train_batch_size(args),
        )
        assert ours.as_tuple() == tuple(expected)
