"""`TrainerMemoryTracker`: the reference's memory metrics (`skip_memory_metrics=False`; EVAL-2.13).

A port of transformers' `trainer_utils.TrainerMemoryTracker`. Each stage (`init`, `train`, `eval`, `test`)
measures the process's resident memory (psutil) and, when an accelerator is present, its allocated memory,
and reports `{stage}_mem_{cpu,gpu}_{alloc,peaked}_delta` in bytes. The `init` keys and `before_init_mem_*`
go to the first stage that reports; stages nested in another (evaluation during training) are ignored.
"""

from __future__ import annotations

import gc
import inspect
import threading
from types import ModuleType
from typing import Any

import torch

__all__ = ["TrainerMemoryTracker"]

# Accelerator modules of torch with the CUDA memory API, in the reference's order of preference.
_ACCELERATORS = ("cuda", "mlu", "musa", "xpu", "npu", "hpu")


def _accelerator() -> tuple[str, ModuleType] | None:
    """The first available accelerator module (`torch.cuda`, ..., `torch.mps`), None on a CPU-only machine."""
    for name in _ACCELERATORS:
        module = getattr(torch, name, None)
        if module is not None and getattr(module, "is_available", lambda: False)():
            return name, module
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps", torch.mps
    return None


class TrainerMemoryTracker:
    """Tracks CPU (resident set size) and accelerator memory over one trainer stage at a time.

    `start()` / `stop_and_update_metrics(metrics)` take the stage explicitly or derive it from the calling
    method's name (`__init__`, `train`, `evaluate`, `predict`, ...), as the reference does.
    """

    # map trainer methods to metrics prefix
    stages = {
        "__init__": "init",
        "train": "train",
        "execute": "train",  # engine/training_run.py's TrainingRun methods
        "_fit_attempt": "train",
        "_finalize": "train",
        "evaluate": "eval",
        "predict": "test",
    }

    def __init__(self, skip_memory_metrics: bool = False) -> None:
        self.skip_memory_metrics = skip_memory_metrics
        if skip_memory_metrics:
            return
        try:
            import psutil
        except ImportError as error:
            raise ValueError(
                "skip_memory_metrics=False measures memory with psutil, which is not installed; install it with "
                "`pip install psutil` or leave skip_memory_metrics=True."
            ) from error
        self.process = psutil.Process()
        accelerator = _accelerator()
        self.device_name, self.device_module = accelerator if accelerator else (None, None)
        # The reference's `self.torch`: GPU keys are reported whenever an accelerator exists.
        self.torch = torch if accelerator else None
        self.gpu: dict[str, dict[str, Any]] = {}
        self.cpu: dict[str, dict[str, Any]] = {}
        self.cur_stage: str | None = None
        self.init_reported = False
        self.peak_monitoring = False
        self._peak_thread: threading.Thread | None = None

    def derive_stage(self) -> str:
        """The stage of the trainer method two frames up (the caller of `start` / `stop_and_update_metrics`)."""
        caller = inspect.currentframe().f_back.f_back.f_code.co_name
        if caller in self.stages:
            return self.stages[caller]
        raise ValueError(
            f"was called from {caller}, but only expect to be called from one of {self.stages.keys()}"
        )

    def cpu_mem_used(self) -> int:
        """Resident set size of this process, in bytes."""
        return self.process.memory_info().rss

    def peak_monitor_func(self) -> None:
        """Poll the resident set size until `stop()`; the largest value is the stage's CPU peak."""
        self.cpu_mem_used_peak = -1
        while True:
            self.cpu_mem_used_peak = max(self.cpu_mem_used(), self.cpu_mem_used_peak)
            # The reference polls without sleeping: a sleep would miss short peaks.
            if not self.peak_monitoring:
                break

    def _empty_cache(self) -> None:
        # HPU reserves all device memory for the process: nothing to empty there.
        if self.device_module is not None and self.device_name != "hpu":
            self.device_module.empty_cache()

    def _allocated(self) -> int:
        if self.device_name == "mps":
            return self.device_module.current_allocated_memory()
        return self.device_module.memory_allocated()

    def start(self, stage: str | None = None) -> None:
        """Start tracking the stage (derived from the caller when not given); ignored inside another stage."""
        if self.skip_memory_metrics:
            return
        stage = stage if stage is not None else self.derive_stage()
        # deal with nested calls of eval during train - simply ignore those
        if self.cur_stage is not None and self.cur_stage != stage:
            return
        self.cur_stage = stage
        gc.collect()
        if self.device_module is not None:
            if self.device_name != "mps":
                self.device_module.reset_peak_memory_stats()
            self._empty_cache()
            self.gpu_mem_used_at_start = self._allocated()
        self.cpu_mem_used_at_start = self.cpu_mem_used()
        self.peak_monitoring = True
        self._peak_thread = threading.Thread(target=self.peak_monitor_func, daemon=True)
        self._peak_thread.start()

    def stop(self, stage: str) -> None:
        """Stop tracking `stage` and record its deltas (ignored when another stage is being tracked)."""
        # deal with nested calls of eval during train - simply ignore those
        if self.cur_stage is not None and self.cur_stage != stage:
            return
        # this sends a signal to peak_monitor_func to complete its loop
        self.peak_monitoring = False
        if self._peak_thread is not None:
            self._peak_thread.join()
            self._peak_thread = None
        # first ensure all objects get collected and their memory is freed
        gc.collect()
        self._empty_cache()

        # alloc_delta: allocated at the end minus at the start; peaked_delta: peak minus allocated at the end.
        # What the stage consumed at most is their sum.
        if self.device_module is not None:
            gpu_now = self._allocated()
            # torch.mps has no max_memory_allocated.
            gpu_peak = None if self.device_name == "mps" else self.device_module.max_memory_allocated()
            self.gpu[self.cur_stage] = {
                "begin": self.gpu_mem_used_at_start,
                "end": gpu_now,
                "alloc": gpu_now - self.gpu_mem_used_at_start,
                "peaked": max(0, gpu_peak - gpu_now) if gpu_peak is not None else "Not available",
            }
        cpu_now = self.cpu_mem_used()
        self.cpu[self.cur_stage] = {
            "begin": self.cpu_mem_used_at_start,
            "end": cpu_now,
            "alloc": cpu_now - self.cpu_mem_used_at_start,
            "peaked": max(0, self.cpu_mem_used_peak - cpu_now),
        }
        # reset - cycle finished
        self.cur_stage = None

    def update_metrics(self, stage: str, metrics: dict[str, Any]) -> None:
        """Add the stage's keys to `metrics`, preceded once by the `init` keys (and `before_init_mem_*`)."""
        if self.skip_memory_metrics:
            return
        # deal with nested calls of eval during train - simply ignore those
        if self.cur_stage is not None and self.cur_stage != stage:
            return
        # init has no metrics of its own: they go to the first stage that reports
        stages = [stage]
        if not self.init_reported:
            stages.insert(0, "init")
            self.init_reported = True
        for name in stages:
            for kind in ("alloc", "peaked"):
                if name in self.cpu and kind in self.cpu[name]:
                    metrics[f"{name}_mem_cpu_{kind}_delta"] = self.cpu[name][kind]
                if self.torch is not None and name in self.gpu and kind in self.gpu[name]:
                    metrics[f"{name}_mem_gpu_{kind}_delta"] = self.gpu[name][kind]
        # memory in use when the trainer was created, before it allocated anything
        if stages[0] == "init":
            metrics["before_init_mem_cpu"] = self.cpu["init"]["begin"]
            if self.torch is not None:
                metrics["before_init_mem_gpu"] = self.gpu["init"]["begin"]

    def stop_and_update_metrics(
        self, metrics: dict[str, Any] | None = None, stage: str | None = None
    ) -> None:
        """`stop` then, when `metrics` is given, `update_metrics` (the `init` stage keeps its data for later)."""
        if self.skip_memory_metrics:
            return
        stage = stage if stage is not None else self.derive_stage()
        self.stop(stage)
        if metrics is not None:
            self.update_metrics(stage, metrics)
