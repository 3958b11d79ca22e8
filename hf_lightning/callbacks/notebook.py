"""Progress in Jupyter: `NotebookProgressCallback`, the reference's HTML progress bar with a table of the
metrics of each evaluation (transformers' `utils/notebook.py`), and `default_progress_callback`, which
picks it instead of the tqdm `ProgressCallback` inside a Jupyter kernel (the reference's rule).

IPython is imported only when something is displayed, i.e. only inside a notebook.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import time
from typing import Any

from hf_lightning.callbacks.base import TrainerCallback
from hf_lightning.callbacks.printing import ProgressCallback
from hf_lightning.callbacks.state import TrainerControl, TrainerState
from hf_lightning.data.sized import has_length


def is_in_notebook() -> bool:
    """True inside a Jupyter kernel (or marimo): the reference's `is_in_notebook`, adapted from
    tqdm.autonotebook. It reads an already-imported IPython and never imports it."""
    try:
        if "marimo" in sys.modules:
            return True
        get_ipython = sys.modules["IPython"].get_ipython
        if "IPKernelApp" not in get_ipython().config:
            raise ImportError("console")
        # Databricks runtimes before 11.0 do not run an IPython kernel.
        if "DATABRICKS_RUNTIME_VERSION" in os.environ and os.environ["DATABRICKS_RUNTIME_VERSION"] < "11.0":
            raise ImportError("databricks")
        return importlib.util.find_spec("IPython") is not None
    except (AttributeError, ImportError, KeyError):
        return False


def default_progress_callback() -> type[TrainerCallback]:
    """The progress callback the trainer installs when `disable_tqdm` is False: HTML in a notebook, tqdm elsewhere."""
    return NotebookProgressCallback if is_in_notebook() else ProgressCallback


def _display_module() -> Any:
    import IPython.display

    return IPython.display


def format_time(seconds: float) -> str:
    """`seconds` as (h:)mm:ss."""
    seconds = int(seconds)
    hours, minutes, secs = seconds // 3600, (seconds // 60) % 60, seconds % 60
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours != 0 else f"{minutes:02d}:{secs:02d}"


def html_progress_bar(value: Any, total: int, prefix: str, label: str, width: int = 300) -> str:
    """An HTML `<progress>` element with a prefix and a label."""
    return f"""
    <div>
      {prefix}
      <progress value='{value}' max='{total}' style='width:{width}px; height:20px; vertical-align: middle;'></progress>
      {label}
    </div>
    """


def text_to_html_table(items: list[list[Any]]) -> str:
    """An HTML table: `items[0]` is the header row; floats are written with 6 decimals."""
    html_code = """<table border="1" class="dataframe">\n"""
    html_code += """  <thead>\n <tr style="text-align: left;">\n"""
    for item in items[0]:
        html_code += f"      <th>{item}</th>\n"
    html_code += "    </tr>\n  </thead>\n  <tbody>\n"
    for line in items[1:]:
        html_code += "    <tr>\n"
        for element in line:
            element = f"{element:.6f}" if isinstance(element, float) else str(element)
            html_code += f"      <td>{element}</td>\n"
        html_code += "    </tr>\n"
    html_code += "  </tbody>\n</table><p>"
    return html_code


class NotebookProgressBar:
    """An HTML progress bar updated in place (one display handle). Like the reference it redraws at most
    about every `update_every` seconds after `warmup` forced updates; a child bar is drawn by its parent."""

    warmup = 5
    update_every = 0.2

    def __init__(
        self, total: int, prefix: str | None = None, leave: bool = True, parent: Any = None, width: int = 300
    ) -> None:
        self.total = total
        self.prefix = "" if prefix is None else prefix
        self.leave = leave
        self.parent = parent
        self.width = width
        self.last_value: int | None = None
        self.comment: str | None = None
        self.output: Any = None
        self.value: int | None = None
        self.label: str | None = None
        self.html_code = ""
        if "VSCODE_PID" in os.environ:
            self.update_every = 0.5  # HTML renders slowly in VS Code

    def update(self, value: int, force_update: bool = False, comment: str | None = None) -> None:
        """Move the bar to `value` (between 0 and `total`), redrawing when due or when `force_update`."""
        self.value = value
        if comment is not None:
            self.comment = comment
        if self.last_value is None:
            self.start_time = self.last_time = time.time()
            self.start_value = self.last_value = value
            self.elapsed_time: float | None = None
            self.predicted_remaining: float | None = None
            self.first_calls = self.warmup
            self.wait_for = 1
            self.update_bar(value)
        elif value <= self.last_value and not force_update:
            return
        elif (
            force_update or self.first_calls > 0 or value >= min(self.last_value + self.wait_for, self.total)
        ):
            if self.first_calls > 0:
                self.first_calls -= 1
            current_time = time.time()
            self.elapsed_time = current_time - self.start_time
            # the same start value twice gives no rate yet
            self.average_time_per_item = (
                self.elapsed_time / (value - self.start_value) if value > self.start_value else None
            )
            if value >= self.total:
                value = self.total
                self.predicted_remaining = None
                if not self.leave:
                    self.close()
            elif self.average_time_per_item is not None:
                self.predicted_remaining = self.average_time_per_item * (self.total - value)
            self.update_bar(value)
            self.last_value = value
            self.last_time = current_time
            if not self.average_time_per_item:
                self.wait_for = 1
            else:
                self.wait_for = max(int(self.update_every / self.average_time_per_item), 1)

    def update_bar(self, value: int, comment: str | None = None) -> None:
        """Rebuild the label (`[value/total elapsed < remaining, rate, comment]`) and redraw."""
        spaced_value = " " * (len(str(self.total)) - len(str(value))) + str(value)
        if self.elapsed_time is None:
            self.label = f"[{spaced_value}/{self.total} : < :"
        elif self.predicted_remaining is None:
            self.label = f"[{spaced_value}/{self.total} {format_time(self.elapsed_time)}"
        else:
            self.label = (
                f"[{spaced_value}/{self.total} {format_time(self.elapsed_time)} <"
                f" {format_time(self.predicted_remaining)}"
            )
            if self.average_time_per_item == 0:
                self.label += ", +inf it/s"
            else:
                self.label += f", {1 / self.average_time_per_item:.2f} it/s"
        self.label += "]" if not self.comment else f", {self.comment}]"
        self.display()

    def display(self) -> None:
        """Show the bar (first call) or update it in place."""
        self.html_code = html_progress_bar(self.value, self.total, self.prefix, self.label, self.width)
        if self.parent is not None:
            self.parent.display()  # a child bar is drawn inside its parent's output
            return
        self._show(self.html_code)

    def _show(self, html_code: str) -> None:
        disp = _display_module()
        if self.output is None:
            self.output = disp.display(disp.HTML(html_code), display_id=True)
        else:
            self.output.update(disp.HTML(html_code))

    def close(self) -> None:
        """Blank the bar's output."""
        if self.parent is None and self.output is not None:
            self.output.update(_display_module().HTML(""))


