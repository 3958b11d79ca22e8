"""Build the `lightning.Trainer` for one `train()` call from the translation plan.

The plan is computed once at construction (pure); the run-dependent limits (`max_steps`, the epoch
bound) are only known once the train dataloader exists, so they are added here.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.plugins.environments import ClusterEnvironment

import hf_lightning.engine.schedule as schedule
from hf_lightning.args.launcher import launch_layout
from hf_lightning.checkpoint.async_writes import check_checkpoint_plugins
from hf_lightning.engine import lean_lightning, lean_logging
from hf_lightning.engine.precision import lightning_precision_kwargs
from hf_lightning.integrations.loggers import build_loggers
from hf_lightning.strategies.build import build_strategy
from hf_lightning.strategies.uneven_nodes import environment_for_layout

# Lightning's start-up banners ("GPU available", tips, "fit stopped") are noise next to the
# reference's own output; real warnings still come through.
_QUIET_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.pytorch.accelerators.cuda",
    "lightning.fabric.utilities.seed",
)


def quiet_lightning_banners() -> None:
    """Raise Lightning's banner loggers to WARNING (idempotent)."""
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


# What Lightning says about the `training_step(dataloader_iter)` flavour our module uses by design (one step pulls
# one accumulation window), aimed at a LightningModule's author, and the deprecation Lightning's own pytree use
# raises on this torch: nothing a Trainer script's user can act on, three lines per train() call. Scoped to `fit`
# rather than set at import, so the process's warning filters stay the user's.
_ENGINE_DESIGN_WARNINGS = (
    r"Found `dataloader_iter` argument in the `training_step`",
    r"You are using the `dataloader_iter` step flavor",
    r".*`isinstance\(treespec, LeafSpec\)` is deprecated",
)


@contextlib.contextmanager
def engine_design_warnings_silenced() -> Iterator[None]:
    """Around `fit`: drop Lightning's warnings about our own step flavour; every other warning still shows."""
    with warnings.catch_warnings():
        for message in _ENGINE_DESIGN_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        yield


def lightning_trainer_kwargs(plan: Any, values: schedule.TrainingValues) -> dict[str, Any]:
    """The plan's `lightning.Trainer` kwargs with this run's step and epoch bounds."""
    kwargs = plan.lightning.as_kwargs()
    kwargs.update(lightning_precision_kwargs(kwargs.pop("precision", "32-true")))
    kwargs["max_steps"] = values.max_steps
    kwargs["max_epochs"] = -1 if values.num_train_epochs >= sys.maxsize else values.num_train_epochs
    return kwargs


def build_lightning_trainer(
    plan: Any,
    values: schedule.TrainingValues,
    user_callbacks: list[pl.Callback] = (),
    model: Any = None,
    overrides: Mapping[str, Any] | None = None,
    loggers: list[Any] | None = None,
) -> pl.Trainer:
    """A `lightning.Trainer` configured by the plan, with the plan's loggers and the user's callbacks.

    `loggers`: the plan's loggers when they already exist (built by a log before training), else built here.
    `overrides` (the facade's `lightning_trainer_overrides`) are merged last: they take precedence over the
    translation, except `callbacks`, which are added after the engine's.
    """
    quiet_lightning_banners()
    kwargs = lightning_trainer_kwargs(plan, values)
    if loggers is None:
        loggers = build_loggers(plan)
    if loggers:
        kwargs["logger"] = loggers
    if plan.strategy is not None:

        kwargs["strategy"] = build_strategy(plan, model)
    kwargs["callbacks"] = list(user_callbacks)
    kwargs = merge_lightning_overrides(kwargs, overrides or {})
    check_cluster_environments(kwargs.get("plugins"))
    _describe_uneven_nodes(kwargs)
    trainer = pl.Trainer(**kwargs)
    lean_logging.use_lean_logger_connector(trainer)
    lean_lightning.use_lean_profiler(trainer)
    lean_lightning.use_lean_epoch_loop(trainer)
    return trainer


# ---- native lightning.Trainer overrides --------------------------------------------------------------

