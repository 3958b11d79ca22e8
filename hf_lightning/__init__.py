"""hf_lightning: run Hugging Face `Trainer` scripts on PyTorch Lightning's engine, with the same meaning.

Swap `from transformers import Trainer, TrainingArguments` for
`from hf_lightning import Trainer, TrainingArguments`. Names are resolved lazily so that
`import hf_lightning` stays cheap (torch and Lightning load on first use).
"""

from __future__ import annotations

import importlib
from typing import Any

from hf_lightning.core.version import __version__

_EXPORTS = {
    "TrainingArguments": "hf_lightning.args.training_args",
    "Seq2SeqTrainingArguments": "hf_lightning.args.training_args",
    "HFLightningTrainer": "hf_lightning.trainer.trainer",
    "Trainer": "hf_lightning.trainer.trainer",
    "HFLightningSeq2SeqTrainer": "hf_lightning.trainer.seq2seq",
    "Seq2SeqTrainer": "hf_lightning.trainer.seq2seq",
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
    "Telemetry": "hf_lightning.engine.telemetry.callback",
    "RunGuard": "hf_lightning.engine.run_guard",
    "RunGuardStop": "hf_lightning.engine.run_guard",
    "plot_log_history": "hf_lightning.integrations.plotting",
    "plot_performance": "hf_lightning.integrations.plotting",
    "save_training_plot": "hf_lightning.integrations.plotting",
    "consolidate_checkpoint": "hf_lightning.checkpoint.consolidate",
    "TrainOutput": "hf_lightning.core.outputs",
    "BestRun": "hf_lightning.core.outputs",
    "HPSearchBackend": "hf_lightning.integrations.hp_search",
    "default_hp_space_optuna": "hf_lightning.integrations.hp_search",
    "default_hp_space_ray": "hf_lightning.integrations.hp_search",
    "default_compute_objective": "hf_lightning.integrations.hp_search",
    "EvalPrediction": "hf_lightning.core.outputs",
    "PredictionOutput": "hf_lightning.core.outputs",
    "EvalLoopOutput": "hf_lightning.core.outputs",
    "set_seed": "hf_lightning.core.seeding",
    "enable_full_determinism": "hf_lightning.core.seeding",
    "translate": "hf_lightning.translation.translate",
    "explain": "hf_lightning.translation.translate",
    "IntervalStrategy": "hf_lightning.core.enums",
    "SaveStrategy": "hf_lightning.core.enums",
    "SchedulerType": "hf_lightning.core.enums",
    "OptimizerNames": "hf_lightning.core.enums",
    "on_lightning": "hf_lightning.adapted.registry",
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
