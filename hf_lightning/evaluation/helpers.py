"""Pure helpers of the evaluation loop, ported from transformers' `trainer_pt_utils` / `trainer_utils`.

Concatenation of per-batch results with -100 padding on dim 1 (EVAL-2.4), accumulation on CPU (EVAL-2.5),
metric de-numpification (EVAL-2.2), speed metrics (EVAL-2.12), and the single-process version of
accelerate's `gather_for_metrics`, which drops the padding samples of the last batch (EVAL-2.9). transformers
and accelerate are not imported.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from hf_lightning.data.dataloaders import DispatchingDataLoader, HFDataLoader
from hf_lightning.data.iterable_sharding import slice_batch

__all__ = [
    "EvalLoopContainer",
    "atleast_1d",
    "denumpify_detensorize",
    "drop_last_batch_padding",
    "find_batch_size",
    "is_iterable_dataset_shard",
    "is_metric_driven_scheduler",
    "iterate_with_last_flag",
    "last_batch_remainder",
    "loss_rows",
    "nested_concat",
    "nested_detach",
    "nested_numpify",
    "numpy_pad_and_concatenate",
    "spans_several_devices",
    "speed_metrics",
    "torch_pad_and_concatenate",
]


def atleast_1d(tensor_or_array: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
    """Promote a 0-d tensor or array to 1-d so that batches of scalars concatenate."""
    if isinstance(tensor_or_array, torch.Tensor):
        return torch.atleast_1d(tensor_or_array)
    return np.atleast_1d(tensor_or_array)


def torch_pad_and_concatenate(
    tensor1: torch.Tensor, tensor2: torch.Tensor, padding_index: int = -100
) -> torch.Tensor:
    """Concatenate on dim 0; when dim 1 differs, pad both to the wider one with `padding_index`."""
    tensor1 = atleast_1d(tensor1)
    tensor2 = atleast_1d(tensor2)
    if len(tensor1.shape) == 1 or tensor1.shape[1] == tensor2.shape[1]:
        return torch.cat((tensor1, tensor2), dim=0)
    new_shape = (
        tensor1.shape[0] + tensor2.shape[0],
        max(tensor1.shape[1], tensor2.shape[1]),
    ) + tensor1.shape[2:]
    result = tensor1.new_full(new_shape, padding_index)
    result[: tensor1.shape[0], : tensor1.shape[1]] = tensor1
    result[tensor1.shape[0] :, : tensor2.shape[1]] = tensor2
    return result


def numpy_pad_and_concatenate(
    array1: np.ndarray, array2: np.ndarray, padding_index: int = -100
) -> np.ndarray:
    """numpy twin of `torch_pad_and_concatenate` (the result keeps `array1`'s dtype)."""
    array1 = atleast_1d(array1)
    array2 = atleast_1d(array2)
    if len(array1.shape) == 1 or array1.shape[1] == array2.shape[1]:
        return np.concatenate((array1, array2), axis=0)
    new_shape = (array1.shape[0] + array2.shape[0], max(array1.shape[1], array2.shape[1])) + array1.shape[2:]
    result = np.full_like(array1, padding_index, shape=new_shape)
    result[: array1.shape[0], : array1.shape[1]] = array1
    result[array1.shape[0] :, : array2.shape[1]] = array2
    return result


def nested_concat(tensors: Any, new_tensors: Any, padding_index: int = -100) -> Any:
    """Concatenate `new_tensors` to `tensors` (same nesting of lists / tuples / dicts), padding dim 1."""
    if not (isinstance(tensors, torch.Tensor) and isinstance(new_tensors, torch.Tensor)):
        if type(tensors) is not type(new_tensors):
            raise TypeError(
                f"Expected `tensors` and `new_tensors` to have the same type but found {type(tensors)} and "
                f"{type(new_tensors)}."
            )
    if isinstance(tensors, (list, tuple)):
        return type(tensors)(
            nested_concat(t, n, padding_index=padding_index) for t, n in zip(tensors, new_tensors)
        )
    if isinstance(tensors, torch.Tensor):
        return torch_pad_and_concatenate(tensors, new_tensors, padding_index=padding_index)
    if isinstance(tensors, Mapping):
        return type(tensors)(
            {k: nested_concat(t, new_tensors[k], padding_index=padding_index) for k, t in tensors.items()}
        )
    if isinstance(tensors, np.ndarray):
        return numpy_pad_and_concatenate(tensors, new_tensors, padding_index=padding_index)
    raise TypeError(f"Unsupported type for concatenation: got {type(tensors)}")


def find_batch_size(tensors: Any) -> int | None:
    """Dim 0 of the first tensor / array with at least one dimension in a nested structure, else None."""
    if isinstance(tensors, (list, tuple)):
        for t in tensors:
            result = find_batch_size(t)
            if result is not None:
                return result
    elif isinstance(tensors, Mapping):
        for value in tensors.values():
            result = find_batch_size(value)
            if result is not None:
                return result
    elif isinstance(tensors, (torch.Tensor, np.ndarray)):
        return tensors.shape[0] if len(tensors.shape) >= 1 else None
    return None


def nested_numpify(tensors: Any) -> Any:
    """Move tensors of a nested structure to CPU numpy arrays (bfloat16 becomes float32, numpy lacks it)."""
    if isinstance(tensors, (list, tuple)):
        return type(tensors)(nested_numpify(t) for t in tensors)
    if isinstance(tensors, Mapping):
        return type(tensors)({k: nested_numpify(t) for k, t in tensors.items()})
    t = tensors.cpu()
    if t.dtype == torch.bfloat16:
        t = t.to(torch.float32)
    return t.numpy()


def nested_detach(tensors: Any) -> Any:
    """Detach every tensor of a nested structure; other leaves are returned unchanged."""
    if isinstance(tensors, (list, tuple)):
        return type(tensors)(nested_detach(t) for t in tensors)
    if isinstance(tensors, Mapping):
        return type(tensors)({k: nested_detach(t) for k, t in tensors.items()})
    return tensors.detach() if isinstance(tensors, torch.Tensor) else tensors


class EvalLoopContainer:
    """Per-batch results of the evaluation loop: concatenated (padding dim 1) or kept as a list per batch.

    `to_cpu_and_numpy` moves what was gathered so far to numpy (every `eval_accumulation_steps`);
    `get_arrays` does the final move and returns the numpy result (None when nothing was added).
    """

    def __init__(self, do_nested_concat: bool = True, padding_index: int = -100):
        self.do_nested_concat = do_nested_concat
        self.padding_index = padding_index
        self.tensors: Any = None
        self.arrays: Any = None

    def add(self, tensors: Any) -> None:
        """Store one batch's (nested) tensors."""
        if self.tensors is None:
            self.tensors = tensors if self.do_nested_concat else [tensors]
        elif self.do_nested_concat:
            self.tensors = nested_concat(self.tensors, tensors, padding_index=self.padding_index)
        else:
            self.tensors.append(tensors)

    def to_cpu_and_numpy(self) -> None:
        """Move the stored tensors to numpy and append them to the arrays gathered so far."""
        if self.tensors is None:
            return
        new_arrays = nested_numpify(self.tensors)
        if self.arrays is None:
            self.arrays = new_arrays
        elif self.do_nested_concat:
            self.arrays = nested_concat(self.arrays, new_arrays, padding_index=self.padding_index)
        else:
            self.arrays.extend(new_arrays)
        self.tensors = None

    def get_arrays(self) -> Any:
        """Everything stored, as numpy (None when nothing was added)."""
        self.to_cpu_and_numpy()
        return self.arrays


def denumpify_detensorize(metrics: Any) -> Any:
    """Turn numpy scalars and one-element tensors of a nested structure into Python numbers (JSON-safe)."""
    if isinstance(metrics, (list, tuple)):
        return type(metrics)(denumpify_detensorize(m) for m in metrics)
    if isinstance(metrics, dict):
        return type(metrics)({k: denumpify_detensorize(v) for k, v in metrics.items()})
    if isinstance(metrics, np.generic):
        return metrics.item()
    if isinstance(metrics, torch.Tensor) and metrics.numel() == 1:
        return metrics.item()
    return metrics


def speed_metrics(
    split: str,
    start_time: float,
    num_samples: int | None = None,
    num_steps: int | None = None,
    num_tokens: int | None = None,
) -> dict[str, float]:
    """`{split}_runtime` (4 decimals) and the per-second rates (3 decimals) since `start_time`.

    Call it right after the measured operation; a runtime of exactly 0 yields the runtime key only.
    """
    runtime = time.time() - start_time
    result = {f"{split}_runtime": round(runtime, 4)}
    if runtime == 0:
        return result
    if num_samples is not None:
        result[f"{split}_samples_per_second"] = round(num_samples / runtime, 3)
    if num_steps is not None:
        result[f"{split}_steps_per_second"] = round(num_steps / runtime, 3)
    if num_tokens is not None:
        result[f"{split}_tokens_per_second"] = round(num_tokens / runtime, 3)
    return result


# --- the single-process part of accelerate's prepared dataloader and `gather_for_metrics` -----------------


def iterate_with_last_flag(iterable: Iterable[Any]) -> Iterator[tuple[Any, bool]]:
    """Yield `(item, is_last)`, fetching one item ahead as accelerate's prepared dataloader does.

    The reference knows it is on the last batch (`gradient_state.end_of_dataloader`) before handling it; this
    drives `compute_result=True` with `batch_eval_metrics` and the last-batch truncation of the gather. Our
    loaders (`HFDataLoader`, also dealt from the first process) already draw ahead as accelerate's do and know their
    last batch when they yield it: they are not drawn ahead again, which would move a collator's random draws
    against the model's (a model that draws random numbers in evaluation, sampling generation).
    """
    if isinstance(iterable, HFDataLoader):
        for item in iterable:
            yield item, iterable.end_of_dataloader
        return
    iterator = iter(iterable)
    try:
        current = next(iterator)
    except StopIteration:
        return
    for following in iterator:
        yield current, False
        current = following
    yield current, True


def is_opaque_loader(dataloader: Any) -> bool:
    """Whether `dataloader` shows neither a dataset nor a batch sampler (e.g. a `get_eval_dataloader` override
    that chains several loaders): how many of its samples are real cannot be read from it."""
    return getattr(dataloader, "dataset", None) is None and getattr(dataloader, "batch_sampler", None) is None


def loss_rows(dataloader: Any, batch_size: int | None, observed_batch_size: int | None) -> int:
    """How many rows a batch's loss is repeated into, so the mean over rows is sample-weighted (EVAL-2.9).

    The loader's batch size, whose padding rows of a short last batch `last_batch_remainder` then cuts, as
    accelerate's prepared loader does. An opaque loader chaining the reference's prepared loaders has each inner
    loader's short last batch cut by accelerate to its real samples; the batch's observed size is that count.
    """
    if observed_batch_size is not None and is_opaque_loader(dataloader):
        return observed_batch_size
    return batch_size


def last_batch_remainder(dataloader: Any, last_batch: Any, num_processes: int = 1) -> int:
    """How many samples of the last batch are real, as accelerate's prepared dataloader reports it (-1: unknown).

    Map-style dataset (accelerate's `DataLoaderShard`): `len(dataset) % total_batch_size`, or -1 with
    `drop_last`, an unsized dataset or a batch sampler without `batch_size`. Iterable dataset (accelerate
    dispatches its batches): the size of `last_batch` in one process; across processes the real samples of the
    last batch rank 0 joined (`DispatchingDataLoader.remainder`); when each process reads its own shard, 0 for a
    sized shard (a multiple of the batch size) and -1 otherwise, so nothing is cut, as in accelerate.
    """
    dataset = getattr(dataloader, "dataset", None)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        if num_processes > 1:
            if isinstance(dataloader, DispatchingDataLoader):
                return dataloader.remainder
            try:  # each process's shard: as accelerate's `begin()`, 0 for a sized one (nothing is cut), else -1
                return len(dataset) % dataloader.batch_size
            except TypeError:
                return -1
        observed = find_batch_size(last_batch)
        return -1 if observed is None else observed
    if is_opaque_loader(dataloader):
        return -1  # its batches' rows are already the real samples (`loss_rows`): nothing to cut
    sampler = getattr(dataloader, "sampler", None)
    batch_sampler = (
        sampler if isinstance(sampler, torch.utils.data.BatchSampler) else getattr(dataloader, "batch_sampler", None)
    )
    # A sharded loader carries `drop_last` on its batch sampler (accelerate keeps the original loader's).
    if getattr(dataloader, "drop_last", False) or getattr(batch_sampler, "drop_last", False):
        return -1
    try:
        length = getattr(dataset, "total_dataset_length", None)
        if length is None:
            length = len(dataset)
        # accelerate's `total_batch_size`: a split batch is already global; a sharded one counts every process.
        if getattr(batch_sampler, "split_batches", False):
            return length % batch_sampler.batch_size
        return length % (batch_sampler.batch_size * getattr(batch_sampler, "num_processes", num_processes))
    except (AttributeError, TypeError, ZeroDivisionError):
        return -1


def _all_tensors(data: Any) -> bool:
    if isinstance(data, (list, tuple)):
        return all(_all_tensors(item) for item in data)
    if isinstance(data, Mapping):
        return all(_all_tensors(value) for value in data.values())
    return isinstance(data, torch.Tensor)


def drop_last_batch_padding(data: Any, is_last_batch: bool, remainder: int) -> Any:
    """Keep the first `remainder` samples of the last batch's gathered data (accelerate's `gather_for_metrics`).

    In a single process this is what makes `eval_loss` sample-weighted: the last batch's loss, repeated
    `eval_batch_size` times, is cut to the number of samples that batch really had (EVAL-2.9). Other batches,
    an unknown remainder (-1) and a remainder of 0 leave `data` untouched. Non-tensor data is sliced as a whole,
    as accelerate does for objects it gathers with `gather_object`.
    """
    if not is_last_batch or remainder <= 0:
        return data
    if _all_tensors(data):
        return slice_batch(data, slice(0, remainder))
    try:
        return data[:remainder]
    except Exception:
        # accelerate returns the data unchanged when it cannot be sliced.
        return data


# --- small predicates of the evaluation loop ------------------------------------------------------------


def spans_several_devices(model: torch.nn.Module) -> bool:
    """A model dispatched with a `device_map` over several devices is not moved (accelerate's rule)."""
    device_map = getattr(model, "hf_device_map", None)
    return isinstance(device_map, dict) and len(set(device_map.values())) > 1


def is_iterable_dataset_shard(dataset: Any) -> bool:
    """The reference's `IterableDatasetShard` (ours or transformers'), recognised by name: no import needed."""
    return type(dataset).__name__ == "IterableDatasetShard"


def is_metric_driven_scheduler(scheduler: Any) -> bool:
    """`ReduceLROnPlateau` or a `GreedyLR` (ours or transformers'): stepped with an evaluation metric."""
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        return True
    return type(scheduler).__name__ == "GreedyLR"
