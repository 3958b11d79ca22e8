"""`report_to="tensorboard"`: Lightning's `TensorBoardLogger`, written straight into the reference's folder
(`output_dir/runs/<%b%d_%H-%M-%S>_<hostname>` timed when training starts, unless `logging_dir` /
`TENSORBOARD_LOGGING_DIR` name one); strings logged as text, and the arguments and model config as text at train
begin, as the reference's `TensorBoardCallback`."""

from __future__ import annotations

import copy
import os
import socket
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from hf_lightning.integrations.logger_backends.base import LoggerBackend, rewrite_logs


def default_logdir(now: datetime | None = None) -> str:
    """`runs/<%b%d_%H-%M-%S>_<hostname>`, the reference's TensorBoard default under output_dir."""
    current_time = (now or datetime.now()).strftime("%b%d_%H-%M-%S")
    return os.path.join("runs", current_time + "_" + socket.gethostname())


class TensorBoardBackend(LoggerBackend):
    name = "tensorboard"

    def lightning_class(self) -> type:
        from lightning.pytorch.loggers import TensorBoardLogger

        return TensorBoardLogger

    def build(self, spec: Mapping[str, Any], now: datetime | None = None) -> Any:
        kwargs = copy.deepcopy(spec["kwargs"])
        if kwargs["save_dir"] is None:
            kwargs["save_dir"] = os.path.join(spec["runs_root"], default_logdir(now))
        return self.lightning_class()(**kwargs)

    def send_logs(self, pl_logger: Any, logs: Mapping[str, Any], step: int) -> None:
        super().send_logs(pl_logger, logs, step)
        texts = rewrite_logs({key: value for key, value in logs.items() if isinstance(value, str)})
        for key, value in texts.items():
            pl_logger.experiment.add_text(key, value, step)

    def send_run_texts(self, pl_logger: Any, args: Any, model: Any) -> None:
        """`args` (the arguments as JSON, tokens redacted by `to_json_string`) and `model_config` when the model has
        a config."""
        pl_logger.experiment.add_text("args", args.to_json_string())
        config = getattr(model, "config", None)
        if config is not None and callable(getattr(config, "to_json_string", None)):
            pl_logger.experiment.add_text("model_config", config.to_json_string())
