"""The running training loss between two logs, with the reference's NaN/Inf filter (R6.3) applied lazily.

The reference adds each micro-batch loss to `tr_loss`, except a NaN/Inf loss, for which it adds the window's
running mean `tr_loss / (1 + global_step - last_logged_step)`. Deciding that per micro-batch reads the loss on
the host, and a device-side `where` costs four kernels per micro-batch. Here each loss is added as it is and
kept: a sum that is still finite when it is read proves that no term was NaN/Inf (such a term can never be
cancelled), so it is the reference's sum, bit for bit; otherwise the window is replayed with the reference's
rule from the kept terms. A micro-batch costs one in-place add and no host read.

The kept terms are the detached losses `training_step` returned (a fresh tensor each with the built-in one); a
subclass returning a buffer it later changes in place would change the replay.
"""

from __future__ import annotations

import torch

__all__ = ["TrainLossWindow"]

# Terms kept before the window is folded on the device (a run that logs rarely, or never, stays bounded).
_MAX_KEPT_TERMS = 4096


class TrainLossWindow:
    """`total` is the reference's `tr_loss` once `settle()` has run; `add` is its per-micro-batch update."""

    def __init__(self, device: torch.device | str) -> None:
        self.total = torch.tensor(0.0, device=device)
        self._start: torch.Tensor | None = None  # `total` before the first kept term
        self._terms: list[tuple[torch.Tensor, int]] = []  # (loss, 1 + global_step - last_logged_step)

    def add(self, loss_step: torch.Tensor, steps_since_log: int, filter_non_finite: bool) -> None:
        """Add one micro-batch loss; `steps_since_log` is the divisor the reference would use for a NaN/Inf."""
        if filter_non_finite:
            if not self._terms:
                self._start = self.total.clone()
            self._terms.append((loss_step, steps_since_log))
            if len(self._terms) >= _MAX_KEPT_TERMS:
                self._fold_on_device()  # recomputes `total` from `_start`, this term included
                return
        self.total += loss_step

    def settle(self) -> torch.Tensor:
        """`total` with the filter applied (one host read of the sum when terms were kept)."""
        if self._terms:
            if not bool(torch.isfinite(self.total)):
                self.total.copy_(self._replay())
            self._forget_terms()
        return self.total

    def reset(self) -> None:
        """Start a new logging window (the reference's `tr_loss -= tr_loss`); call after `settle`."""
        self.total -= self.total

    def copy(self) -> TrainLossWindow:
        """An independent window with the same sum and kept terms (a run guard's snapshot of a step)."""
        window = TrainLossWindow(self.total.device)
        window.total = self.total.clone()
        window._start = None if self._start is None else self._start.clone()
        window._terms = list(self._terms)
        return window

    def _replay(self) -> torch.Tensor:
        # In place, as the reference: `total` keeps its dtype (float32) whatever the loss's dtype.
        total = self._start
        for loss_step, steps_since_log in self._terms:
            if torch.isnan(loss_step) or torch.isinf(loss_step):
                total += total / steps_since_log
            else:
                total += loss_step
        return total

    def _fold_on_device(self) -> None:
        """Apply the filter to the kept terms without reading the device (the reference's rule as `where`s).

        For a float64 loss the `where` is float64 and the in-place add rounds once to float32, which equals the
        reference's float32 add of the float32 average (double rounding is exact at 53 >= 2 x 24 + 2 bits).
        """
        total = self._start
        for loss_step, steps_since_log in self._terms:
            total += torch.where(torch.isfinite(loss_step), loss_step, total / steps_since_log)
        self.total.copy_(total)
        self._forget_terms()

    def _forget_terms(self) -> None:
        self._terms.clear()
        self._start = None
