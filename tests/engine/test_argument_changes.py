"""Arguments changed after the trainer was built (setfit rewrites about twenty): `train()` reads a field the
reference reads when training starts, keeps (with a warning naming it) one the reference reads only in its
constructor, and refuses before training a value the translation refuses. Each side against the reference doing the
same change."""

from __future__ import annotations

import pytest
import torch
import transformers

from hf_lightning import Trainer, TrainingArguments
from tests.models import make_regression_mlp, regression_data


def _run(trainer_cls, args_cls, tmp_path, change: dict, **fields):
    torch.manual_seed(0)
    args = args_cls(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=2, max_steps=4,
        logging_steps=1, learning_rate=0.1, save_strategy="no", disable_tqdm=True, seed=0, **fields,
    )
    trainer = trainer_cls(model=make_regression_mlp(), args=args, train_dataset=regression_data(16))
    for name, value in change.items():
        setattr(trainer.args, name, value)
    trainer.train()
    return trainer


def _history(trainer) -> list[dict]:
    return [{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k} for e in trainer.state.log_history]


@pytest.mark.parametrize("change", [{"gradient_accumulation_steps": 2}, {"max_grad_norm": 0.01},
                                    {"learning_rate": 0.01, "lr_scheduler_type": "constant"}])
def test_a_field_read_at_train_start_is_read_after_a_change(tmp_path, change):
    reference = _run(transformers.Trainer, transformers.TrainingArguments, tmp_path / "ref", change)
    ours = _run(Trainer, TrainingArguments, tmp_path / "ours", change)
    unchanged = _run(Trainer, TrainingArguments, tmp_path / "unchanged", {})
    assert _history(ours) == _history(reference)
    assert _history(ours) != _history(unchanged)  # the change is observed, not ignored
    assert ours.plan.module.gradient_accumulation_steps == reference.args.gradient_accumulation_steps


def test_a_field_read_in_the_constructor_keeps_its_value_and_is_named(tmp_path):
    change = {"per_device_train_batch_size": 4}
    reference = _run(transformers.Trainer, transformers.TrainingArguments, tmp_path / "ref", change)
    with pytest.warns(UserWarning, match=r"TrainingArguments.per_device_train_batch_size changed after the trainer "
                                         r"was built \(2 -> 4\).*keeps 2"):
        ours = _run(Trainer, TrainingArguments, tmp_path / "ours", change)
    assert ours.state.train_batch_size == reference.state.train_batch_size == 2
    assert _history(ours) == _history(reference)


def test_a_refused_value_set_after_construction_is_refused_before_training(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=2)
    trainer = Trainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(8))
    trainer.args.optim = "no_such_optimizer"
    with pytest.raises(ValueError, match="optim"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_a_field_evaluation_reads_is_read_after_a_change(tmp_path):
    """evaluate() / predict() read the plan's evaluation section: a field set on `args` after construction is
    translated again there, so predict() returns what the reference's does with the same change."""
    outputs = {}
    for name, trainer_cls, args_cls, change in (
        ("reference", transformers.Trainer, transformers.TrainingArguments, True),
        ("ours", Trainer, TrainingArguments, True),
        ("unchanged", Trainer, TrainingArguments, False),
    ):
        args = args_cls(output_dir=str(tmp_path / name), use_cpu=True, report_to="none", disable_tqdm=True)
        trainer = trainer_cls(model=make_regression_mlp(), args=args, train_dataset=regression_data(8))
        if change:
            trainer.args.prediction_loss_only = True
        outputs[name] = trainer.predict(regression_data(6))
    assert outputs["reference"].predictions is None and outputs["ours"].predictions is None
    assert outputs["unchanged"].predictions is not None  # the change is observed, not ignored
    assert outputs["ours"].metrics["test_loss"] == pytest.approx(outputs["reference"].metrics["test_loss"], abs=1e-6)
