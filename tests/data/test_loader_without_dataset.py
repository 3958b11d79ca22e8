"""A `get_train_dataloader` override may return any sized iterable, without `.dataset` (e.g. a wrapper over
several loaders); it trains as under transformers.Trainer."""

from __future__ import annotations

import itertools

from tests.models import make_regression_mlp, regression_data
from tests.parity.harness import assert_parity, run_parity


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

    from hf_lightning.engine.trainer import HFLightningTrainer

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
