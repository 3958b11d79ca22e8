"""hf_lightning: run Hugging Face `Trainer` scripts on PyTorch Lightning's engine, with the same meaning.

Swap `from transformers import Trainer, TrainingArguments` for
`from hf_lightning import Trainer, TrainingArguments`. Names are resolved lazily so that
`import hf_lightning` stays cheap (torch and Lightning load on first use).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "TrainingArguments": "hf_lightning.args",
    "Seq2SeqTrainingArguments": "hf_lightning.args",
    "HFLightningTrainer": "hf_lightning.trainer",
    "Trainer": "hf_lightning.trainer",
    "HFLightningSeq2SeqTrainer": "hf_lightning.seq2seq",
    "Seq2SeqTrainer": "hf_lightning.seq2seq",
    "HfArgumentParser": "hf_lightning.hf_argparser",
    "HfArg": "hf_lightning.hf_argparser",
    "DataSource": "hf_lightning.cli_data",
    "TrainerCallback": "hf_lightning.callbacks",
    "TrainerState": "hf_lightning.callbacks",
    "TrainerControl": "hf_lightning.callbacks",
    "DefaultFlowCallback": "hf_lightning.callbacks",
    "PrinterCallback": "hf_lightning.callbacks",
    "ProgressCallback": "hf_lightning.callbacks",
    "EarlyStoppingCallback": "hf_lightning.callbacks",
    "NotebookProgressCallback": "hf_lightning.callbacks.notebook",
    "plot_log_history": "hf_lightning.plotting",
    "save_training_plot": "hf_lightning.plotting",
    "TrainOutput": "hf_lightning.outputs",
    "BestRun": "hf_lightning.outputs",
    "HPSearchBackend": "hf_lightning.hp_search",
    "default_hp_space_optuna": "hf_lightning.hp_search",
    "default_compute_objective": "hf_lightning.hp_search",
    "EvalPrediction": "hf_lightning.outputs",
    "PredictionOutput": "hf_lightning.outputs",
    "EvalLoopOutput": "hf_lightning.outputs",
    "set_seed": "hf_lightning.seeding",
    "enable_full_determinism": "hf_lightning.seeding",
    "translate": "hf_lightning.translate",
    "explain": "hf_lightning.translate",
    "IntervalStrategy": "hf_lightning.enums",
    "SaveStrategy": "hf_lightning.enums",
    "SchedulerType": "hf_lightning.enums",
    "OptimizerNames": "hf_lightning.enums",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'hf_lightning' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
