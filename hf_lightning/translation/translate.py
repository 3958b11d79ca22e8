"""Arguments -> a plain `Plan` for Lightning. `translate` is pure: no process group, no model,
no side effects; it reads the arguments and an `Environment` snapshot only.

Every field of the arguments gets a `FieldNote` (honoured / refused / warned / not-applicable)
from the registry in `hf_lightning.translation.field_registry`; refusals raise one ValueError listing them.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hf_lightning.args.process import cpu_switch_on, reference_n_gpu
from hf_lightning.integrations.loggers import LOGGER_ENV_VARS, installed_logger_backends
from hf_lightning.translation.field_registry import FIELD_REGISTRY
from hf_lightning.translation.registry.core import (
    NOT_APPLICABLE,
    REFUSED,
    WARNED,
    Context,
    Decision,
    plain,
)
from hf_lightning.translation.registry.distributed import select_strategy
from hf_lightning.translation.registry.features import landed_features

# Optional packages whose presence changes a decision (liger kernels, DeepSpeed).
OPTIONAL_PACKAGES = ("liger_kernel", "deepspeed")
_LAUNCHER_VARS = ("LOCAL_RANK", "RANK")


# Device switches the translation reads, as the arguments' `device` does.
_DEVICE_ENV_VARS = ("ACCELERATE_USE_CPU",)


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
    # Non-secret variables the logger specs read (see `loggers.LOGGER_ENV_VARS`).
    environ: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def detect(cls) -> Environment:
        """Read torch and the launcher's environment variables (torchrun / accelerate launch)."""
        import importlib.util

        import torch

        cuda = torch.cuda.is_available()
        launched = "WORLD_SIZE" in os.environ and any(name in os.environ for name in _LAUNCHER_VARS)
        world_size = int(os.environ["WORLD_SIZE"]) if launched else 1
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size)) if launched else 1
        return cls(
            cuda_available=cuda,
            cuda_device_count=torch.cuda.device_count() if cuda else 0,
            world_size=world_size,
            local_world_size=local_world_size,
            num_nodes=max(1, world_size // max(1, local_world_size)),
            process_index=int(os.environ.get("RANK", 0)) if launched else 0,
            is_distributed_launch=launched,
            mps_available=bool(torch.backends.mps.is_available()),
            installed_loggers=installed_logger_backends(),
            installed_packages=frozenset(
                name for name in OPTIONAL_PACKAGES if importlib.util.find_spec(name) is not None
            ),
            environ={
                name: os.environ[name] for name in (*LOGGER_ENV_VARS, *_DEVICE_ENV_VARS) if name in os.environ
            },
        )


@dataclass(frozen=True)
class FieldNote:
    """How one argument is carried out: `status` is honoured / refused / warned / not-applicable."""

    field: str
    value: Any
    status: str
    how: str


@dataclass(frozen=True)
class Plan:
    """Everything the facade needs to build `lightning.Trainer` and `HFLightningModule`.

    `trainer_kwargs` is accepted by `lightning.Trainer` as is; when `strategy` is not None the
    facade passes `strategy=build_strategy(plan, model)` instead of the name it holds, and
    `logger=build_loggers(plan)` when `loggers` is not empty.
    """

    trainer_kwargs: dict[str, Any]
    strategy: dict[str, Any] | None
    module_settings: dict[str, Any]
    callbacks: list[dict[str, Any]]
    loggers: list[dict[str, Any]]
    notes: dict[str, FieldNote]

    def refusals(self) -> list[FieldNote]:
        """The notes of refused fields (empty unless translated with `raise_on_refusal=False`)."""
        return [note for note in self.notes.values() if note.status == REFUSED]

    def warnings(self) -> list[str]:
        """Messages the trainer shows once, for fields accepted with a warning."""
        return [
            f"{note.field}={note.value!r}: {note.how}"
            for note in self.notes.values()
            if note.status == WARNED
        ]


def _base_trainer_kwargs() -> dict[str, Any]:
    # Manual optimization: one Lightning training_step is one optimizer update, so accumulation
    # and clipping are module settings; the facade owns samplers, seeding, progress and saving.
    return {
        "accelerator": "cpu",
        "devices": 1,
        "num_nodes": 1,
        "strategy": "auto",
        "precision": "32-true",
        "max_steps": -1,  # resolved at train start and filled in by the trainer
        "max_epochs": -1,  # the run stops by update count, never by Lightning's epoch count
        "accumulate_grad_batches": 1,
        "gradient_clip_val": None,
        "deterministic": None,
        "benchmark": None,
        "use_distributed_sampler": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "limit_val_batches": 0,
        "logger": False,
        "log_every_n_steps": 1,  # irrelevant: the facade decides when to log
        "inference_mode": True,
        "default_root_dir": "trainer_output",
    }


def _cpu_requested(args: Any, env: Environment) -> bool:
    """`use_cpu`, or accelerate's `ACCELERATE_USE_CPU` switch (as `TrainingArguments.device` reads it)."""
    return bool(getattr(args, "use_cpu", False)) or cpu_switch_on(env.environ)


def _accelerator(args: Any, env: Environment) -> str:
    if _cpu_requested(args, env):
        return "cpu"
    if env.cuda_available:
        return "gpu"
    if env.mps_available:
        return "mps"
    return "cpu"


def _n_gpu(accelerator: str, env: Environment, strategy_name: str = "single", use_cpu: bool = False) -> int:
    """The reference's `args.n_gpu` (`args_process.reference_n_gpu`) for the accelerator chosen, without setting
    up a device. Under DeepSpeed without a launcher the reference's state is the single-process one, so the
    plain rule applies."""
    return reference_n_gpu(
        {"gpu": "cuda"}.get(accelerator, accelerator),
        distributed=env.is_distributed_launch,
        cuda_device_count=env.cuda_device_count,
        deepspeed_launch=strategy_name == "deepspeed" and env.is_distributed_launch and not use_cpu,
    )


def _field_names(args: Any) -> list[str]:
    if dataclasses.is_dataclass(args):
        return [f.name for f in dataclasses.fields(args) if f.init]
    return [name for name in FIELD_REGISTRY if hasattr(args, name)]


def _note_value(name: str, value: Any) -> Any:
    """A display- and compare-safe copy: enums as strings, configs as dicts, tokens redacted."""
    if name.endswith("_token") and value is not None:
        return f"<{name.upper()}>"
    value = plain(value)
    if hasattr(value, "to_dict") and not isinstance(value, Mapping):
        value = value.to_dict()
    try:
        return copy.deepcopy(value)
    except Exception:  # an object that cannot be copied is shown, not kept
        return repr(value)


def _merge(
    target: dict[str, Any], update: Mapping[str, Any], field_name: str, what: str, owners: dict[str, str]
) -> None:
    for key, value in update.items():
        if key in owners and target[key] != value:
            raise RuntimeError(
                f"registry bug: {field_name} and {owners[key]} both set {what}[{key!r}] "
                f"({value!r} vs {target[key]!r})"
            )
        owners[key] = field_name
        target[key] = copy.deepcopy(value)


def translate(args: Any, env: Environment | None = None, *, raise_on_refusal: bool = True) -> Plan:
    """Turn `TrainingArguments` (ours or the reference's) into a `Plan`; pure.

    Raises ValueError naming every refused field, its value and what to do instead, unless
    `raise_on_refusal=False` (then the refusals stay in `plan.notes`, for `explain`).
    """
    env = env if env is not None else Environment.detect()
    accelerator = _accelerator(args, env)
    strategy_name = select_strategy(args, env)
    ctx = Context(
        args=args,
        env=env,
        features=landed_features(),
        accelerator=accelerator,
        strategy_name=strategy_name,
        n_gpu=_n_gpu(accelerator, env, strategy_name, use_cpu=_cpu_requested(args, env)),
    )
    trainer_kwargs = _base_trainer_kwargs()
    module_settings: dict[str, Any] = {}
    strategy_kwargs: dict[str, Any] = {}
    strategy_details: dict[str, Any] = {}
    owners: dict[str, dict[str, str]] = {"trainer": {}, "module": {}, "strategy": {}, "details": {}}
    loggers: list[dict[str, Any]] = []
    callbacks: list[dict[str, Any]] = []
    notes: dict[str, FieldNote] = {}

    for name in _field_names(args):
        value = getattr(args, name)
        entry = FIELD_REGISTRY.get(name)
        if entry is None:
            decision = Decision(
                NOT_APPLICABLE, "not a reference field (a subclass's own): hf_lightning does not read it"
            )
        else:
            decision = entry.handler(name, plain(value), ctx)
        notes[name] = FieldNote(name, _note_value(name, value), decision.status, decision.how)
        if decision.status == REFUSED:
            continue
        _merge(trainer_kwargs, decision.trainer_kwargs, name, "trainer_kwargs", owners["trainer"])
        _merge(module_settings, decision.module_settings, name, "module_settings", owners["module"])
        _merge(strategy_kwargs, decision.strategy_kwargs, name, "strategy kwargs", owners["strategy"])
        _merge(strategy_details, decision.strategy_details, name, "strategy details", owners["details"])
        loggers.extend(copy.deepcopy(list(decision.loggers)))
        callbacks.extend(copy.deepcopy(list(decision.callbacks)))

    strategy = None
    if ctx.strategy_name != "single":
        strategy = {"name": ctx.strategy_name, "kwargs": strategy_kwargs, "details": strategy_details}
        trainer_kwargs["strategy"] = ctx.strategy_name
    plan = Plan(trainer_kwargs, strategy, module_settings, callbacks, loggers, notes)
    if raise_on_refusal and plan.refusals():
        lines = [f"  - {note.field}={note.value!r}: {note.how}" for note in plan.refusals()]
        raise ValueError("hf_lightning cannot honour these arguments:\n" + "\n".join(lines))
    return plan


def resolve_ddp_kwargs(plan: Plan, model: Any) -> dict[str, Any]:
    """`DDPStrategy` kwargs with R7.3's model-dependent `find_unused_parameters` default filled in."""
    if plan.strategy is None or plan.strategy["name"] != "ddp":
        raise ValueError("the plan does not use DDP")
    kwargs = dict(plan.strategy["kwargs"])
    if "find_unused_parameters" not in kwargs:
        # Duck-typed so transformers stays optional: a PreTrainedModel anywhere in the MRO.
        is_transformers_model = any(cls.__name__ == "PreTrainedModel" for cls in type(model).__mro__)
        if is_transformers_model:
            checkpointing = getattr(model, "is_activation_checkpointing", None)
            if checkpointing is None:  # transformers before the v5 rename
                checkpointing = getattr(model, "is_gradient_checkpointing", False)
            checkpointing = bool(checkpointing)
            checkpointing = checkpointing or bool(plan.module_settings.get("activation_checkpointing"))
            kwargs["find_unused_parameters"] = not checkpointing
        else:
            kwargs["find_unused_parameters"] = True
    return kwargs


def build_strategy(plan: Plan, model: Any) -> Any:
    """The `strategy=` value for `lightning.Trainer`: "auto" or a Lightning strategy object."""
    if plan.strategy is None:
        return "auto"
    if plan.strategy["name"] == "ddp":
        from hf_lightning.strategies.ddp import MicroBatchDDPStrategy

        return MicroBatchDDPStrategy(**resolve_ddp_kwargs(plan, model))
    if plan.strategy["name"] in ("fsdp", "fsdp2"):
        from hf_lightning.strategies.fsdp.strategy import build_fsdp_strategy

        return build_fsdp_strategy(plan, model)
    if plan.strategy["name"] == "deepspeed":
        from hf_lightning.strategies.deepspeed.strategy import build_deepspeed_strategy

        return build_deepspeed_strategy(plan, model)
    raise NotImplementedError(f"building the {plan.strategy['name']!r} strategy lands with its feature")


def explain(plan: Plan) -> str:
    """A readable table, one line per field: field, value, status, how."""
    rows = [(note.field, _short(note.value), note.status, note.how) for note in plan.notes.values()]
    headers = ("field", "value", "status", "how")
    widths = [
        max(len(headers[i]), *(len(row[i]) for row in rows)) if rows else len(headers[i]) for i in range(3)
    ]
    lines = [f"{headers[0]:<{widths[0]}}  {headers[1]:<{widths[1]}}  {headers[2]:<{widths[2]}}  {headers[3]}"]
    lines.append("  ".join("-" * width for width in widths) + "  " + "-" * 3)
    for row in rows:
        lines.append(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}")
    return "\n".join(lines) + "\n"


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
