"""TRL's trainers on hf_lightning's engine: `from hf_lightning.trl import SFTTrainer, SFTConfig`.

Supported: trl 1.16 (`pip install -e ".[trl]"` from a checkout); its SFT, DPO, Reward, GRPO, KTO, RLOO and
Distillation trainers with their configs. Each class is TRL's own, rebuilt over our
bases (hf_lightning/adapted/rebuild.py, through `hf_lightning.on_lightning`): `SFTTrainer` here is a new class named `SFTTrainer` whose methods are
TRL's function objects' code, with their `super()` cells pointing at the rebuilt classes and their module
globals binding `Trainer` / `TrainingArguments` / `SFTConfig` / ... to ours, so TRL's `__init__`,
`compute_loss`, `log`, `_save_checkpoint` run as written, and everything they delegate to `super()` runs on
hf_lightning's Trainer (Lightning's `fit`). Configs are TRL's dataclass fields re-declared over our
`TrainingArguments`. A stock `trl.SFTConfig(...)` given to our `SFTTrainer` (each trainer's own kind) is read
field by field into ours first (hf_lightning/trl/stock_configs.py), and `SFTTrainer` takes a plain
`transformers.TrainingArguments` as TRL's does.
"""

from __future__ import annotations

import warnings

SUPPORTED_TRL = "1.16"

try:
    import trl
except ModuleNotFoundError as error:
    if error.name != "trl":
        raise
    raise ImportError(
        "hf_lightning.trl needs trl, which is not installed: "
        f'pip install -e ".[trl]" from a checkout (or pip install "trl=={SUPPORTED_TRL}.*")'
    ) from error

if not trl.__version__.startswith(SUPPORTED_TRL + "."):
    warnings.warn(
        f"hf_lightning.trl is tested with trl {SUPPORTED_TRL}.x; trl {trl.__version__} is installed "
        f'(pip install -e ".[trl]" installs a tested one)',
        stacklevel=2,
    )

from hf_lightning.trl.classes import BUILT  # noqa: E402

SFTConfig = BUILT["SFTConfig"]
SFTTrainer = BUILT["SFTTrainer"]
DistillationConfig = BUILT["DistillationConfig"]
DistillationTrainer = BUILT["DistillationTrainer"]
DPOConfig = BUILT["DPOConfig"]
DPOTrainer = BUILT["DPOTrainer"]
RewardConfig = BUILT["RewardConfig"]
RewardTrainer = BUILT["RewardTrainer"]
GRPOConfig = BUILT["GRPOConfig"]
GRPOTrainer = BUILT["GRPOTrainer"]
KTOConfig = BUILT["KTOConfig"]
KTOTrainer = BUILT["KTOTrainer"]
RLOOConfig = BUILT["RLOOConfig"]
RLOOTrainer = BUILT["RLOOTrainer"]

__all__ = [
    "DPOConfig", "DPOTrainer", "DistillationConfig", "DistillationTrainer", "GRPOConfig", "GRPOTrainer",
    "KTOConfig", "KTOTrainer", "RLOOConfig", "RLOOTrainer", "RewardConfig", "RewardTrainer", "SFTConfig", "SFTTrainer",
]