# Keys a user may set on `lightning.Trainer` directly: they do not touch the engine's contract (one Lightning
# step per optimizer update, the facade's samplers, seeding, flow, logging and saving).
SAFE_LIGHTNING_OVERRIDES: dict[str, str] = {
    "callbacks": "Lightning callbacks, added after the engine's own",
    "logger": "replaces the loggers translated from report_to",
    "profiler": "a Lightning profiler ('simple', 'advanced', 'pytorch' or an instance)",
    "max_time": "stops training after this wall-clock time, like an early-stopping callback",
    "enable_progress_bar": "Lightning's own progress bar (the reference's tqdm bar is unaffected)",
    "enable_model_summary": "Lightning's model summary at fit start",
    "detect_anomaly": "torch.autograd anomaly detection",
    "default_root_dir": "where Lightning's own files go (translated from output_dir)",
    "plugins": "only Lightning's AsyncCheckpointIO: checkpoints are written, fsynced and committed in a background "
    "thread (hf_lightning/checkpoint/async_writes.py); and Ray's RayLightningEnvironment where it describes the run's "
    "processes",
}

# Keys the engine owns, with what to set instead.
REFUSED_LIGHTNING_OVERRIDES: dict[str, str] = {
    "accelerator": "use TrainingArguments.use_cpu (the device comes from the arguments)",
    "strategy": "use TrainingArguments.ddp_backend / fsdp / deepspeed (the strategy is translated from them)",
    "devices": "launch with torchrun / CUDA_VISIBLE_DEVICES (the process layout comes from the launcher)",
    "num_nodes": "launch with torchrun (the process layout comes from the launcher)",
    "precision": "use TrainingArguments.bf16 / fp16",
    "max_steps": "use TrainingArguments.max_steps",
    "min_steps": "use TrainingArguments.max_steps (the run stops at the reference's step count)",
    "max_epochs": "use TrainingArguments.num_train_epochs",
    "min_epochs": "use TrainingArguments.num_train_epochs",
    "fast_dev_run": "use TrainingArguments.max_steps (e.g. max_steps=1)",
    "limit_train_batches": "use TrainingArguments.max_steps (the epoch length is the reference's)",
    "overfit_batches": "use a small train_dataset",
    "accumulate_grad_batches": "use TrainingArguments.gradient_accumulation_steps (the engine accumulates itself)",
    "gradient_clip_val": "use TrainingArguments.max_grad_norm (the engine clips itself)",
    "gradient_clip_algorithm": "use TrainingArguments.max_grad_norm (the engine clips by norm, as the reference)",
    "limit_val_batches": "use TrainingArguments.eval_strategy / eval_steps (the facade runs evaluation)",
    "limit_test_batches": "use predict() on a smaller test_dataset (the facade runs prediction)",
    "limit_predict_batches": "use predict() on a smaller test_dataset (the facade runs prediction)",
    "val_check_interval": "use TrainingArguments.eval_strategy / eval_steps",
    "check_val_every_n_epoch": "use TrainingArguments.eval_strategy='epoch'",
    "num_sanity_val_steps": "use TrainingArguments.eval_on_start",
    "log_every_n_steps": "use TrainingArguments.logging_steps (the facade decides when to log)",
    "enable_checkpointing": "use TrainingArguments.save_strategy, or pass a ModelCheckpoint in callbacks",
    "deterministic": "use TrainingArguments.full_determinism",
    "benchmark": "use TrainingArguments.full_determinism (cuDNN settings follow it)",
    "inference_mode": "it has no effect: Lightning's evaluation loops are unused, the facade's evaluate() runs them",
    "use_distributed_sampler": "use TrainingArguments.train_sampling_strategy (the engine owns the samplers)",
    "reload_dataloaders_every_n_epochs": "use TrainingArguments.dataloader_persistent_workers",
    "sync_batchnorm": "convert the model with torch.nn.SyncBatchNorm.convert_sync_batchnorm before training",
    "barebones": "use TrainingArguments.disable_tqdm / report_to='none' (barebones disables the facade's logging)",
    "enable_autolog_hparams": "use TrainingArguments.report_to (the loggers are translated from it)",
    "model_registry": "save with TrainingArguments.save_strategy / save_model()",
}


