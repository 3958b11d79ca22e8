"""Training curves from `trainer.state.log_history`: training loss, evaluation metrics and learning rate
against the optimizer step; and where a run's time went, from its `run_performance.json` (the telemetry's
summary, engine/telemetry/): throughput and MFU per logging window, and the window's time shares.

matplotlib is optional (`pip install -e ".[plot]"` from a checkout, or `pip install matplotlib`) and imported
on first use. Figures are built with matplotlib's object API on an Agg canvas, so nothing needs a display or touches pyplot's global
state; in Jupyter a returned figure is shown by the inline backend (`%matplotlib inline`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

# Evaluation keys that describe the run rather than the model; they are not plotted.
_EVAL_BOOKKEEPING_SUFFIXES = (
    "_runtime",
    "_samples_per_second",
    "_steps_per_second",
    "_model_preparation_time",
    "_jit_compilation_time",
)
_NOT_METRICS = ("epoch", "step", "total_flos")


def _require_matplotlib() -> Any:
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise ImportError(
            "hf_lightning.integrations.plotting needs matplotlib, which is not installed: "
            'pip install -e ".[plot]" from a checkout (or pip install matplotlib)'
        ) from error
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    return Figure, FigureCanvasAgg


def _evaluation_prefix(entry: Mapping[str, Any]) -> str:
    """`eval` for `eval_loss` ..., `eval_<name>` for one of several eval datasets, or the custom prefix."""
    for key in entry:
        if key.endswith("_runtime") and key != "train_runtime":
            return key[: -len("_runtime")]
    losses = [key for key in entry if key.endswith("_loss")]
    return losses[0][: -len("_loss")] if losses else "eval"


def collect_curves(log_history: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Group the history's numbers into panels: `loss` (training and evaluation losses), `metrics` (other
    evaluation metrics) and `learning_rate`; each maps a key of the log to its `(step, value)` points."""
    panels: dict[str, dict[str, list[tuple[int, float]]]] = {"loss": {}, "metrics": {}, "learning_rate": {}}

    def add(panel: str, key: str, step: int, value: Any) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            panels[panel].setdefault(key, []).append((step, float(value)))

    for entry in log_history:
        step = entry.get("step")
        if step is None:
            continue
        if "loss" in entry:  # a training log
            add("loss", "loss", step, entry["loss"])
            if "learning_rate" in entry:
                add("learning_rate", "learning_rate", step, entry["learning_rate"])
        elif "train_runtime" in entry:  # the final summary: one point, not a curve
            continue
        else:  # an evaluation
            prefix = _evaluation_prefix(entry)
            for key, value in entry.items():
                if key in _NOT_METRICS or not key.startswith(prefix + "_"):
                    continue
                if key.endswith(_EVAL_BOOKKEEPING_SUFFIXES) or "_mem_" in key:
                    continue
                add("loss" if key.endswith("_loss") else "metrics", key, step, value)
    return {panel: curves for panel, curves in panels.items() if curves}


_TITLES = {"loss": "Loss", "metrics": "Evaluation metrics", "learning_rate": "Learning rate"}


def _draw(ax: Any, curves: Mapping[str, list[tuple[int, float]]], title: str) -> None:
    for key, points in curves.items():
        steps, values = zip(*points)
        ax.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3, label=key)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")


