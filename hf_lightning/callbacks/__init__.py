"""The callback system of hf_lightning: run state, control flags, events, the default flow and printing.

Mirrors transformers' `trainer_callback.py` without importing transformers; transformers' callbacks are
accepted by `CallbackHandler` as well.
"""

from hf_lightning.callbacks.base import EVENTS, CallbackHandler, TrainerCallback
from hf_lightning.callbacks.early_stopping import EarlyStoppingCallback, EarlyStoppingConfigError
from hf_lightning.callbacks.flow import DefaultFlowCallback
from hf_lightning.callbacks.printing import PrinterCallback, ProgressCallback
from hf_lightning.callbacks.state import (
    ExportableState,
    TrainerControl,
    TrainerState,
    hp_params,
    is_exportable_state,
)

__all__ = [
    "EVENTS",
    "CallbackHandler",
    "DefaultFlowCallback",
    "EarlyStoppingCallback",
    "EarlyStoppingConfigError",
    "ExportableState",
    "PrinterCallback",
    "ProgressCallback",
    "TrainerCallback",
    "TrainerControl",
    "TrainerState",
    "hp_params",
    "is_exportable_state",
]
