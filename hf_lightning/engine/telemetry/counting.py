"""What a window's micro-batches hold: samples, the size of the input FLOPs scale with, and non-padding tokens,
counted without waiting for the device.

Tokens follow the rule of the reference's `include_num_input_tokens_seen="non_padding"` (trainer/step_methods.py
`_track_num_input_tokens`): the attention mask's sum, else the main input's entries that are not the pad token,
else every entry of the main input; no main input, no tokens. A sum stays a tensor on the device, added to the
window's running total there; it is read once, when the window closes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


class BatchCounter:
    """Counts the micro-batches of the current window (samples, input entries, tokens) until `take`."""

    __slots__ = ("_main", "_make_flops_rule", "_pad", "_tokens_on_device", "elements", "flops_rule", "positions",
                 "samples", "tokens")

    def __init__(
        self,
        main_input_name: str,
        pad_token_id: int | None,
        make_flops_rule: Callable[[Mapping[str, Any], int], Any] | None = None,
    ) -> None:
        self._main = main_input_name
        self._pad = pad_token_id
        # Called once, on the first micro-batch: how FLOPs scale with the input (flops.py `FlopsRule`).
        self._make_flops_rule = make_flops_rule
        self.flops_rule: Any = None
        self.samples = 0
        self.elements = 0  # entries of the input FLOPs scale with (the main input, else the first tensor)
        self.positions = 0  # those entries times their sequence length (the attention term's scale)
        self.tokens: int | None = None  # tokens counted on the host (no mask, no pad id: every entry)
        self._tokens_on_device: torch.Tensor | None = None

    def count(self, inputs: Any) -> None:
        """Add one micro-batch (called after its forward and backward, from the training step)."""
        if type(inputs) is not dict and not isinstance(inputs, Mapping):
            self._count_unnamed(inputs)
            return
        main = inputs.get(self._main)
        if type(main) is not torch.Tensor:
            scale_key = next((key for key, value in inputs.items() if isinstance(value, torch.Tensor)), None)
            if scale_key is not None:
                self._count_scale(inputs[scale_key], inputs)
            return
        self._count_scale(main, inputs)
        mask = inputs.get("attention_mask")
        if isinstance(mask, torch.Tensor):
            self._add_on_device(mask.sum(dtype=torch.int64))
        elif self._pad is not None:
            self._add_on_device((main != self._pad).sum())
        else:
            self.tokens = (self.tokens or 0) + main.numel()

    def _count_scale(self, tensor: torch.Tensor, inputs: Mapping[str, Any]) -> None:
        """Samples and entries of the input FLOPs scale with; the FLOPs themselves on the first micro-batch."""
        shape = tensor.shape
        self.samples += shape[0] if shape else 1
        elements = tensor.numel()
        self.elements += elements
        self.positions += elements * (shape[-1] if len(shape) > 1 else 1)
        if self._make_flops_rule is not None:
            make, self._make_flops_rule = self._make_flops_rule, None
            self.flops_rule = make(inputs, elements)

    def _count_unnamed(self, inputs: Any) -> None:
        """A tuple / list batch: samples from its first tensor (no main input, so no tokens or FLOPs scale)."""
        if isinstance(inputs, (list, tuple)):
            first = next((value for value in inputs if isinstance(value, torch.Tensor)), None)
            if first is not None:
                self.samples += first.shape[0] if first.dim() else 1
                self.elements += first.numel()

    def _add_on_device(self, count: torch.Tensor) -> None:
        if self._tokens_on_device is None:
            self._tokens_on_device = count
        else:
            self._tokens_on_device += count

    def take(self) -> tuple[int, float | None, int | None]:
        """`(samples, flops, tokens)` since the last `take` (flops None without a FLOPs rule, tokens None when none
        were counted), and start again from zero. Reads the device's token total: call it where the step waits for
        the device anyway."""
        tokens = self.tokens
        if self._tokens_on_device is not None:
            tokens = (tokens or 0) + int(self._tokens_on_device.item())
        rule = self.flops_rule
        flops = None if rule is None else rule.per_element * self.elements + rule.per_position * self.positions
        taken = (self.samples, flops, tokens)
        self.samples = self.elements = self.positions = 0
        self.tokens = None
        self._tokens_on_device = None
        return taken