class NotebookTrainingTracker(NotebookProgressBar):
    """The training bar with a metrics table under it (columns inferred from the first line when not given)
    and an optional child bar for the running evaluation."""

    def __init__(self, num_steps: int, column_names: list[str] | None = None) -> None:
        super().__init__(num_steps)
        self.inner_table: list[list[Any]] | None = None if column_names is None else [column_names]
        self.child_bar: NotebookProgressBar | None = None

    def display(self) -> None:
        self.html_code = html_progress_bar(self.value, self.total, self.prefix, self.label, self.width)
        if self.inner_table is not None:
            self.html_code += text_to_html_table(self.inner_table)
        if self.child_bar is not None:
            self.html_code += self.child_bar.html_code
        self._show(self.html_code)

    def write_line(self, values: dict[str, Any]) -> None:
        """Add a table row, or update the last one when its first column (step or epoch) is the same."""
        if self.inner_table is None:
            self.inner_table = [list(values.keys()), list(values.values())]
            return
        columns = self.inner_table[0]
        for key in values:
            if key not in columns:
                columns.append(key)
        self.inner_table[0] = columns
        if len(self.inner_table) > 1:
            last_values = self.inner_table[-1]
            first_column = self.inner_table[0][0]
            if last_values[0] != values[first_column]:
                self.inner_table.append([values.get(column, "No Log") for column in columns])
            else:
                # the reference fills `values` itself with the previous row's cells
                for column in columns:
                    if column not in values:
                        values[column] = last_values[columns.index(column)]
                self.inner_table[-1] = [values[column] for column in columns]
        else:
            self.inner_table.append([values[column] for column in columns])

    def add_child(self, total: int, prefix: str | None = None, width: int = 300) -> NotebookProgressBar:
        """A child bar drawn under the table (the evaluation's)."""
        self.child_bar = NotebookProgressBar(total, prefix=prefix, parent=self, width=width)
        return self.child_bar

    def remove_child(self) -> None:
        """Drop the child bar and redraw."""
        self.child_bar = None
        self.display()


def _require(value: Any, message: str) -> Any:
    if value is None:
        raise RuntimeError(message)
    return value


