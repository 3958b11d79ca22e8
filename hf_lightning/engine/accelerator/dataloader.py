"""`accelerator.prepare(dataloader)`: a loader a subclass iterates itself (TRL precomputes reference log-probs so).

As accelerate's prepared loader: under several processes each one gets its share of the batches (whole batches
dealt round-robin, the last round completed from the first samples with `even_batches`, the trainer's
accelerator_config or `accelerator.even_batches` as last set), a `RandomSampler` inside made seedable
(`use_seedable_sampler`), every batch arrives on the device, and while it is iterated the accelerator's
`gradient_state` reports it, so `gather_for_metrics` drops the samples repeated to even out the last round.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lightning.fabric.utilities.apply_func import move_data_to_device
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from hf_lightning.data.dataloaders import HFDataLoader
from hf_lightning.data.samplers import made_seedable, shard_batches
from hf_lightning.engine.accelerator.ports import AcceleratorOwner
from hf_lightning.engine.accelerator.state import num_processes, process_index, refuse_tensor_parallel_dealing
from hf_lightning.evaluation.helpers import last_batch_remainder


class PreparedDataLoader:
    """This process's batches of a DataLoader, on the device, tracked by `gradient_state` while iterated.

    The loader iterated is an `HFDataLoader` rebuilt from the one given, as accelerate rebuilds it: so the trainer
    can set its epoch and skip a resumed epoch's first batches when a subclass returns it from
    `get_train_dataloader` (sentence-transformers does), and it draws one batch ahead as accelerate's does."""

    def __init__(self, trainer: AcceleratorOwner, dataloader: DataLoader, device_placement: bool = True):
        self._trainer = trainer
        self.base_dataloader = _rebuilt(trainer, dataloader)
        self.device = trainer.args.device if device_placement else None
        self.end_of_dataloader = False
        self.remainder = -1

    def __len__(self) -> int:
        return len(self.base_dataloader)

    def __getattr__(self, name: str) -> Any:
        if name == "base_dataloader":
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    def __iter__(self) -> Iterator[Any]:
        active = self._trainer.accelerator.gradient_state.active_dataloaders
        self.end_of_dataloader = False
        self.remainder = last_batch_remainder(self.base_dataloader, None, num_processes(self._trainer))
        active.append(self)
        try:
            for batch in self.base_dataloader:  # drawn one ahead: its end is known before the last batch
                if self.base_dataloader.end_of_dataloader:
                    self._reached_last(batch)
                yield self._placed(batch)
        finally:
            active.remove(self)

    def _reached_last(self, batch: Any) -> None:
        self.end_of_dataloader = True
        self.remainder = last_batch_remainder(self.base_dataloader, batch, num_processes(self._trainer))

    def _placed(self, batch: Any) -> Any:
        return batch if self.device is None else move_data_to_device(batch, self.device)


def _seedable(trainer: AcceleratorOwner, dataloader: DataLoader) -> None:
    """As accelerate's `prepare_data_loader` with `use_seedable_sampler`: a `RandomSampler` inside the loader is
    replaced (in place) by one whose order is `data_seed` (else torch's initial seed) plus the epoch."""
    if not trainer.accelerator.use_seedable_sampler:
        return
    holder = dataloader.sampler if isinstance(dataloader.sampler, BatchSampler) else dataloader.batch_sampler
    sampler = getattr(holder, "sampler", None)
    seedable = made_seedable(sampler, trainer.args.data_seed)
    if seedable is sampler:
        return
    holder.sampler = seedable
    inner = getattr(holder, "batch_sampler", None)
    if inner is not None and hasattr(inner, "sampler"):
        inner.sampler = seedable


def _rebuilt(trainer: AcceleratorOwner, dataloader: DataLoader) -> HFDataLoader:
    """This process's share of `dataloader` as an HFDataLoader (the whole loader in a single process)."""
    _seedable(trainer, dataloader)
    processes = num_processes(trainer)
    loader_kwargs = dict(
        collate_fn=dataloader.collate_fn, num_workers=dataloader.num_workers, pin_memory=dataloader.pin_memory,
        timeout=dataloader.timeout, worker_init_fn=dataloader.worker_init_fn,
        multiprocessing_context=dataloader.multiprocessing_context, generator=dataloader.generator,
        prefetch_factor=dataloader.prefetch_factor, persistent_workers=dataloader.persistent_workers,
    )
    if isinstance(dataloader.dataset, IterableDataset):
        if processes > 1:
            raise ValueError(
                "accelerator.prepare(dataloader) over an IterableDataset with several processes is not supported "
                "(accelerate dispatches its batches from rank 0); use a map-style dataset with a length."
            )
        return HFDataLoader(
            dataloader.dataset, batch_size=dataloader.batch_size, drop_last=dataloader.drop_last, **loader_kwargs
        )
    if isinstance(dataloader.sampler, BatchSampler):  # a batch sampler given as `sampler` (batch_size=None)
        batch_sampler = dataloader.sampler
    else:
        batch_sampler = dataloader.batch_sampler
    if processes > 1:
        refuse_tensor_parallel_dealing(trainer, "prepare(dataloader)")
        settings = trainer.plan.module
        batch_sampler = shard_batches(
            batch_sampler,
            num_processes=processes,
            process_index=process_index(trainer),
            even_batches=trainer.accelerator.even_batches,
            split_batches=settings.split_batches,
        )
    return HFDataLoader(dataloader.dataset, batch_sampler=batch_sampler, **loader_kwargs)
