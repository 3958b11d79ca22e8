"""The telemetry's arithmetic, pure: a stretch of training's totals -> its rates, MFU and time shares; the run's
summary (`run_performance.json`), its printed form and the progress bar's text.

Rates are counts over the stretch's wall time: samples/s and tokens/s of all processes (`samples_per_second`) and
of this process (`..._per_device`); MFU is the FLOPs of all processes over the time, the processes and the peak
FLOP/s of one device. This process's rates, FLOP/s and MFU come from Lightning's `Throughput` (the stretch as its
window of two updates); the rates of all processes are their summed counts over the same time. Shares are seconds
over the wall time; `other` is what is left (forward, backward, the trainer's own work).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hf_lightning.core.blocked_time import CAUSES

FORMAT_VERSION = 1
# The parts of the wall time, in the order the summary lists them.
PARTS = ("data_wait", "optimizer", *CAUSES, "other")


@dataclass
class Totals:
    """What a stretch of training (one logging window, or the run) did and where its time went."""

    seconds: float = 0.0
    updates: int = 0
    samples: float = 0.0  # all processes
    samples_local: float = 0.0  # this process
    tokens: float | None = None  # all processes; None: not counted (no main input)
    tokens_local: float | None = None
    flops: float | None = None  # all processes; None: not known
    data_wait: float = 0.0
    optimizer: float = 0.0
    blocked: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    peak_memory: int | None = None  # bytes

    def add(self, other: Totals) -> None:
        """Fold a later stretch into this one (the run's totals from its windows)."""
        self.seconds += other.seconds
        self.updates += other.updates
        self.samples += other.samples
        self.samples_local += other.samples_local
        self.tokens = _plus(self.tokens, other.tokens)
        self.tokens_local = _plus(self.tokens_local, other.tokens_local)
        self.flops = _plus(self.flops, other.flops)
        self.data_wait += other.data_wait
        self.optimizer += other.optimizer
        for cause, seconds in other.blocked.items():
            self.blocked[cause] = self.blocked.get(cause, 0.0) + seconds
        if other.peak_memory is not None:
            self.peak_memory = max(self.peak_memory or 0, other.peak_memory)

    def seconds_by_part(self) -> dict[str, float]:
        """Wall seconds per part (`PARTS`); `generation` only when there was any."""
        parts = {"data_wait": self.data_wait, "optimizer": self.optimizer}
        parts.update({cause: self.blocked.get(cause, 0.0) for cause in CAUSES})
        if not parts["generation"]:
            del parts["generation"]
        parts["other"] = max(self.seconds - sum(parts.values()), 0.0)
        return parts


def _plus(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else a + b


def _device_rates(totals: Totals, world_size: int, peak_flops: float | None) -> dict[str, float]:
    """Lightning's `Throughput` over the stretch: this process's samples/s and tokens/s, and the FLOP/s and MFU of
    one device (the FLOPs of all processes shared equally, as `Throughput` assumes)."""
    # lazy: Lightning loads when a run starts, not at `from hf_lightning import Trainer` (this module comes with it)
    from lightning.fabric.utilities.throughput import Throughput

    tokens = totals.tokens_local
    # `Throughput` takes lengths of at least one per sample; a stretch of (nearly) empty samples has no token rate.
    lengths = tokens is not None and tokens >= totals.samples_local
    flops = None if totals.flops is None else totals.flops / world_size
    meter = Throughput(available_flops=peak_flops, world_size=1, window_size=2)
    meter.update(time=0.0, batches=0, samples=0, lengths=0 if lengths else None, flops=None if flops is None else 0)
    meter.update(
        time=totals.seconds,
        batches=totals.updates,
        samples=max(int(totals.samples_local), totals.updates),
        lengths=int(tokens) if lengths else None,
        flops=flops,
    )
    return meter.compute()


def figures(totals: Totals, world_size: int, peak_flops: float | None) -> dict[str, float]:
    """The stretch's figures, keyed as the loggers receive them under `perf/`."""
    seconds = totals.seconds
    if seconds <= 0 or totals.updates <= 0:
        return {}
    device = _device_rates(totals, world_size, peak_flops)
    result = {
        "seconds_per_step": seconds / totals.updates,
        "samples_per_second": totals.samples / seconds,
        # `Throughput` counts at least one sample per step (a batch it could not size counts none here).
        "samples_per_second_per_device": (
            device["device/samples_per_sec"] if totals.samples_local >= totals.updates else totals.samples_local / seconds
        ),
    }
    if totals.tokens is not None:
        result["tokens_per_second"] = totals.tokens / seconds
        result["tokens_per_second_per_device"] = device.get("device/items_per_sec", (totals.tokens_local or 0) / seconds)
    if totals.flops is not None:
        result["flops_per_step"] = totals.flops / totals.updates
        result["flops_per_second_per_device"] = device["device/flops_per_sec"]
        if "device/mfu" in device:
            result["mfu"] = device["device/mfu"]
    for part, part_seconds in totals.seconds_by_part().items():
        result[f"{part}_share"] = part_seconds / seconds
    if totals.peak_memory is not None:
        result["peak_memory_mb"] = totals.peak_memory / 2**20
    return result


def progress_text(window: dict[str, float]) -> str:
    """What the progress bar shows after a window: tokens/s (samples/s without tokens) and MFU where known."""
    if "tokens_per_second" in window:
        parts = [f"tokens/s={_short(window['tokens_per_second'])}"]
    elif "samples_per_second" in window:
        parts = [f"samples/s={_short(window['samples_per_second'])}"]
    else:
        return ""
    if "mfu" in window:
        parts.append(f"MFU={window['mfu']:.1%}")
    return ", ".join(parts)


def _short(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def summary(
    run: Totals,
    *,
    world_size: int,
    peak_flops: float | None,
    context: dict[str, Any],
    windows: list[dict[str, Any]],
    passes: list[dict[str, Any]],
) -> dict[str, Any]:
    """The content of `run_performance.json`: the run's figures and time breakdown, each window's figures and the
    evaluate() / predict() passes made during training, with `context` (device, precision, sources, steps)."""
    seconds = run.seconds
    breakdown = {
        part: {"seconds": part_seconds, "share": part_seconds / seconds if seconds > 0 else 0.0}
        for part, part_seconds in run.seconds_by_part().items()
    }
    return {
        "format_version": FORMAT_VERSION,
        **context,
        "world_size": world_size,
        "peak_flops_per_device": peak_flops,
        "training_seconds": seconds,
        "updates": run.updates,
        "samples": run.samples,
        "tokens": run.tokens,
        "flops": run.flops,
        "whole_run": figures(run, world_size, peak_flops),
        "time_breakdown": breakdown,
        "windows": windows,
        "evaluations": passes,
    }


_PART_NAMES = {
    "data_wait": "waiting for data",
    "optimizer": "optimizer step",
    "evaluation": "evaluation",
    "checkpoint": "checkpoint saves",
    "hub": "Hub pushes",
    "generation": "generation",
    "other": "forward, backward and the rest",
}


def summary_text(content: dict[str, Any], path: str | None) -> str:
    """The printed end-of-run summary: throughput, FLOPs and MFU, memory, and where the wall time went."""
    run = content["whole_run"]
    lines = [f"***** Run performance{f' ({path})' if path else ''} *****"]
    if not run:
        lines.append("  no optimizer step was timed")
        return "\n".join(lines)
    lines.append(
        f"  {content['updates']} steps in {content['training_seconds']:.1f} s "
        f"({run['seconds_per_step'] * 1000:.1f} ms/step), {content['startup_seconds']:.1f} s before the first"
    )
    throughput = f"  samples/s {run['samples_per_second']:.4g}"
    if "tokens_per_second" in run:
        throughput += f" | tokens/s {run['tokens_per_second']:.4g}"
    if content["world_size"] > 1:
        throughput += f" (all {content['world_size']} processes)"
    lines.append(throughput)
    if "flops_per_step" in run:
        flops_line = f"  FLOPs/step {run['flops_per_step']:.3g} ({content['flops_source']})"
        if "mfu" in run:
            flops_line += (
                f" | MFU {run['mfu']:.1%} of {content['peak_flops_per_device']:.3g} FLOP/s per device "
                f"({content['peak_flops_source']}, {content['compute_dtype']})"
            )
        else:
            flops_line += (
                f" | MFU unknown: no peak FLOP/s for {content['device']} in {content['compute_dtype']}; "
                "give Telemetry(peak_flops=...)"
            )
        lines.append(flops_line)
    if "peak_memory_mb" in run:
        kind = "device peak" if content["memory_kind"] == "cuda_max_allocated" else "process peak resident"
        lines.append(f"  memory: {run['peak_memory_mb']:.0f} MiB ({kind})")
    shares = ", ".join(
        f"{_PART_NAMES[part]} {entry['share']:.1%}"
        for part, entry in content["time_breakdown"].items()
        # A cause that (nearly) never blocked is left out of the line; the file keeps every part.
        if part not in CAUSES or entry["share"] >= 0.0005
    )
    lines.append(f"  time: {shares}")
    return "\n".join(lines)
