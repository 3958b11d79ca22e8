"""The telemetry's interval clocks and its memory reading; the same interface on a CPU and on a GPU.

Starting and stopping a clock never waits for the device: a host clock reads `time.perf_counter`, a CUDA clock
records an event on the current stream. What the intervals add up to is read only when a logging window closes
(`read_and_reset`), where a CUDA clock waits for its last event. A step that logs already waits for the device (it
reads the loss), so the steps that do not log wait for nothing new (tests/engine/test_host_syncs.py).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch


class HostClock:
    """Intervals on the host's clock: what the host spent (waiting for a batch, or any work on a CPU device)."""

    __slots__ = ("_elapsed", "_started")

    def __init__(self) -> None:
        self._elapsed = 0.0
        self._started = 0.0

    def start(self) -> None:
        self._started = time.perf_counter()

    def stop(self) -> None:
        self._elapsed += time.perf_counter() - self._started

    def read_and_reset(self) -> float:
        """Seconds in the intervals since the last read."""
        elapsed, self._elapsed = self._elapsed, 0.0
        return elapsed


class CudaEventClock:
    """Intervals of device time on the current CUDA stream, as pairs of timing events read at the window's end.

    The host returns from an optimizer step long before the GPU has run it; the events time the kernels themselves.
    Events are reused once read, so a long window costs two event records per interval and no allocation.
    """

    __slots__ = ("_free", "_open", "_pairs")

    def __init__(self) -> None:
        self._pairs: list[tuple[Any, Any]] = []
        self._free: list[Any] = []
        self._open: Any = None

    def _event(self) -> Any:
        return self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        event = self._event()
        event.record()
        self._open = event

    def stop(self) -> None:
        event = self._event()
        event.record()
        self._pairs.append((self._open, event))

    def read_and_reset(self) -> float:
        """Seconds in the intervals since the last read (waits for the last interval's end event)."""
        if not self._pairs:
            return 0.0
        self._pairs[-1][1].synchronize()
        milliseconds = 0.0
        for started, stopped in self._pairs:
            milliseconds += started.elapsed_time(stopped)
            self._free += (started, stopped)
        self._pairs.clear()
        return milliseconds / 1000.0


def device_clock(device: torch.device) -> HostClock | CudaEventClock:
    """The clock of work that runs on `device`: CUDA events on a GPU, the host clock elsewhere."""
    return CudaEventClock() if device.type == "cuda" else HostClock()


class PeakMemory:
    """The peak memory of a window: the CUDA allocator's peak (reset at each read when `resets`), elsewhere the
    process's peak resident memory, which only grows (the operating system keeps no per-window peak)."""

    def __init__(self, device: torch.device, resets: bool) -> None:
        self.device = device
        self.on_cuda = device.type == "cuda"
        # The reference's memory metrics (skip_memory_metrics=False) read the allocator's peak over the whole run;
        # resetting it per window would change them, so the window figure is then the run's peak so far.
        self.resets = resets and self.on_cuda
        self.kind = "cuda_max_allocated" if self.on_cuda else "process_max_resident"

    def read(self) -> int | None:
        """Bytes, or None where nothing can be read (no `resource` module)."""
        if self.on_cuda:
            peak = torch.cuda.max_memory_allocated(self.device)
            if self.resets:
                torch.cuda.reset_peak_memory_stats(self.device)
            return int(peak)
        try:
            import resource
        except ImportError:  # Windows
            return None
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB, macOS bytes