# Ray's Lightning recipe (docs/design.md, "Ray"): its strategies and callback replace what the engine builds from the
# arguments; the supported path on Ray Train is the transformers-on-Ray recipe. Its RayLightningEnvironment only
# describes the processes and is accepted in `plugins` where it describes the run's (`check_cluster_environments`).
RAY_RECIPE = (
    "on Ray Train, use the transformers-on-Ray recipe with this Trainer: in the TorchTrainer's train function "
    "`trainer = ray.train.huggingface.transformers.prepare_trainer(trainer)` with "
    "`callbacks=[ray.train.huggingface.transformers.RayTrainReportCallback()]`; Ray's process group, ranks and "
    "devices are used as Ray set them up (README, \"On a Ray cluster\")"
)


def refuse_ray_lightning(values: Any, where: str) -> None:
    """A ValueError naming the supported recipe when `values` holds a part of Ray's Lightning recipe
    (`ray.train.lightning`: RayDDPStrategy, RayFSDPStrategy, RayDeepSpeedStrategy, its RayTrainReportCallback);
    its RayLightningEnvironment passes (a ClusterEnvironment, checked against the run's processes at build time)."""
    entries = values if isinstance(values, (list, tuple)) else [values]
    classes = [_class_of(v) for v in entries]
    names = [
        c.__name__
        for c in classes
        if c is not None and (c.__module__ or "").startswith("ray.train.lightning") and not _is_cluster_environment(c)
    ]
    if names:
        raise ValueError(
            f"{where} got {', '.join(names)} from Ray's Lightning recipe (ray.train.lightning), which replaces the "
            f"strategy and checkpoints hf_lightning builds from TrainingArguments (its RayLightningEnvironment is "
            f"accepted in plugins); {RAY_RECIPE}."
        )


def _is_cluster_environment(cls: type) -> bool:
    return issubclass(cls, ClusterEnvironment)


# A run config names a class by `class_path`; one of Ray's Lightning classes is resolved before instantiation.
_RAY_LIGHTNING = "ray.train.lightning"


def _class_of(entry: Any) -> type | None:
    """The class of `entry`: itself when a class, the class a run config's `{class_path: ...}` names when that is one
    of Ray's Lightning classes (None when it does not import: the config's parser reports it), else its type."""
    if isinstance(entry, type):
        return entry
    if isinstance(entry, Mapping):
        class_path = entry.get("class_path")
        if not isinstance(class_path, str) or not class_path.startswith(_RAY_LIGHTNING + "."):
            return type(entry)
        module_name, _, name = class_path.rpartition(".")
        try:
            found = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError):
            return None
        return found if isinstance(found, type) else None
    return type(entry)


def _ray_environment(entry: Any) -> bool:
    """Whether `entry` is Ray's RayLightningEnvironment (or another Ray ClusterEnvironment): built, a class, or
    named by a run config's `class_path`."""
    cls = _class_of(entry)
    return cls is not None and (cls.__module__ or "").startswith(_RAY_LIGHTNING) and _is_cluster_environment(cls)


def check_cluster_environments(plugins: Any) -> None:
    """ValueError naming the mismatch when a Ray `ClusterEnvironment` in `plugins` describes other processes than
    the launcher's variables the arguments read (world size, global rank, local rank, node rank)."""
    layout = launch_layout()
    ours = (
        (layout.world_size, layout.rank, layout.local_rank, layout.node_rank) if layout is not None else (1, 0, 0, 0)
    )
    for entry in plugins or []:
        if not _ray_environment(entry) or isinstance(entry, (type, Mapping)):
            continue  # a class or a run config's entry is checked once built
        theirs = (entry.world_size(), entry.global_rank(), entry.local_rank(), entry.node_rank())
        names = ("world size", "global rank", "local rank", "node rank")
        wrong = [f"{name} {t} (the run's arguments: {o})" for name, t, o in zip(names, theirs, ours) if t != o]
        if wrong:
            raise ValueError(
                f"lightning.Trainer override 'plugins' got {type(entry).__name__}, which describes other processes "
                f"than this run's: {'; '.join(wrong)}. Run it inside the Ray Train worker that launched this process "
                f"(the arguments read the variables Ray's TorchConfig sets), or remove it: the layout is read anyway."
            )


