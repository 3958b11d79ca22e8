"""Console output of a run: `PrinterCallback` (prints log dicts) and `ProgressCallback` (tqdm bars).

The trainer installs one of them, last in the list: the printer when `args.disable_tqdm`, else the bar.
"""

from __future__ import annotations

from typing import Any

from hf_lightning.callbacks.base import TrainerCallback
from hf_lightning.callbacks.state import TrainerControl, TrainerState
from hf_lightning.data.sized import has_length


def _tqdm(**kwargs: Any) -> Any:
    # Imported on first use so `import hf_lightning` stays cheap; tqdm comes with lightning.
    from tqdm.auto import tqdm

    return tqdm(**kwargs)


class ProgressCallback(TrainerCallback):
    """Shows a tqdm bar over `state.max_steps` on world rank 0, one bar per evaluation, and writes the logs.

    Logs are written as a dict copy with floats formatted `.4g`, strings longer than `max_str_len` replaced by
    a notice and `total_flos` dropped.
    """

    def __init__(self, max_str_len: int = 100) -> None:
        self.training_bar: Any = None
        self.prediction_bar: Any = None
        self.max_str_len = max_str_len

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        if state.is_world_process_zero:
            self.training_bar = _tqdm(total=state.max_steps, dynamic_ncols=True)
        self.current_step = 0

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        if state.is_world_process_zero:
            self.training_bar.update(state.global_step - self.current_step)
            self.current_step = state.global_step

    def on_prediction_step(
        self,
        args: Any,
        state: TrainerState,
        control: TrainerControl,
        eval_dataloader: Any = None,
        **kwargs: Any,
    ) -> Any:
        if state.is_world_process_zero and has_length(eval_dataloader):
            if self.prediction_bar is None:
                # Outside training the evaluation bar is the only one, so it stays on screen.
                self.prediction_bar = _tqdm(
                    total=len(eval_dataloader), leave=self.training_bar is None, dynamic_ncols=True
                )
            self.prediction_bar.update(1)

    def on_evaluate(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        self._close_prediction_bar(state)

    def on_predict(
        self, args: Any, state: TrainerState, control: TrainerControl, metrics: Any = None, **kwargs: Any
    ) -> Any:
        self._close_prediction_bar(state)

    def _close_prediction_bar(self, state: TrainerState) -> None:
        if state.is_world_process_zero:
            if self.prediction_bar is not None:
                self.prediction_bar.close()
            self.prediction_bar = None

    def on_log(
        self, args: Any, state: TrainerState, control: TrainerControl, logs: Any = None, **kwargs: Any
    ) -> Any:
        if state.is_world_process_zero and self.training_bar is not None:
            # A shallow copy: the shared logs dict must reach later callbacks unchanged.
            shown: dict[str, Any] = {}
            for key, value in logs.items():
                if isinstance(value, str) and len(value) > self.max_str_len:
                    shown[key] = (
                        f"[String too long to display, length: {len(value)} > {self.max_str_len}. "
                        "Consider increasing `max_str_len` if needed.]"
                    )
                elif isinstance(value, float):
                    shown[key] = f"{value:.4g}"
                else:
                    shown[key] = value
            shown.pop("total_flos", None)
            self.training_bar.write(str(shown))

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        if state.is_world_process_zero:
            self.training_bar.close()
            self.training_bar = None

    def show_performance(self, text: str) -> None:
        """The telemetry's last window (tokens/s, MFU; engine/telemetry/) after the bar, until the next window."""
        if self.training_bar is not None:
            self.training_bar.set_postfix_str(text, refresh=False)


class PrinterCallback(TrainerCallback):
    """Prints each log dict (floats formatted `.4g`) on local rank 0.

    Like the reference it pops `total_flos` from the shared logs dict itself, on every rank, so callbacks
    after it do not see that key.
    """

    def on_log(
        self, args: Any, state: TrainerState, control: TrainerControl, logs: Any = None, **kwargs: Any
    ) -> Any:
        logs.pop("total_flos", None)
        if state.is_local_process_zero:
            if logs is not None:
                logs = {
                    key: (f"{value:.4g}" if isinstance(value, float) else value)
                    for key, value in logs.items()
                }
            print(logs)