def plot_log_history(log_history: Sequence[Mapping[str, Any]], ax: Any = None) -> Any:
    """A matplotlib `Figure` of the run's curves against the step: one panel each for the losses, the other
    evaluation metrics and the learning rate (panels without data are left out). With `ax`, every curve is
    drawn on that axes (the learning rate on a twin y-axis) and `ax.figure` is returned."""
    figure_class, canvas_class = _require_matplotlib()
    panels = collect_curves(log_history)
    if not panels:
        raise ValueError(
            "log_history has no training loss, evaluation metric or learning rate to plot; "
            "train with logging_steps / eval_strategy set so that something is logged"
        )
    if ax is not None:
        for name in ("loss", "metrics"):
            for key, points in panels.get(name, {}).items():
                steps, values = zip(*points)
                ax.plot(steps, values, marker="o", markersize=3, label=key)
        if "learning_rate" in panels:
            twin = ax.twinx()
            _draw(twin, panels["learning_rate"], "")
            twin.set_ylabel("learning rate")
        ax.set_xlabel("step")
        ax.legend(loc="upper left", fontsize="small")
        return ax.figure
    figure = figure_class(figsize=(7.0, 2.6 * len(panels)), layout="constrained")
    canvas_class(figure)  # an Agg canvas: renders and saves without a display
    axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for axis, (name, curves) in zip(axes, panels.items()):
        _draw(axis, curves, _TITLES[name])
    axes[-1].set_xlabel("step")
    return figure


def save_training_plot(
    log_history: Sequence[Mapping[str, Any]],
    output_dir: str | os.PathLike[str],
    filename: str = "training_curves.png",
) -> str:
    """Write `plot_log_history(log_history)` to `output_dir/filename` (format from the extension); returns the path."""
    figure = plot_log_history(log_history)
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(os.fspath(output_dir), filename)
    figure.savefig(path, dpi=100)
    return path


# The time shares of a telemetry window (engine/telemetry/figures.py), bottom to top of the stacked panel.
_SHARES = ("data_wait", "optimizer", "evaluation", "checkpoint", "hub", "generation", "other")


def _read_performance(performance: Mapping[str, Any] | str | os.PathLike[str]) -> Mapping[str, Any]:
    """The summary itself, or read from a `run_performance.json` path or the `output_dir` holding one."""
    if isinstance(performance, Mapping):
        return performance
    path = os.fspath(performance)
    if os.path.isdir(path):
        path = os.path.join(path, "run_performance.json")
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def plot_performance(performance: Mapping[str, Any] | str | os.PathLike[str]) -> Any:
    """A matplotlib `Figure` of where a run's time went, from its telemetry summary (the dict, `run_performance.json`
    or the `output_dir` holding it): tokens/s (else samples/s) per logging window with MFU on a twin axis where
    known, and the window's wall time split into data wait, optimizer step, evaluation, checkpoint, Hub,
    generation and the rest, stacked."""
    figure_class, canvas_class = _require_matplotlib()
    windows = list(_read_performance(performance).get("windows") or [])
    if not windows:
        raise ValueError(
            "the summary has no logging window to plot: train with logging_steps smaller than the run, and the "
            "telemetry on (its summary is `Telemetry.summary`; `Telemetry(summary_file=True)` writes it to output_dir/run_performance.json)"
        )
    steps = [window["step"] for window in windows]
    rate = "tokens_per_second" if all("tokens_per_second" in window for window in windows) else "samples_per_second"
    figure = figure_class(figsize=(7.0, 5.2), layout="constrained")
    canvas_class(figure)
    throughput, shares = figure.subplots(2, 1, sharex=True)
    throughput.plot(steps, [window[rate] for window in windows], marker="o", markersize=3, label=rate)
    throughput.set_ylabel(rate.replace("_per_second", "/s"))
    throughput.set_title("Throughput per logging window")
    throughput.grid(alpha=0.3)
    if all("mfu" in window for window in windows):
        twin = throughput.twinx()
        twin.plot(steps, [window["mfu"] for window in windows], color="tab:red", marker="s", markersize=3,
                  label="mfu")
        twin.set_ylabel("MFU")
    present = [name for name in _SHARES if any(f"{name}_share" in window for window in windows)]
    shares.stackplot(
        steps, *[[window.get(f"{name}_share", 0.0) for window in windows] for name in present], labels=present
    )
    shares.set_ylim(0, 1)
    shares.set_ylabel("share of wall time")
    shares.set_xlabel("step")
    shares.set_title("Where the time went")
    shares.legend(loc="upper left", fontsize="small", ncols=min(len(present), 4))
    return figure