def _describe_uneven_nodes(kwargs: dict[str, Any]) -> None:
    """Add the launcher's own description of this process to `plugins` when its node holds another process count
    than some other node (Lightning's devices x num_nodes cannot say it); a ClusterEnvironment the user passed wins."""
    plugins = list(kwargs.get("plugins") or [])
    if any(isinstance(entry, ClusterEnvironment) for entry in plugins):
        return
    environment = environment_for_layout(launch_layout(), kwargs.get("devices", 1), kwargs.get("num_nodes", 1))
    if environment is not None:
        kwargs["plugins"] = [*plugins, environment]


def check_lightning_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `overrides` after checking each key; a refused or unknown key raises ValueError naming it."""
    if not isinstance(overrides, Mapping):
        raise ValueError(
            f"lightning_trainer_overrides must be a dict of lightning.Trainer arguments, got {type(overrides).__name__}."
        )
    for key in overrides:
        refuse_ray_lightning(overrides[key], f"lightning.Trainer override {key!r}")
        if key in REFUSED_LIGHTNING_OVERRIDES:
            raise ValueError(
                f"lightning.Trainer override {key!r} is refused: the engine sets it itself; "
                f"{REFUSED_LIGHTNING_OVERRIDES[key]}."
            )
        if key not in SAFE_LIGHTNING_OVERRIDES:
            raise ValueError(
                f"lightning.Trainer override {key!r} is not a lightning.Trainer argument hf_lightning accepts; "
                f"allowed: {', '.join(SAFE_LIGHTNING_OVERRIDES)}."
            )
    checked = dict(overrides)
    if "plugins" in checked:

        entries = checked["plugins"] if isinstance(checked["plugins"], (list, tuple)) else [checked["plugins"]]
        environments = [entry for entry in entries if _ray_environment(entry)]
        others = [entry for entry in entries if not _ray_environment(entry)]
        checked["plugins"] = (check_checkpoint_plugins(others) if others else []) + environments
    return checked


def merge_lightning_overrides(kwargs: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`kwargs` with the checked `overrides` merged last; `callbacks` and `plugins` are appended, every other key
    replaces."""
    merged = dict(kwargs)
    for key, value in check_lightning_overrides(overrides).items():
        if key == "plugins":
            merged["plugins"] = list(merged.get("plugins") or []) + list(value)
        elif key == "callbacks":
            added = value if isinstance(value, (list, tuple)) else [value]
            merged["callbacks"] = list(merged.get("callbacks") or []) + list(added)
        else:
            merged[key] = value
    return merged


def explain_lightning_overrides(overrides: Mapping[str, Any], plan: Any = None) -> str:
    """The section of `explain()` listing each override and the translated value it replaces."""
    if not overrides:
        return ""
    translated = plan.lightning.as_kwargs() if plan is not None else {}
    lines = ["", "lightning.Trainer overrides (take precedence):"]
    for key, value in overrides.items():
        if key == "callbacks":
            effect = "added after the engine's callbacks"
        elif key == "logger":
            effect = "replaces the loggers translated from report_to"
        elif key == "plugins":
            entries = value if isinstance(value, (list, tuple)) else [value]
            effects = ["the processes described by Ray's context" if _ray_environment(e) else "" for e in entries]
            if len(entries) > sum(bool(e) for e in effects):
                effects.append("checkpoints written in a background thread")
            effect = ", ".join(e for e in effects if e)
        else:
            effect = (
                f"replaces the translated {translated.get(key)!r}"
                if key in translated
                else "not set by the translation"
            )
        lines.append(f"  {key} = {_short_repr(value)}  ({effect})")
    return "\n".join(lines) + "\n"


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
