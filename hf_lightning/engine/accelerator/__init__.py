"""`trainer.accelerator`: accelerate's public `Accelerator` surface, carried out by the run's Lightning strategy.

`accelerator.py` holds the object (`LightningAccelerator`), `state.py` its read-only state views
(`DistributedType`, `AcceleratorStateView`, `GradientStateView`) and `collectives.py` the cross-process operations
(the Lightning strategy's `all_gather` / `reduce` / `broadcast` / `barrier` once a run exists, torch.distributed's
default group before). accelerate is not imported.
"""

from hf_lightning.engine.accelerator.accelerator import LightningAccelerator
from hf_lightning.engine.accelerator.state import AcceleratorStateView, DistributedType, GradientStateView

__all__ = ["AcceleratorStateView", "DistributedType", "GradientStateView", "LightningAccelerator"]
