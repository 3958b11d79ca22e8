"""`Environment`: the snapshot of the machine and the launcher that `translate` reads."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hf_lightning.args.launcher import launch_layout

# Optional packages whose presence changes a decision (liger kernels, DeepSpeed).
OPTIONAL_PACKAGES = ("liger_kernel", "deepspeed")
_LAUNCHER_VARS = ("LOCAL_RANK", "RANK")
# Device switches the translation reads, as the arguments' `device` does.
_DEVICE_ENV_VARS = ("ACCELERATE_USE_CPU",)
# Non-secret environment variables the logger specs read (`hf_lightning.integrations.loggers`).
LOGGER_ENV_VARS = (
    "TENSORBOARD_LOGGING_DIR",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_EXPERIMENT_NAME",
    "MLFLOW_TAGS",
    "MLFLOW_RUN_ID",
    "MLFLOW_NESTED_RUN",
    "HF_MLFLOW_LOG_ARTIFACTS",
    "WANDB_MODE",
    "WANDB_PROJECT",
    "WANDB_DIR",
    "WANDB_LOG_MODEL",
    "WANDB_WATCH",
    "COMET_PROJECT_NAME",
    "COMET_MODE",
    "HF_LIGHTNING_REPORT_THROUGH",
)


def installed_logger_backends(find_spec: Any = None) -> frozenset[str]:
    """Which trackers `report_to` names are importable, checked as the reference's `is_<name>_available` do
    (used by `Environment.detect`)."""
    import importlib.util

    find = find_spec or importlib.util.find_spec

    def has(name: str) -> bool:
        try:
            return find(name) is not None
        except (ImportError, ValueError):  # a parent package that fails to import, or one without a spec
            return False

    found = {name for name in ("mlflow", "wandb", "comet_ml", "neptune") if has(name)}
    if has("tensorboard") or has("tensorboardX"):
        found.add("tensorboard")
    for name, package in _TRACKER_PACKAGES.items():
        if has(package):
            found.add(name)
    if has("dagshub") and "mlflow" in found:
        found.add("dagshub")
    if has("azureml") and has("azureml.core"):  # azureml.core.run is not looked up: that would import azureml.core
        found.add("azure_ml")
    return frozenset(found)


def _importable(name: str) -> bool:
    """Whether `name` can be imported (an import hook that blocks it counts as not importable)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# The report_to names whose importable package has another name, or the same (the reference's checks).
_TRACKER_PACKAGES = {
    "clearml": "clearml",
    "codecarbon": "codecarbon",
    "dvclive": "dvclive",
    "flyte": "flytekit",
    "swanlab": "swanlab",
    "trackio": "trackio",
}


@dataclass(frozen=True)
class Environment:
    """What the machine and the launcher provide; the defaults describe one CPU process."""

    cuda_available: bool = False
    cuda_device_count: int = 0
    world_size: int = 1
    local_world_size: int = 1
    num_nodes: int = 1
    process_index: int = 0
    is_distributed_launch: bool = False
    mps_available: bool = False
    installed_loggers: frozenset[str] = frozenset()
    installed_packages: frozenset[str] = frozenset()
    # Whether transformers' integration callbacks can carry `report_to` (transformers is importable).
    reference_integrations: bool = False
    # Non-secret variables the logger specs read (see `LOGGER_ENV_VARS`).
    environ: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def detect(cls) -> Environment:
        """Read torch and the launcher's environment variables (torchrun / accelerate launch / srun)."""
        import importlib.util

        import torch

        cuda = torch.cuda.is_available()

        layout = launch_layout()
        if layout is not None and layout.source == "torchrun":
            # As before: a torchrun launch counts once WORLD_SIZE and a rank variable are both set.
            layout = layout if "WORLD_SIZE" in os.environ and any(v in os.environ for v in _LAUNCHER_VARS) else None
        launched = layout is not None
        world_size = layout.world_size if layout is not None else 1
        local_world_size = layout.local_world_size if layout is not None else 1
        return cls(
            cuda_available=cuda,
            cuda_device_count=torch.cuda.device_count() if cuda else 0,
            world_size=world_size,
            local_world_size=local_world_size,
            num_nodes=max(1, world_size // max(1, local_world_size)),
            process_index=layout.rank if layout is not None else 0,
            is_distributed_launch=launched,
            mps_available=bool(torch.backends.mps.is_available()),
            installed_loggers=installed_logger_backends(),
            reference_integrations=_importable("transformers"),
            installed_packages=frozenset(
                name for name in OPTIONAL_PACKAGES if importlib.util.find_spec(name) is not None
            ),
            environ={
                name: os.environ[name] for name in (*LOGGER_ENV_VARS, *_DEVICE_ENV_VARS) if name in os.environ
            },
        )

    @classmethod
    def for_target(cls, accelerator: str | None = None, devices: int = 1, num_nodes: int = 1) -> Environment:
        """The machine a run is meant for, to preview its translation on another one: `accelerator` ("gpu",
        "mps" or "cpu"; None: this machine's kind), `devices` processes per node (one per GPU), `num_nodes`
        nodes, started by a launcher when there are several. Installed packages and variables are this
        machine's."""
        here = cls.detect()
        if accelerator is None:
            accelerator = "gpu" if here.cuda_available else "mps" if here.mps_available else "cpu"
        if accelerator not in ("gpu", "mps", "cpu"):
            raise ValueError(f"accelerator={accelerator!r}: pick 'gpu' (CUDA), 'mps' or 'cpu'.")
        if devices < 1 or num_nodes < 1:
            raise ValueError(f"devices={devices}, num_nodes={num_nodes}: both must be >= 1.")
        world_size = devices * num_nodes
        return replace(
            here,
            cuda_available=accelerator == "gpu",
            cuda_device_count=devices if accelerator == "gpu" else 0,
            mps_available=accelerator == "mps",
            world_size=world_size,
            local_world_size=devices,
            num_nodes=num_nodes,
            process_index=0,
            is_distributed_launch=world_size > 1,
        )

