"""The supported TRL trainer and config classes, rebuilt over hf_lightning's Trainer and TrainingArguments.

The rebuild is the one every library gets (`hf_lightning.on_lightning`, adapted/registry.py): these classes are the
same objects as `hf_lightning.adapted.trl.SFTTrainer`, ... What TRL adds here is the stock-config conversion in
front of each trainer's `__init__` (hf_lightning/trl/stock_configs.py).
"""

from __future__ import annotations

import trl

from hf_lightning.adapted.registry import on_lightning
from hf_lightning.core.blocked_time import blocked_by
from hf_lightning.trl.stock_configs import accepting_stock_configs

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

_STOCK = [cls for trainer, config, _ in _PAIRS for cls in (config, trainer)]
BUILT: dict[str, type] = {cls.__name__: rebuilt for cls, rebuilt in zip(_STOCK, on_lightning(*_STOCK))}

for _trainer, _config, _converts in _PAIRS:
    _ours = BUILT[_trainer.__name__]
    if not getattr(_ours.__init__, "_accepts_stock_configs", False):  # once per process (the class is shared)
        _ours.__init__ = accepting_stock_configs(
            _ours.__init__, _trainer.__name__, _config, BUILT[_config.__name__], _converts
        )
        _ours.__init__._accepts_stock_configs = True


def _timed_generation(generate):
    """GRPO / RLOO's `_generate` (the completions of a batch's prompts, inside the training step), its time counted
    as the telemetry's generation share (engine/telemetry/)."""

    def _generate(self, *args, **kwargs):
        with blocked_by(self, "generation"):
            return generate(self, *args, **kwargs)

    _generate.__wrapped__ = generate
    _generate._times_generation = True
    return _generate


for _name in ("GRPOTrainer", "RLOOTrainer"):
    _ours = BUILT[_name]
    if not getattr(_ours._generate, "_times_generation", False):  # once per process (the class is shared)
        _ours._generate = _timed_generation(_ours._generate)
