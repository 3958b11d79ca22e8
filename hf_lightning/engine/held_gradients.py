"""Holds the gradients an update's `zero_grad()` frees on CPU until the next backward, which then reuses their memory.

After the reference's `model.zero_grad()` at the end of an update, glibc hands the freed gradients' pages back to
the OS, and the next backward faults every page of its new gradients in again: on the benchmark suite's `cls` BERT
about 10,000 minor page faults a step, 3-7% of its CPU time (benchmarks/README.md, benchmarks/gradient_memory.py).
Keeping the old gradient tensors, which are no longer any parameter's `.grad` (every `.grad` reads as the
reference's), until the next backward starts lets it reuse their memory, as Lightning's own loop does by zeroing
between forward and backward. The price is up to one set of gradients of extra peak memory, so: only on CPU with one
device (CUDA's caching allocator reuses its blocks already), only for 1 MiB of trainable parameters or more (smaller
gradients come from malloc's bins without faults), not under `auto_find_batch_size`, and let go before `evaluate()`,
a step-boundary save, a run guard's decision, at each epoch's end and when the fit ends. A save a callback makes on
its own (Lightning's `ModelCheckpoint`, `save_model` from `on_step_end`) still runs beside them. Off with
`reuse_gradient_memory = False` on the Trainer.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_lightning.strategies.steps import lightning_update_is_plain

__all__ = ["HELD_GRADIENTS_FLOOR_BYTES", "HeldGradients"]

# Below this many bytes of parameters the gradients come from malloc's bins and are reused without page faults.
HELD_GRADIENTS_FLOOR_BYTES = 1 << 20


class HeldGradients:
    """The previous update's gradient tensors, from `hold()` (just before `zero_grad()`) to `release()`."""

    __slots__ = ("_held", "_parameters")

    def __init__(self, parameters: list[torch.nn.Parameter]) -> None:
        self._parameters = parameters
        self._held: list[torch.Tensor | None] | None = None

    @classmethod
    def for_fit(
        cls, model: torch.nn.Module, root_device: torch.device, strategy: Any, enabled: bool
    ) -> HeldGradients | None:
        """The holder for one fit, or None where holding would win nothing (see the module's docstring)."""
        if not enabled or root_device.type != "cpu" or not lightning_update_is_plain(strategy):
            return None
        parameters = list(model.parameters())  # all of them: a frozen one may be unfrozen during training
        trainable = sum(p.numel() * p.element_size() for p in parameters if p.requires_grad)
        if trainable < HELD_GRADIENTS_FLOOR_BYTES:  # e.g. an adapter over a large frozen model
            return None
        return cls(parameters)

    @property
    def holding(self) -> bool:
        return self._held is not None

    def hold(self) -> None:
        """Keep a reference to every parameter's current gradient; called right before `zero_grad()` drops them."""
        self._held = [parameter.grad for parameter in self._parameters]

    def release(self) -> None:
        """Let the held gradients go (the next backward, an evaluation or a save, the end of training)."""
        self._held = None
