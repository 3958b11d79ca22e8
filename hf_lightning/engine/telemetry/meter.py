"""`TelemetryMeter`: one trainer's telemetry, the component that measures where a run's time goes.

Built with the trainer (the facade keeps it as `_telemetry`, None when switched off). During `train()` the training
step feeds it (engine/module.py: the batch wait, each micro-batch's counts, the optimizer step; `blocked_by` around
evaluation, saves, Hub pushes and generation); a step that logs closes a window (engine/logging_connector.py), whose
figures go to the progress bar and to the Lightning loggers under `perf/` (or, when asked, into the log entry); the
end of `train()` prints the run's summary (and writes `output_dir/run_performance.json` when asked). `evaluate()` and `predict()`
are measured as passes (samples/s, tokens/s). Nothing here changes what the reference writes unless
`Telemetry(log_history=True)`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch

from hf_lightning.checkpoint.durability import fsync_directory, fsync_file
from hf_lightning.core.blocked_time import BlockedTime
from hf_lightning.engine.telemetry.clocks import HostClock, PeakMemory, device_clock
from hf_lightning.engine.telemetry.counting import BatchCounter
from hf_lightning.engine.telemetry.figures import Totals, figures, progress_text, summary, summary_text
from hf_lightning.engine.telemetry.settings import TelemetrySettings
from hf_lightning.integrations.loggers import publish_perf

if TYPE_CHECKING:
    from torch import nn

    from hf_lightning.args.training_args import TrainingArguments
    from hf_lightning.callbacks import CallbackHandler, TrainerState
    from hf_lightning.engine.memory import TrainerMemoryTracker

logger = logging.getLogger(__name__)


class MeteredTrainer(Protocol):
    """The trainer as its telemetry sees it: the arguments, the state, the model and tokenizer (what a batch's
    tokens are), the callbacks (the progress bar), the memory metrics' setting, the sum across processes and the
    loggers in use."""

    args: TrainingArguments
    state: TrainerState
    model: nn.Module
    processing_class: Any
    callback_handler: CallbackHandler
    _memory_tracker: TrainerMemoryTracker

    def _all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor: ...
    def _current_loggers(self) -> list[Any]: ...

SUMMARY_NAME = "run_performance.json"


class _Training:
    """What `begin_training` learnt of the fit, and the run's totals so far."""

    def __init__(self, **facts: Any) -> None:
        self.__dict__.update(facts)
        self.run = Totals()
        self.windows: list[dict[str, Any]] = []
        self.passes: list[dict[str, Any]] = []


class EvaluationPass:
    """One evaluate() / predict() call being measured: its clock and its batch counts."""

    def __init__(self, kind: str, prefix: str, counter: BatchCounter) -> None:
        self.kind = kind
        self.prefix = prefix
        self.counter = counter
        self.started = time.perf_counter()


