"""`accelerator.prepare(dataloader)`: a loader a subclass iterates itself (TRL precomputes reference log-probs so).

As accelerate's prepared loader: under several processes each one gets its share of the batches (whole batches
dealt round-robin, the last round completed from the first samples with `even_batches`, the trainer's
accelerator_config), every batch arrives on the device, and while it is iterated the accelerator's
`gradient_state` reports it, so `gather_for_metrics` drops the samples repeated to even out the last round.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lightning.fabric.utilities.apply_func import move_data_to_device
from torch.utils.data import DataLoader, IterableDataset

from hf_lightning.core.protocols import TrainerLike
from hf_lightning.data.dataloaders import HFDataLoader, one_batch_ahead
from hf_lightning.data.samplers import shard_batches
from hf_lightning.engine.accelerator.state import num_processes, process_index, refuse_tensor_parallel_dealing
from hf_lightning.evaluation.helpers import last_batch_remainder


class PreparedDataLoader:
    """This process's batches of a DataLoader, on the device, tracked by `gradient_state` while iterated."""

    def __init__(self, trainer: TrainerLike, dataloader: DataLoader, device_placement: bool = True):
        self._trainer = trainer
        self.base_dataloader = _shard(trainer, dataloader)
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
            for batch in one_batch_ahead(lambda: iter(self.base_dataloader), before_last=self._reached_last):
                yield self._placed(batch)
        finally:
            active.remove(self)

    def _reached_last(self, batch: Any) -> None:
        self.end_of_dataloader = True
        self.remainder = last_batch_remainder(self.base_dataloader, batch, num_processes(self._trainer))

    def _placed(self, batch: Any) -> Any:
        return batch if self.device is None else move_data_to_device(batch, self.device)


def _shard(trainer: TrainerLike, dataloader: DataLoader) -> DataLoader:
    """This process's share of `dataloader` (the loader itself in a single process)."""
    processes = num_processes(trainer)
    if processes <= 1:
        return dataloader
    refuse_tensor_parallel_dealing(trainer, "prepare(dataloader)")
    if isinstance(dataloader.dataset, IterableDataset):
        raise ValueError(
            "accelerator.prepare(dataloader) over an IterableDataset with several processes is not supported "
            "(accelerate dispatches its batches from rank 0); use a map-style dataset with a length."
        )
    settings = trainer.plan.module
    batch_sampler = shard_batches(
        dataloader.batch_sampler,
        num_processes=processes,
        process_index=process_index(trainer),
        even_batches=settings.even_batches,
        split_batches=settings.split_batches,
    )
    return HFDataLoader(
        dataloader.dataset,
        batch_sampler=batch_sampler,
        collate_fn=dataloader.collate_fn,
        num_workers=dataloader.num_workers,
        pin_memory=dataloader.pin_memory,
        timeout=dataloader.timeout,
        worker_init_fn=dataloader.worker_init_fn,
        multiprocessing_context=dataloader.multiprocessing_context,
        generator=dataloader.generator,
        prefetch_factor=dataloader.prefetch_factor,
        persistent_workers=dataloader.persistent_workers,
    )
