"""accelerate's process-control helpers on `trainer.accelerator`: which process runs a block or a function first
or only (`main_process_first`, `on_main_process`, ...), each process's share of the inputs
(`split_between_processes`) and `print` on the main process, with accelerate's meanings.

A mixin of `LightningAccelerator`, which provides the process facts (`num_processes`, `process_index`,
`is_main_process`, ...) and the collectives (`wait_for_everyone`, `pad_across_processes`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hf_lightning.engine.accelerator import state as run_state


class ProcessControlMixin:
    """Which process does what, and each one's share of the inputs."""

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """The main process runs the block first, the others once it has left it."""
        with self._first(self.is_main_process):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """The main process of each node runs the block first."""
        with self._first(self.is_local_main_process):
            yield

    @contextlib.contextmanager
    def _first(self, goes_first: bool) -> Iterator[None]:
        if not goes_first:
            self.wait_for_everyone()
        yield
        if goes_first:
            self.wait_for_everyone()

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This process's contiguous share of a list, tuple, tensor, dict of those, or `datasets.Dataset`."""
        yield self._split(inputs, apply_padding)

    def _split(self, inputs: Any, apply_padding: bool) -> Any:
        processes, index = self.num_processes, self.process_index
        if processes == 1:
            return inputs
        run_state.refuse_tensor_parallel_dealing(self._trainer, "split_between_processes")
        length = len(inputs)
        if isinstance(inputs, dict):
            length = len(inputs[next(iter(inputs))])
            if not all(len(value) == length for value in inputs.values()):
                raise ValueError("All values in the dictionary must have the same length")
        per_process, extras = divmod(length, processes)
        start = index * per_process + min(index, extras)
        end = start + per_process + (1 if index < extras else 0)
        share = per_process + (1 if extras > 0 else 0)
        return self._split_values(inputs, start, end, share, apply_padding)

    def _split_values(self, inputs: Any, start: int, end: int, share: int, apply_padding: bool) -> Any:
        if isinstance(inputs, (list, tuple, torch.Tensor)):
            result = inputs[start:end]
            if apply_padding:
                if isinstance(result, torch.Tensor):
                    return self.pad_across_processes(
                        result.to(self.device), pad_index=inputs[-1].to(self.device)
                    )
                # accelerate's own padding of a tuple raises TypeError (docs/divergences.md): a tuple stays one.
                return result + type(result)([inputs[-1]] * (share - len(result)))
            return result
        if isinstance(inputs, dict):
            for key in inputs:
                inputs[key] = self._split_values(inputs[key], start, end, share, apply_padding)
            return inputs
        select = getattr(inputs, "select", None)
        if callable(select) and hasattr(inputs, "column_names"):  # a datasets.Dataset
            indices = list(range(min(start, len(inputs)), min(end, len(inputs))))
            if apply_padding:
                indices += [len(inputs) - 1] * (share - len(indices))
            return select(indices)
        return inputs

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate `function` to run on the global main process only (everywhere in a single process)."""
        return self._only_if(function, lambda: self.is_main_process)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate `function` to run on each node's main process only."""
        return self._only_if(function, lambda: self.is_local_main_process)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate `function` to run on the last process only."""
        return self._only_if(function, lambda: self.is_last_process)

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int | None = None):
        """Decorate `function` to run on process `process_index` only (`@accelerator.on_process(process_index=i)`)."""
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return self._only_if(function, lambda: self.process_index == process_index)

    def on_local_process(
        self, function: Callable[..., Any] | None = None, local_process_index: int | None = None
    ):
        """Decorate `function` to run on the process of local rank `local_process_index` only."""
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return self._only_if(function, lambda: self.local_process_index == local_process_index)

    def _only_if(self, function: Callable[..., Any], condition: Callable[[], bool]) -> Callable[..., Any]:
        """As accelerate's decorators: `function` runs where `condition` holds, and everywhere without
        several processes; elsewhere the call returns None."""

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if condition() or not self.use_distributed:
                return function(*args, **kwargs)
            return None

        return wrapper

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` on each node's main process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)
