"""plot_log_history / save_training_plot: the figure's lines are the logged points; the PNG is written."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from hf_lightning import TrainingArguments
from hf_lightning.integrations.plotting import plot_log_history, save_training_plot
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import make_regression_mlp, regression_data


def _points(history, key):
    return [(entry["step"], entry[key]) for entry in history if key in entry]


def _lines(figure):
    """label -> (x, y) of every line on every axes of the figure."""
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for axes in figure.axes
        for line in axes.get_lines()
    }


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    def accuracy(eval_pred):  # a non-loss metric, so the metrics panel has something
        return {"neg_mse": float(-np.mean((eval_pred.predictions - eval_pred.label_ids) ** 2))}

    args = TrainingArguments(
        output_dir=str(tmp_path_factory.mktemp("plot")),
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        lr_scheduler_type="linear",
        max_steps=6,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=3,
    )
    trainer = HFLightningTrainer(
        model=make_regression_mlp(),
        args=args,
        train_dataset=regression_data(12),
        eval_dataset=regression_data(4, seed=1),
        compute_metrics=accuracy,
    )
    trainer.train()
    return trainer.state.log_history


def test_lines_carry_the_logged_steps_and_values(history):
    figure = plot_log_history(history)
    assert [axes.get_title() for axes in figure.axes] == ["Loss", "Evaluation metrics", "Learning rate"]
    lines = _lines(figure)
    assert sorted(lines) == ["eval_loss", "eval_neg_mse", "learning_rate", "loss"]
    for key in lines:
        steps, values = zip(*_points(history, key))
        assert lines[key][0] == list(steps)
        assert lines[key][1] == pytest.approx(list(values), rel=1e-12)
    assert lines["loss"][0] == [1, 2, 3, 4, 5, 6] and lines["eval_loss"][0] == [3, 6]
    # the linear schedule really decays on the plot
    assert lines["learning_rate"][1][0] > lines["learning_rate"][1][-1]


def test_save_training_plot_writes_a_png(history, tmp_path):
    path = save_training_plot(history, tmp_path / "plots")
    assert path == str(tmp_path / "plots" / "training_curves.png")
    with open(path, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    other = save_training_plot(history, tmp_path, filename="curves.svg")
    assert open(other).read().lstrip().startswith("<?xml")


def test_plot_on_given_axes(history):
    from matplotlib.figure import Figure

    figure = Figure()
    ax = figure.add_subplot()
    assert plot_log_history(history, ax=ax) is figure
    assert {line.get_label() for line in ax.get_lines()} == {"loss", "eval_loss", "eval_neg_mse"}
    (twin,) = [axes for axes in figure.axes if axes is not ax]  # the learning rate's own y-axis
    (line,) = twin.get_lines()
    assert list(line.get_ydata()) == [value for _, value in _points(history, "learning_rate")]


def test_several_eval_datasets_and_bookkeeping_keys():
    history = [
        {"loss": 1.0, "learning_rate": 0.1, "epoch": 0.5, "step": 1},
        {
            "eval_a_loss": 0.9,
            "eval_a_acc": 0.4,
            "eval_a_runtime": 0.1,
            "eval_a_samples_per_second": 9.0,
            "step": 1,
        },
        {"eval_b_loss": 0.8, "eval_b_runtime": 0.1, "eval_b_steps_per_second": 3.0, "epoch": 0.5, "step": 1},
        {"train_runtime": 1.0, "train_loss": 1.0, "total_flos": 5.0, "epoch": 1.0, "step": 2},
    ]
    lines = _lines(plot_log_history(history))
    assert lines == {
        "loss": ([1], [1.0]),
        "eval_a_loss": ([1], [0.9]),
        "eval_b_loss": ([1], [0.8]),
        "eval_a_acc": ([1], [0.4]),
        "learning_rate": ([1], [0.1]),
    }


def test_nothing_to_plot_is_an_error():
    with pytest.raises(ValueError, match="nothing|no training loss"):
        plot_log_history([{"train_runtime": 1.0, "step": 0}])


def test_missing_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    with pytest.raises(ImportError, match=r'pip install -e "\.\[plot\]"'):
        plot_log_history([{"loss": 1.0, "step": 1}])


def test_plot_performance_draws_each_window_from_run_performance_json(tmp_path):
    from hf_lightning import Telemetry, plot_performance

    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True,
        per_device_train_batch_size=2, max_steps=6, logging_steps=2,
    )
    trainer = HFLightningTrainer(
        model=make_regression_mlp(), args=args, train_dataset=regression_data(12), telemetry=Telemetry(peak_flops=1e9, summary_file=True, flops="measure"),
    )
    trainer.train()
    windows = trainer._telemetry.last_summary["windows"]
    figure = plot_performance(tmp_path)  # the output_dir holding run_performance.json (summary_file=True)
    assert _lines(plot_performance(trainer._telemetry.last_summary)) == _lines(figure)  # or the summary itself
    lines = _lines(figure)
    assert lines["samples_per_second"] == ([2, 4, 6], [window["samples_per_second"] for window in windows])
    assert lines["mfu"] == ([2, 4, 6], [window["mfu"] for window in windows])
    shares = figure.axes[1]
    assert [text.get_text() for text in shares.get_legend().get_texts()] == [
        "data_wait", "optimizer", "evaluation", "checkpoint", "hub", "other"
    ]
    assert len(shares.collections) == 6  # one stacked band per part
    with pytest.raises(ValueError, match="no logging window"):
        plot_performance({"windows": []})
