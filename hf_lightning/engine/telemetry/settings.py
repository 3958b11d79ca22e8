"""What the user chose for the telemetry: the trainer's `telemetry=` keyword or an `hf_lightning.Telemetry` Lightning
callback in `callbacks=`, checked when the trainer is built.

No TrainingArguments field carries it (extensions take a keyword of our trainer or a Lightning callback,
docs/design.md), so a script written for the reference runs unchanged with the telemetry on, and a TRL trainer,
whose constructor has no `telemetry=` keyword, takes the callback.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

FLOPS_MODES = ("auto", "measure", "reference")


@dataclass(frozen=True)
class TelemetrySettings:
    """The telemetry's options. Defaults: on, shown on the progress bar, sent to the Lightning loggers under `perf/`,
    summarised at the end of `train()` (printed; written to `output_dir/run_performance.json` only when
    `summary_file`), and kept out of `log_history` / `trainer_state.json` and out of `output_dir`, which stay the
    reference's."""

    enabled: bool = True
    # Also put each window's figures into the training log entries (log_history, trainer_state.json, printed logs)
    # and tokens/s into evaluate()'s metrics.
    log_history: bool = False
    # Peak FLOP/s of one device, for MFU where Lightning's `get_available_flops` knows none (a CPU, a new GPU).
    peak_flops: float | None = None
    progress_bar: bool = True
    summary: bool = True
    # Also write the summary into `output_dir/run_performance.json` (an opt-in: the folder holds what the reference
    # writes otherwise).
    summary_file: bool = False
    # How FLOPs are counted (engine/telemetry/flops.py): "auto" from a transformers model's config (no model code
    # runs), "measure" with Lightning's measure_flops on a meta copy (the forward's code runs once more), "reference"
    # the reference's floating_point_ops only.
    flops: str = "auto"

    def __post_init__(self) -> None:
        for name in ("enabled", "log_history", "progress_bar", "summary", "summary_file"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Telemetry({name}=...) takes True or False, got {getattr(self, name)!r}")
        if self.flops not in FLOPS_MODES:
            raise ValueError(
                f"Telemetry(flops={self.flops!r}): use one of {', '.join(map(repr, FLOPS_MODES))} ('auto' counts from a "
                "transformers model's config without running the model; 'measure' runs its forward once on a meta copy)."
            )
        peak = self.peak_flops
        if isinstance(peak, numbers.Real) and not isinstance(peak, bool):
            object.__setattr__(self, "peak_flops", float(peak))  # a NumPy number as well
            peak = self.peak_flops
        if peak is not None and (
            isinstance(peak, bool) or not isinstance(peak, float) or not math.isfinite(peak) or peak <= 0
        ):
            raise ValueError(
                f"Telemetry(peak_flops={peak!r}): give the peak FLOP/s of one device as a positive number, e.g. "
                "peak_flops=989e12 for an H100 SXM in bf16, or leave it None to take Lightning's figure for known GPUs."
            )


OFF = TelemetrySettings(enabled=False)


def _settings_of(value: Any) -> TelemetrySettings | None:
    """The settings a `Telemetry` callback carries (found by attribute, so no Lightning import here)."""
    settings = getattr(value, "telemetry_settings", None)
    return settings if isinstance(settings, TelemetrySettings) else None


def resolve_telemetry(keyword: Any, lightning_callbacks: list[Any]) -> tuple[TelemetrySettings, Any]:
    """The settings from the trainer's `telemetry=` keyword (True, False, or a `Telemetry(...)`) and the `Telemetry`
    callbacks among `callbacks=`, with the `Telemetry` object that gave them (its `summary` receives each run's), or
    None; one error naming the keyword and the fix for anything else."""
    from_callbacks = [cb for cb in lightning_callbacks if _settings_of(cb) is not None]
    if len(from_callbacks) > 1:
        raise ValueError(
            f"callbacks=: {len(from_callbacks)} hf_lightning.Telemetry callbacks were given; pass one."
        )
    if keyword is None or keyword is True:
        return (_settings_of(from_callbacks[0]), from_callbacks[0]) if from_callbacks else (TelemetrySettings(), None)
    if from_callbacks:
        raise ValueError(
            "telemetry= and a Telemetry callback in callbacks= were both given; pass the options once, either "
            "telemetry=Telemetry(...) or callbacks=[Telemetry(...)]."
        )
    if keyword is False:
        return OFF, None
    settings = _settings_of(keyword)
    if settings is None:
        raise TypeError(
            f"telemetry={keyword!r}: pass True (the default), False to switch the telemetry off, or "
            "hf_lightning.Telemetry(...) for its options."
        )
    return settings, keyword
