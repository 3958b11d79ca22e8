"""One module per experiment tracker `report_to` names: how its Lightning logger is built from the plan's spec and
what it receives for each `log()` entry, `predict()`'s metrics and the run's texts, following the reference's
integration callback for that backend (transformers' `integrations/integration_utils.py`).

The spec itself (folders, environment variables, refusals) is made by the pure translation
(`translation/logger_specs.py`); everything a backend does at run time is in its module here. A logger given in
`lightning_trainer_overrides` that no backend owns gets the generic treatment of `base.py`.
"""

from __future__ import annotations

from typing import Any

from hf_lightning.integrations.logger_backends.base import LoggerBackend
from hf_lightning.integrations.logger_backends.comet import CometBackend
from hf_lightning.integrations.logger_backends.csv import CSVBackend
from hf_lightning.integrations.logger_backends.mlflow import MLflowBackend
from hf_lightning.integrations.logger_backends.tensorboard import TensorBoardBackend
from hf_lightning.integrations.logger_backends.wandb import WandbBackend

# By the `report_to` name of each backend (translation/logger_specs.py's SUPPORTED_LOGGERS).
BACKENDS: dict[str, LoggerBackend] = {
    backend.name: backend
    for backend in (TensorBoardBackend(), CSVBackend(), MLflowBackend(), WandbBackend(), CometBackend())
}
_GENERIC = LoggerBackend()


def backend_for(pl_logger: Any) -> LoggerBackend:
    """The backend whose Lightning logger class `pl_logger` is an instance of; the generic one for any other."""
    for backend in BACKENDS.values():
        if backend.owns(pl_logger):
            return backend
    return _GENERIC