class NotebookProgressCallback(TrainerCallback):
    """Shows training and evaluation progress as HTML in a notebook, with one table row of metrics per
    evaluation (per log when there is no evaluation), as the reference's callback of the same name.

    As the reference's, `on_evaluate` removes `epoch`, `total_flos` and the speed keys
    (`<prefix>_runtime`, `_samples_per_second`, `_steps_per_second`, `_model_preparation_time`) from
    the metrics dict it is given, which is the dict `evaluate()` returns.
    """

    def __init__(self) -> None:
        self.training_tracker: NotebookTrainingTracker | None = None
        self.prediction_bar: NotebookProgressBar | None = None
        self._force_next_update = False
        self._performance = ""  # the telemetry's last window (engine/telemetry/), shown after the epoch

    def show_performance(self, text: str) -> None:
        """Show the telemetry's last window (tokens/s, MFU) in the bar's comment from the next step on."""
        self._performance = text

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        self.first_column = "Epoch" if args.eval_strategy == "epoch" else "Step"
        self.training_loss = 0
        self.last_log = 0
        column_names = [self.first_column, "Training Loss"]
        if args.eval_strategy != "no":
            column_names.append("Validation Loss")
        self.training_tracker = NotebookTrainingTracker(state.max_steps, column_names)

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        epoch = int(state.epoch) if int(state.epoch) == state.epoch else f"{state.epoch:.2f}"
        tracker = _require(self.training_tracker, "on_train_begin must be called before on_step_end")
        # global_step + 1 as the reference (the bar runs one step ahead until on_train_end)
        comment = f"Epoch {epoch}/{state.num_train_epochs}"
        tracker.update(
            state.global_step + 1,
            comment=f"{comment}, {self._performance}" if self._performance else comment,
            force_update=self._force_next_update,
        )
        self._force_next_update = False

    def on_prediction_step(
        self,
        args: Any,
        state: TrainerState,
        control: TrainerControl,
        eval_dataloader: Any = None,
        **kwargs: Any,
    ) -> Any:
        if not has_length(eval_dataloader):
            return
        if self.prediction_bar is None:
            if self.training_tracker is not None:
                self.prediction_bar = self.training_tracker.add_child(len(eval_dataloader))
            else:
                self.prediction_bar = NotebookProgressBar(len(eval_dataloader))
            self.prediction_bar.update(1)
        else:
            self.prediction_bar.update(self.prediction_bar.value + 1)

    def on_predict(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        if self.prediction_bar is not None:
            self.prediction_bar.close()
        self.prediction_bar = None

    def on_log(
        self, args: Any, state: TrainerState, control: TrainerControl, logs: Any = None, **kwargs: Any
    ) -> Any:
        # Without evaluation, each training log is a table row.
        if args.eval_strategy == "no" and "loss" in logs:
            tracker = _require(self.training_tracker, "on_train_begin must be called before on_log")
            tracker.write_line({"Training Loss": logs["loss"], "Step": state.global_step})

    def on_evaluate(
        self, args: Any, state: TrainerState, control: TrainerControl, metrics: Any = None, **kwargs: Any
    ) -> Any:
        # Recomputed here: evaluate() can run before any on_train_begin.
        self.first_column = "Epoch" if args.eval_strategy == "epoch" else "Step"
        values: dict[str, Any] = {"Training Loss": "No log", "Validation Loss": "No log"}
        for log in reversed(state.log_history):
            if "loss" in log:
                values["Training Loss"] = log["loss"]
                break
        if self.first_column == "Epoch":
            values["Epoch"] = int(state.epoch)
        else:
            values["Step"] = state.global_step
        if metrics is None:
            metrics = {}
        metric_key_prefix = "eval"
        for key in metrics:
            if key.endswith("_loss"):
                metric_key_prefix = re.sub(r"\_loss$", "", key)
        for key in ("total_flos", "epoch") + tuple(
            f"{metric_key_prefix}_{suffix}"
            for suffix in ("runtime", "samples_per_second", "steps_per_second", "model_preparation_time")
        ):
            metrics.pop(key, None)
        for key, value in metrics.items():
            name = " ".join(part.capitalize() for part in key.split("_")[1:])
            values["Validation Loss" if name == "Loss" else name] = value
        if self.training_tracker is not None:
            self.training_tracker.write_line(values)
            self.training_tracker.remove_child()
            self._force_next_update = True  # an evaluation takes a while: redraw at the next step
        else:
            disp = _display_module()
            disp.display(disp.HTML(text_to_html_table([list(values.keys()), list(values.values())])))
        self.prediction_bar = None

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        tracker = _require(self.training_tracker, "on_train_begin must be called before on_train_end")
        tracker.update(
            state.global_step, comment=f"Epoch {int(state.epoch)}/{state.num_train_epochs}", force_update=True
        )
        self.training_tracker = None
