"""The facade's data methods with the reference's names: the train / eval / test DataLoaders and their samplers,
the signature columns, `num_examples` and `_prepare_input(s)` (a mixin of `HFLightningTrainer`).

Every loader is built through `_get_dataloader` with the samplers `_get_train_sampler` / `_get_eval_sampler`
choose, so a subclass overriding either orders the trainer's own loaders, as in the reference
(data/dataloaders.py builds them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import hf_lightning.data.dataloaders as dataloaders
import hf_lightning.data.model_inputs as data_layer
from hf_lightning.data.context import DataContext
from hf_lightning.data.samplers import made_seedable
from hf_lightning.engine.base_methods import is_base_method


class DataMethodsMixin:
    """The reference Trainer's dataloader and input methods, for the facade to inherit."""

    def get_train_dataloader(self) -> DataLoader:
        """The train DataLoader with the reference's sampler (`_get_train_sampler`), collation and column removal."""
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        return self._get_dataloader(
            self.train_dataset, "Training", self._train_batch_size, self._get_train_sampler, is_training=True
        )

    def _get_train_sampler(self, train_dataset: Dataset | None = None) -> Any:
        """The train sampler for `train_sampling_strategy` (None for unsized data), as the reference's; the
        dataloader builders call it, so a subclass's override chooses the order."""
        if train_dataset is None:
            train_dataset = self.train_dataset
        replicas, replica = self._data_parallel_layout()
        return data_layer.get_train_sampler(
            train_dataset,
            args=self.args,
            processing_class=self.processing_class,
            world_size=replicas,
            process_index=replica,
            settings=self.plan.module,
        )

    def _get_eval_sampler(self, eval_dataset: Dataset) -> Any:
        """The evaluation sampler: sequential in one process (none, then dealt, in several), as the reference's."""
        replicas, _ = self._data_parallel_layout()
        return data_layer.get_eval_sampler(
            eval_dataset, args=self.args, processing_class=self.processing_class, world_size=replicas
        )

    def get_eval_dataloader(self, eval_dataset: str | Dataset | None = None) -> DataLoader:
        """The eval DataLoader; a string selects one of a dict of eval datasets."""
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        dataloader_key = eval_dataset if isinstance(eval_dataset, str) else "eval"
        cache = self._eval_dataloaders
        if dataloader_key in cache and self.args.dataloader_persistent_workers:
            return cache[dataloader_key]
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        elif eval_dataset is None:
            eval_dataset = self.eval_dataset
        dataloader = self._build_eval_dataloader(eval_dataset, "Evaluation")
        if self.args.dataloader_persistent_workers:
            self._eval_dataloaders = {**cache, dataloader_key: dataloader}
        return dataloader

    def get_test_dataloader(self, test_dataset: Dataset) -> DataLoader:
        """The test DataLoader (never cached)."""
        return self._build_eval_dataloader(test_dataset, "test")

    def _build_eval_dataloader(self, dataset: Dataset, description: str) -> DataLoader:
        """This process's share of an eval / test set in `_get_eval_sampler`'s order, as the reference deals it."""
        if dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        return self._get_dataloader(dataset, description, self.args.eval_batch_size, self._get_eval_sampler)

    def _get_dataloader(
        self,
        dataset: Dataset,
        description: str,
        batch_size: int,
        sampler_fn: Callable[[Dataset], Any] | None = None,
        is_training: bool = False,
        dataloader_key: str | None = None,
    ) -> DataLoader:
        """The reference's shared builder (subclasses such as TRL's GRPOTrainer call it with their own sampler):
        column removal, `sampler_fn(dataset)` as the sampler (a torch `RandomSampler` made seedable, as accelerate
        prepares it), this process's share of the batches."""
        replicas, replica = self._data_parallel_layout()
        seedable = self.plan.module.use_seedable_sampler
        data_seed = self.args.data_seed

        def make_sampler(data: Dataset) -> Any:
            sampler = sampler_fn(data) if sampler_fn is not None else None
            return made_seedable(sampler, data_seed) if seedable else sampler

        context = DataContext(
            args=self.args,
            data_collator=self.data_collator,
            model=self.model,
            processing_class=self.processing_class,
            world_size=replicas,
            process_index=replica,
            settings=self._loader_settings(),
            columns=self._kept_columns(),
        )
        return dataloaders.build_dataloader(
            dataset, make_sampler, context, batch_size=batch_size, description=description, is_training=is_training
        )

    def _loader_settings(self) -> Any:
        """The plan's module settings, with `even_batches` as `accelerator.even_batches` was last set (accelerate's
        prepare reads the accelerator's value, which a subclass may change before building a loader)."""
        settings = self.plan.module
        chosen = self.accelerator.even_batches
        return settings if chosen == settings.even_batches else dataclasses.replace(settings, even_batches=chosen)

    def _set_signature_columns_if_needed(self) -> None:
        """Set `_signature_columns` (the columns column removal keeps) from the model's forward, if not set."""
        if self._signature_columns is None:
            self._signature_columns = data_layer.signature_columns(self.model, self.label_names)

    def _kept_columns(self) -> list[str] | None:
        """The columns column removal keeps: `_signature_columns`, set (overridably) on first use."""
        if not self.args.remove_unused_columns:
            return None
        self._set_signature_columns_if_needed()
        return self._signature_columns

    def num_examples(self, dataloader: DataLoader) -> int:
        """Samples in a dataloader's dataset, estimated from its length when the dataset has none."""
        return dataloaders.num_examples(dataloader, self.args.per_device_train_batch_size)

    def _prepare_input(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            return type(data)({k: self._prepare_input(v) for k, v in data.items()})
        if isinstance(data, (tuple, list)):
            return type(data)(self._prepare_input(v) for v in data)
        if isinstance(data, torch.Tensor):
            if torch.is_floating_point(data) or torch.is_complex(data):
                # As the reference: float inputs (audio, pixels) take the engine's dtype (DeepSpeed); token ids
                # stay integers.
                dtype = self._strategy_steps.input_dtype(self.args)
                if dtype is not None:
                    return data.to(device=self.args.device, dtype=dtype)
            return data.to(device=self.args.device)
        return data

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        if (
            type(inputs) is dict
            and self._strategy_steps.input_dtype(self.args) is None
            and is_base_method(self._prepare_input, DataMethodsMixin._prepare_input)
        ):
            # `_prepare_input`'s result, its recursion unrolled for a plain dict (every micro-batch comes here).
            device = self.args.device
            inputs = {
                k: v.to(device=device) if type(v) is torch.Tensor else self._prepare_input(v)
                for k, v in inputs.items()
            }
        else:
            inputs = self._prepare_input(inputs)
        if len(inputs) == 0:
            raise ValueError(
                "The batch received was empty, your model won't be able to train on it. Double-check that your "
                f"training dataset contains keys expected by the model: {','.join(self._signature_columns or [])}."
            )
        return inputs
