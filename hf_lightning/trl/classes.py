"""The supported TRL trainer and config classes, rebuilt over hf_lightning's Trainer and TrainingArguments."""

from __future__ import annotations

import transformers
import trl
from trl.trainer.base_config import _BaseConfig
from trl.trainer.base_trainer import _BaseTrainer

from hf_lightning.args.training_args import TrainingArguments
from hf_lightning.engine.trainer import HFLightningTrainer
from hf_lightning.trl.rebuild import rebuild_classes

# TRL's classes, each after its base; configs first, so trainers' globals see the rebuilt configs.
_CHAIN = (
    _BaseConfig,
    trl.SFTConfig,
    trl.DPOConfig,
    trl.RewardConfig,
    trl.GRPOConfig,
    _BaseTrainer,
    trl.SFTTrainer,
    trl.DPOTrainer,
    trl.RewardTrainer,
    trl.GRPOTrainer,
)

BUILT = rebuild_classes(
    _CHAIN,
    {transformers.Trainer: HFLightningTrainer, transformers.TrainingArguments: TrainingArguments},
    module="hf_lightning.trl",
)
