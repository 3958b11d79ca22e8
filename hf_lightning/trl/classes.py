"""The supported TRL trainer and config classes, rebuilt over hf_lightning's Trainer and TrainingArguments."""

from __future__ import annotations

import os

import accelerate.utils
import transformers
import trl
from trl.trainer.base_config import _BaseConfig
from trl.trainer.base_trainer import _BaseTrainer

from hf_lightning.args.training_args import TrainingArguments
from hf_lightning.core.seeding import set_seed as seed_everything_the_reference_way
from hf_lightning.engine.trainer import HFLightningTrainer
from hf_lightning.trl.rebuild import rebuild_classes
from hf_lightning.trl.stock_configs import accepting_stock_configs

# TRL's classes, each after its base; configs first, so trainers' globals see the rebuilt configs.
_CHAIN = (
    _BaseConfig,
    trl.SFTConfig,
    trl.DPOConfig,
    trl.RewardConfig,
    trl.GRPOConfig,
    trl.KTOConfig,
    trl.RLOOConfig,
    trl.DistillationConfig,
    _BaseTrainer,
    trl.SFTTrainer,
    trl.DPOTrainer,
    trl.RewardTrainer,
    trl.GRPOTrainer,
    trl.KTOTrainer,
    trl.RLOOTrainer,
    trl.DistillationTrainer,
)


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """accelerate's `set_seed`, without an accelerate state: `device_specific` adds this process's rank."""
    import torch.distributed as dist

    if device_specific:
        seed += dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", 0))
    seed_everything_the_reference_way(seed, deterministic=deterministic)


BUILT = rebuild_classes(
    _CHAIN,
    {
        transformers.Trainer: HFLightningTrainer,
        transformers.TrainingArguments: TrainingArguments,
        # GRPO seeds per process through accelerate's set_seed, which needs accelerate's own state.
        accelerate.utils.set_seed: set_seed,
    },
    module="hf_lightning.trl",
)

# Each trainer with its config, and whether TRL's __init__ turns a transformers TrainingArguments into that config.
_PAIRS = (
    (trl.SFTTrainer, trl.SFTConfig, True),
    (trl.DPOTrainer, trl.DPOConfig, False),
    (trl.RewardTrainer, trl.RewardConfig, False),
    (trl.GRPOTrainer, trl.GRPOConfig, False),
    (trl.KTOTrainer, trl.KTOConfig, False),
    (trl.RLOOTrainer, trl.RLOOConfig, False),
    (trl.DistillationTrainer, trl.DistillationConfig, False),
)

for _trainer, _config, _converts in _PAIRS:
    _ours = BUILT[_trainer.__name__]
    _ours.__init__ = accepting_stock_configs(
        _ours.__init__, _trainer.__name__, _config, BUILT[_config.__name__], _converts
    )
