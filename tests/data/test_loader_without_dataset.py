"""A `get_train_dataloader` override may return any sized iterable, without `.dataset` (e.g. a wrapper over
several loaders); it trains as under transformers.Trainer."""

from __future__ import annotations

import itertools

from tests.models import make_regression_mlp, regression_data
from tests.parity.harness import assert_log_history_matches, assert_parity, assert_weights_close, run_parity


class MultiLoader:
    """Chains the batches of several loaders; sized and iterable, with no `dataset` or `set_epoch`."""

    def __init__(self, loaders):
        self.loaders = loaders

    def __iter__(self):
        return itertools.chain.from_iterable(self.loaders)

    def __len__(self) -> int:
        return sum(len(loader) for loader in self.loaders)


def _multi_loader_trainer(base: type) -> type:
    class MultiLoaderTrainer(base):
        def get_train_dataloader(self):
            return MultiLoader([super().get_train_dataloader()])

    return MultiLoaderTrainer


def test_a_train_loader_without_dataset_trains_as_the_reference(tmp_path):
    import transformers

    from hf_lightning.trainer.trainer import HFLightningTrainer

    result = run_parity(
        make_regression_mlp(),
        regression_data(n=12),
        tmp_path,
        reference_trainer_cls=_multi_loader_trainer(transformers.Trainer),
        our_trainer_cls=_multi_loader_trainer(HFLightningTrainer),
        num_train_epochs=2,
        per_device_train_batch_size=4,
        logging_steps=1,
        learning_rate=1e-2,
    )
    assert_parity(result)
    assert result.ours.output.global_step == 6
    # No `.dataset` to count: the example count is len(loader) * batch size, as the reference's.
    assert result.ours.output.metrics["train_samples_per_second"] > 0


def _multi_eval_loader_trainer(base: type) -> type:
    class MultiEvalLoaderTrainer(_multi_loader_trainer(base)):
        def get_train_dataloader(self):
            return MultiLoader([super().get_train_dataloader(), super().get_train_dataloader()])

        def get_eval_dataloader(self, eval_dataset=None):
            # Two loaders of 10 samples in batches of 4: each ends on a short batch of 2.
            return MultiLoader([super().get_eval_dataloader(eval_dataset), super().get_eval_dataloader(eval_dataset)])

    return MultiEvalLoaderTrainer


def test_an_eval_loader_without_batch_sampler_or_dataset_evaluates_as_the_reference(tmp_path):
    """transformers' own test_dataloader_without_dataset: chained train and eval loaders, then evaluate()."""
    import transformers

    from hf_lightning.trainer.trainer import HFLightningTrainer

    data = regression_data(n=10)
    result = run_parity(
        make_regression_mlp(),
        data,
        tmp_path,
        reference_trainer_cls=_multi_eval_loader_trainer(transformers.Trainer),
        our_trainer_cls=_multi_eval_loader_trainer(HFLightningTrainer),
        trainer_kwargs={"eval_dataset": data},
        run=lambda trainer: (trainer.train(), trainer.evaluate()),
        num_train_epochs=1,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        logging_steps=1,
        learning_rate=1e-2,
    )
    assert result.ours.trainer.state.global_step == result.reference.trainer.state.global_step == 6
    assert_log_history_matches(result)  # the evaluation's entry included
    assert_weights_close(result)
    ours, reference = result.ours.output[1], result.reference.output[1]
    # Each inner loader's short last batch counts its 2 real samples, as accelerate cuts it in the reference.
    assert abs(ours["eval_loss"] - reference["eval_loss"]) < 1e-6, (ours, reference)
