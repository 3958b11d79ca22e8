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
    "TrainingArguments": "hf_lightning.args.training_args",
    "Seq2SeqTrainingArguments": "hf_lightning.args.training_args",
    "HFLightningTrainer": "hf_lightning.engine.trainer",
    "Trainer": "hf_lightning.engine.trainer",
    "HFLightningSeq2SeqTrainer": "hf_lightning.engine.seq2seq",
    "Seq2SeqTrainer": "hf_lightning.engine.seq2seq",
    "HfArgumentParser": "hf_lightning.args.hf_argparser",
    "HfArg": "hf_lightning.args.hf_argparser",
    "DataSource": "hf_lightning.cli.data_sources",
    "TrainerCallback": "hf_lightning.callbacks",
    "TrainerState": "hf_lightning.callbacks",
    "TrainerControl": "hf_lightning.callbacks",
    "DefaultFlowCallback": "hf_lightning.callbacks",
    "PrinterCallback": "hf_lightning.callbacks",
    "ProgressCallback": "hf_lightning.callbacks",
    "EarlyStoppingCallback": "hf_lightning.callbacks",
    "NotebookProgressCallback": "hf_lightning.callbacks.notebook",
    "plot_log_history": "hf_lightning.integrations.plotting",
    "save_training_plot": "hf_lightning.integrations.plotting",
    "TrainOutput": "hf_lightning.engine.outputs",
    "BestRun": "hf_lightning.engine.outputs",
    "HPSearchBackend": "hf_lightning.integrations.hp_search",
    "default_hp_space_optuna": "hf_lightning.integrations.hp_search",
    "default_compute_objective": "hf_lightning.integrations.hp_search",
    "EvalPrediction": "hf_lightning.engine.outputs",
    "PredictionOutput": "hf_lightning.engine.outputs",
    "EvalLoopOutput": "hf_lightning.engine.outputs",
    "set_seed": "hf_lightning.engine.seeding",
    "enable_full_determinism": "hf_lightning.engine.seeding",
    "translate": "hf_lightning.translation.translate",
    "explain": "hf_lightning.translation.translate",
    "IntervalStrategy": "hf_lightning.args.enums",
    "SaveStrategy": "hf_lightning.args.enums",
    "SchedulerType": "hf_lightning.args.enums",
    "OptimizerNames": "hf_lightning.args.enums",
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