class TelemetryMeter:
    """A trainer's telemetry (engine/telemetry/): per-step clocks and counters, windows, passes, the run summary."""

    def __init__(self, facade: MeteredTrainer, settings: TelemetrySettings, holder: Any = None) -> None:
        self._facade = facade
        self.settings = settings
        self._holder = holder  # the user's `Telemetry` callback, whose `summary` gets each run's
        self.blocked = BlockedTime()
        self.data_clock = HostClock()
        # Set when training starts (they need the fit's device); None outside `train()`.
        self.optimizer_clock: Any = None
        self.counter: BatchCounter | None = None
        self._training: _Training | None = None
        self.current_pass: EvaluationPass | None = None
        self.last_summary: dict[str, Any] | None = None

    # ---- training ---------------------------------------------------------------------------------------------

    def begin_training(
        self,
        *,
        device: torch.device,
        world_size: int,
        peak_flops: float | None,
        peak_flops_source: str | None,
        compute_dtype: torch.dtype,
        flops_rule: Callable[[Mapping[str, Any], int], Any] | None,
        loggers: list[Any],
        setup_seconds: float,
    ) -> None:
        """Start measuring a fit, once Lightning has set it up (an `auto_find_batch_size` retry starts again)."""
        facade = self._facade
        self.counter = BatchCounter(
            getattr(facade.model, "main_input_name", "input_ids"),
            getattr(facade.processing_class, "pad_token_id", None),
            flops_rule,
        )
        self.optimizer_clock = device_clock(device)
        self.data_clock.read_and_reset()
        self.blocked.take()
        memory_tracker = facade._memory_tracker
        self._training = _Training(
            device=device,
            world_size=world_size,
            peak_flops=peak_flops,
            peak_flops_source=peak_flops_source,
            compute_dtype=compute_dtype,
            loggers=loggers,
            setup_seconds=setup_seconds,
            memory=PeakMemory(device, resets=memory_tracker.skip_memory_metrics),
            started=time.perf_counter(),
            window_started=time.perf_counter(),
            window_step=facade.state.global_step,
            total_flos=facade.state.total_flos,
        )

    def _take_window(self) -> Totals:
        """The totals since the last window (all processes' counts summed), and start the next window."""
        training = self._training
        facade = self._facade
        now = time.perf_counter()
        samples, local_flops, tokens = self.counter.take()
        # FLOPs: the run's rule applied to the input sizes (flops.py), else the reference's `floating_point_ops`,
        # which `store_flos` has already summed over the processes into `state.total_flos`.
        measured = self.counter.flops_rule
        total_flos = facade.state.total_flos
        reference_flops = total_flos - training.total_flos
        training.total_flos = total_flos
        totals = Totals(
            seconds=now - training.window_started,
            updates=facade.state.global_step - training.window_step,
            samples_local=samples,
            tokens_local=tokens,
            data_wait=self.data_clock.read_and_reset(),
            optimizer=self.optimizer_clock.read_and_reset(),
            blocked=self.blocked.take(),
            peak_memory=training.memory.read(),
        )
        totals.samples, totals.tokens, all_flops = self._summed(samples, tokens, local_flops)
        totals.flops = all_flops if measured is not None else (reference_flops or None)
        training.window_started = now
        training.window_step = facade.state.global_step
        return totals

    def _summed(
        self, samples: float, tokens: float | None, flops: float | None
    ) -> tuple[float, float | None, float | None]:
        """The counts of every process (one all-reduce when there are several; every process calls this)."""
        world_size = self._training.world_size if self._training is not None else self._facade.args.world_size
        if world_size <= 1 or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return samples, tokens, flops
        values = torch.tensor(
            [samples, tokens or 0.0, flops or 0.0], dtype=torch.float64, device=self._facade.args.device
        )
        samples, all_tokens, all_flops = self._facade._all_reduce_sum(values).tolist()
        return samples, None if tokens is None else all_tokens, None if flops is None else all_flops

    def close_window(self, logs: dict[str, Any]) -> None:
        """A training log entry is being made: the window since the last one is measured and shown. With
        `log_history=True` its figures join `logs` (as `perf/<name>`); otherwise they go to the loggers only."""
        if self._training is None:
            return
        training = self._training
        step = self._facade.state.global_step
        totals = self._take_window()
        training.run.add(totals)
        window = figures(totals, training.world_size, training.peak_flops)
        if not window:
            return
        training.windows.append({"step": step, **window})
        self._show_progress(window)
        if self.settings.log_history:
            logs.update({f"perf/{name}": value for name, value in window.items()})
        else:
            publish_perf(training.loggers, window, step)

    def _show_progress(self, window: dict[str, float]) -> None:
        if not self.settings.progress_bar:
            return
        text = progress_text(window)
        for callback in self._facade.callback_handler.callbacks:
            show = getattr(callback, "show_performance", None)
            if show is not None:
                show(text)

    def finish_training(self) -> dict[str, Any] | None:
        """The end of `train()`: the last stretch folded in, the summary printed and written (processes allowed to
        save), and returned. Every process calls it (the counts are summed over them)."""
        training = self._training
        if training is None:
            return None
        facade = self._facade
        tail = self._take_window()
        training.run.add(tail)
        # The run's wall time is measured end to end (a window's time is counted once in it).
        training.run.seconds = time.perf_counter() - training.started
        content = summary(
            training.run,
            world_size=training.world_size,
            peak_flops=training.peak_flops,
            context={
                "global_step": facade.state.global_step,
                "device": str(training.device),
                "compute_dtype": str(training.compute_dtype).replace("torch.", ""),
                "peak_flops_source": training.peak_flops_source,
                "flops_source": (
                    self.counter.flops_rule.source if self.counter.flops_rule is not None
                    else "floating_point_ops" if training.run.flops is not None else None
                ),
                "memory_kind": training.memory.kind,
                "startup_seconds": training.setup_seconds,
            },
            windows=training.windows,
            passes=training.passes,
        )
        self._training = None
        self.counter = None
        self.optimizer_clock = None
        self.last_summary = content
        if self._holder is not None:
            self._holder.summary = content
        path = self._write_summary(content) if self.settings.summary_file else None
        if self.settings.summary:
            if facade.args.process_index == 0:  # not the overridable method: the reference calls it a set number of times
                print(summary_text(content, path))
        return content

    def _write_summary(self, content: dict[str, Any]) -> str | None:
        """`output_dir/run_performance.json`, replaced atomically (written beside it, fsynced, renamed, the folder
        fsynced), by the processes allowed to save."""
        args = self._facade.args
        if not args.should_save:
            return None
        path = os.path.join(args.output_dir, SUMMARY_NAME)
        os.makedirs(args.output_dir, exist_ok=True)
        temporary = f"{path}.tmp-{os.getpid()}"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(content, handle, indent=2)
        fsync_file(temporary)
        os.replace(temporary, path)
        fsync_directory(args.output_dir)
        return path

    # ---- evaluate() / predict() -------------------------------------------------------------------------------

    def begin_pass(self, kind: str, prefix: str) -> EvaluationPass:
        """An evaluate() ("evaluate") or predict() ("predict") call starts; its loop counts into `current_pass`."""
        facade = self._facade
        counter = BatchCounter(
            getattr(facade.model, "main_input_name", "input_ids"),
            getattr(facade.processing_class, "pad_token_id", None),
        )
        evaluation = EvaluationPass(kind, prefix, counter)
        self.current_pass = evaluation
        return evaluation

    def end_pass(self, evaluation: EvaluationPass, metrics: dict[str, Any], num_samples: int) -> None:
        """The pass's samples/s and tokens/s: to the loggers under `perf/<prefix>_...`, into the run's summary when
        training, into `metrics` with `log_history=True`. Every process calls it."""
        self.current_pass = None
        seconds = time.perf_counter() - evaluation.started
        _, _, tokens = evaluation.counter.take()
        _, tokens, _ = self._summed(0.0, tokens, None)
        if seconds <= 0:
            return
        prefix = evaluation.prefix
        result = {f"{prefix}_samples_per_second": num_samples / seconds}
        if tokens is not None:
            result[f"{prefix}_tokens_per_second"] = tokens / seconds
        facade = self._facade
        if self._training is not None:
            self._training.passes.append(
                {"kind": evaluation.kind, "prefix": prefix, "step": facade.state.global_step, "seconds": seconds,
                 "samples": num_samples, "tokens": tokens, **{k[len(prefix) + 1:]: v for k, v in result.items()}}
            )
        if self.settings.log_history and evaluation.kind == "evaluate":
            metrics.update({f"perf/{name}": value for name, value in result.items()})
        else:
            loggers = self._training.loggers if self._training is not None else facade._current_loggers()
            publish_perf(loggers, result, facade.state.global_step, outside_fit=self._training is None)
