"""A subclass's `_get_train_sampler` / `_get_eval_sampler` choose the order of the trainer's own loaders, as in the
reference (GLiNER's and TRL's dataloaders call them; many subclasses override them). A plain `RandomSampler`
returned by an override is made seedable, as accelerate's prepare does."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch.utils.data import RandomSampler, SequentialSampler

from hf_lightning import Trainer, TrainingArguments
from tests.models import make_regression_mlp, regression_data


def _subclass(base: type, sampler: str) -> type:
    class Ordered(base):
        def _get_train_sampler(self, train_dataset=None):
            self.__dict__["train_sampler_calls"] = self.__dict__.get("train_sampler_calls", 0) + 1
            dataset = self.train_dataset if train_dataset is None else train_dataset
            return SequentialSampler(dataset) if sampler == "sequential" else RandomSampler(dataset)

        def _get_eval_sampler(self, eval_dataset):
            self.__dict__["eval_sampler_calls"] = self.__dict__.get("eval_sampler_calls", 0) + 1
            return SequentialSampler(list(reversed(range(len(eval_dataset)))))

    return Ordered


def _run(base: type, args_cls: type, tmp_path, sampler: str):
    torch.manual_seed(0)
    args = args_cls(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=2, max_steps=6,
        logging_steps=1, learning_rate=0.1, save_strategy="no", disable_tqdm=True, seed=0,
        per_device_eval_batch_size=2,
    )
    trainer = _subclass(base, sampler)(
        model=make_regression_mlp(), args=args, train_dataset=regression_data(8), eval_dataset=regression_data(5)
    )
    trainer.train()
    predictions = trainer.predict(regression_data(5)).predictions
    history = [{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k}
               for e in trainer.state.log_history]
    return trainer, history, predictions


@pytest.mark.parametrize("sampler", ["sequential", "random"])
def test_sampler_overrides_order_the_data_as_the_reference(tmp_path, sampler):
    reference, reference_history, reference_predictions = _run(
        transformers.Trainer, transformers.TrainingArguments, tmp_path / "ref", sampler
    )
    ours, history, predictions = _run(Trainer, TrainingArguments, tmp_path / "ours", sampler)
    assert history == reference_history
    assert ours.train_sampler_calls == reference.train_sampler_calls == 1
    assert ours.eval_sampler_calls == reference.eval_sampler_calls
    torch.testing.assert_close(torch.as_tensor(predictions), torch.as_tensor(reference_predictions))
