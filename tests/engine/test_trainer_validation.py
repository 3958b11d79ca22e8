"""Trainer-construction errors (API-1.1.4 and the T rules): same exception type as the
reference, raised before any training starts, naming the field."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data import IterableDataset

from tests.models import make_regression_mlp, regression_data


class Unsized(IterableDataset):
    def __iter__(self):
        yield from regression_data(4).items


def _cases():
    def mlp():
        return make_regression_mlp()

    optimizer = lambda m: torch.optim.SGD(m.parameters(), lr=0.1)  # noqa: E731
    return [
        ("no model", RuntimeError, {}, lambda m: {}),
        ("model and model_init", ValueError, {}, lambda m: {"model": m, "model_init": mlp}),
        ("model_init with optimizers", RuntimeError, {}, lambda m: {"model_init": mlp, "optimizers": (optimizer(m), None)}),
        (
            "optimizers and optimizer_cls_and_kwargs",
            RuntimeError,
            {},
            lambda m: {"model": m, "optimizers": (optimizer(m), None), "optimizer_cls_and_kwargs": (torch.optim.SGD, {})},
        ),
        ("eval_strategy without eval_dataset", ValueError, {"eval_strategy": "steps"}, lambda m: {"model": m}),
        ("save_strategy best without metric", ValueError, {"save_strategy": "best"}, lambda m: {"model": m}),
        (
            "batch_eval_metrics without compute_result",
            ValueError,
            {"batch_eval_metrics": True},
            lambda m: {"model": m, "compute_metrics": lambda p: {}},
        ),
        ("unsized train dataset without max_steps", ValueError, {}, lambda m: {"model": m, "train_dataset": Unsized()}),
    ]


@pytest.mark.parametrize("name,error,arg_kwargs,trainer_kwargs", _cases(), ids=[c[0] for c in _cases()])
def test_constructor_errors_match_reference(make_args, name, error, arg_kwargs, trainer_kwargs):
    import transformers

    from hf_lightning import TrainingArguments
    from hf_lightning.trainer.trainer import HFLightningTrainer

    with pytest.raises(error):
        transformers.Trainer(args=make_args(transformers.TrainingArguments, **arg_kwargs), **trainer_kwargs(make_regression_mlp()))
    with pytest.raises(error):
        HFLightningTrainer(args=make_args(TrainingArguments, **arg_kwargs), **trainer_kwargs(make_regression_mlp()))


def test_bad_collator_is_a_type_error(make_args):
    from hf_lightning import TrainingArguments
    from hf_lightning.trainer.trainer import HFLightningTrainer

    class OldCollator:
        def collate_batch(self, features):
            return features

    with pytest.raises(TypeError):
        HFLightningTrainer(model=make_regression_mlp(), args=make_args(TrainingArguments), data_collator=OldCollator())


def test_refused_field_fails_at_construction_naming_the_field(make_args):
    from hf_lightning import TrainingArguments
    from hf_lightning.trainer.trainer import HFLightningTrainer

    args = make_args(TrainingArguments, use_liger_kernel=True)
    with pytest.raises(ValueError, match="use_liger_kernel"):
        HFLightningTrainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(4))
    assert not os.path.exists(os.path.join(args.output_dir, "checkpoint-1"))


def test_full_determinism_sets_environment_and_algorithms(make_args, monkeypatch):
    from hf_lightning import TrainingArguments
    from hf_lightning.trainer.trainer import HFLightningTrainer

    names = ("CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG", "ASCEND_LAUNCH_BLOCKING", "HCCL_DETERMINISTIC", "FLASH_ATTENTION_DETERMINISTIC")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    try:
        HFLightningTrainer(model=make_regression_mlp(), args=make_args(TrainingArguments, full_determinism=True))
        assert torch.are_deterministic_algorithms_enabled()
        assert all(name in os.environ for name in names)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        torch.use_deterministic_algorithms(False)


def test_printer_callback_drops_total_flos_from_metrics_quirk(make_args):
    """R6.6 quirk: with disable_tqdm=True the printer pops total_flos from TrainOutput.metrics only."""
    from hf_lightning import TrainingArguments
    from hf_lightning.trainer.trainer import HFLightningTrainer

    for disable_tqdm, expected in ((True, False), (False, True)):
        args = make_args(TrainingArguments, disable_tqdm=disable_tqdm, save_strategy="no", max_steps=2)
        trainer = HFLightningTrainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(8))
        output = trainer.train()
        assert ("total_flos" in output.metrics) is expected
        assert "total_flos" in trainer.state.log_history[-1]
