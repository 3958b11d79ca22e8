"""`Telemetry`: the telemetry's options as a Lightning callback, for `callbacks=[Telemetry(...)]` (any trainer, TRL's
included, and the YAML `trainer: callbacks:` list) or the trainer's `telemetry=` keyword.

The measuring itself is the trainer's `TelemetryMeter` (engine/telemetry/meter.py), fed from inside the training
step, so this callback overrides no batch hook and Lightning's loop calls nothing of it per step. After each
`train()` its `summary` holds the run's figures (what `summary_file=True` writes to `run_performance.json`).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from hf_lightning.engine.telemetry.settings import TelemetrySettings


class Telemetry(pl.Callback):
    """Where a run's time goes: throughput, FLOPs and MFU, data wait, optimizer, evaluation, checkpoint, Hub and
    generation shares, peak memory (README, "Telemetry").

    Args:
        enabled: False switches the telemetry off (the run is then exactly as without it).
        log_history: also put each logging window's figures into the training log entries (`log_history`,
            `trainer_state.json`, printed logs) as `perf/<name>`, and tokens/s into evaluate()'s metrics.
        peak_flops: peak FLOP/s of one device, for MFU where Lightning knows none (a CPU, an unlisted GPU).
        progress_bar: show tokens/s (or samples/s) and MFU on the progress bar.
        summary: print the end-of-run summary.
        summary_file: also write it to `output_dir/run_performance.json` (off: `output_dir` holds what the reference
            writes); `Telemetry.summary` and `plot_performance(telemetry.summary)` read it without a file.
        flops: how FLOPs are counted: "auto" (from a transformers model's config, attention included, without
            running the model; the reference's count otherwise), "measure" (Lightning's `measure_flops` on a meta
            copy of the model at the first micro-batch: the forward's code runs once more), "reference".
    """

    def __init__(
        self,
        enabled: bool = True,
        *,
        log_history: bool = False,
        peak_flops: float | None = None,
        progress_bar: bool = True,
        summary: bool = True,
        summary_file: bool = False,
        flops: str = "auto",
    ) -> None:
        self.telemetry_settings = TelemetrySettings(
            enabled=enabled,
            log_history=log_history,
            peak_flops=peak_flops,
            progress_bar=progress_bar,
            summary=summary,
            summary_file=summary_file,
            flops=flops,
        )
        # The last `train()`'s figures, as run_performance.json holds them (None before the first).
        self.summary: dict[str, Any] | None = None
