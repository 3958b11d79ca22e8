"""Registry entries: reproducibility, hardware, accelerate options, dataloader, debug and script flags."""

from __future__ import annotations

from typing import Any

from hf_lightning.translation.handlers.core import (
    Context,
    Decision,
    FieldEntry,
    always,
    config_as_dict,
    honoured,
    not_applicable,
    refused,
    script_flag,
)
from hf_lightning.translation.handlers.distributed import parallelism_config_decision

# ------------------------------------------------------------------ reproducibility


def _full_determinism(field: str, value: Any, ctx: Context) -> Decision:
    if not value:
        return honoured(
            "facade: plain seeding (set_seed); Lightning's deterministic / benchmark left unset",
            lightning={"deterministic": None, "benchmark": None},
        )
    return honoured(
        "facade: enable_full_determinism(seed) (env vars, deterministic algorithms, cuDNN); "
        "Lightning deterministic=True, benchmark=False",
        lightning={"deterministic": True, "benchmark": False},
    )


def _data_seed(field: str, value: Any, ctx: Context) -> Decision:
    if value is None:
        return honoured(
            "samplers.py: the train order is seeded with torch.initial_seed() at train start (R3.2)"
        )
    return honoured("samplers.py: the train order is seeded with data_seed + epoch (R3.2)")


# ------------------------------------------------------------------ hardware


def _use_cpu(field: str, value: Any, ctx: Context) -> Decision:
    if ctx.n_gpu > 1:
        return refused(
            f"n_gpu={ctx.n_gpu}: {ctx.n_gpu} GPUs are visible to one process, where the reference would use "
            "nn.DataParallel, which Lightning does not have. A script run with `python` becomes one process "
            "per GPU by itself (hf_lightning.strategies.launch), but a notebook or REPL cannot be re-run: launch "
            f"a script with torchrun --nproc_per_node {ctx.n_gpu}, or expose one GPU (CUDA_VISIBLE_DEVICES=0)"
        )
    env = ctx.env
    devices: int = env.local_world_size if ctx.multi_process else 1
    kwargs = {"accelerator": ctx.accelerator, "devices": devices, "num_nodes": env.num_nodes}
    where = {"cpu": "CPU", "gpu": "CUDA GPU", "mps": "Apple MPS"}[ctx.accelerator]
    reason = " (use_cpu=True)" if value else ""
    return honoured(
        f"Lightning accelerator={ctx.accelerator!r}, devices={devices}, num_nodes={env.num_nodes}: {where}{reason}",
        lightning=kwargs,
    )


_ACCELERATOR_CONFIG_KEYS = (
    "split_batches",
    "dispatch_batches",
    "even_batches",
    "use_seedable_sampler",
    "non_blocking",
    "gradient_accumulation_kwargs",
    "use_configured_state",
)


def _accelerator_config(field: str, value: Any, ctx: Context) -> Decision:
    config = config_as_dict(value) or {}
    unknown = sorted(set(config) - set(_ACCELERATOR_CONFIG_KEYS))
    if unknown:
        return refused(f"unknown keys {unknown}; accepted keys: {', '.join(_ACCELERATOR_CONFIG_KEYS)}")
    accumulation = dict(config.get("gradient_accumulation_kwargs") or {})
    settings: dict[str, Any] = {
        "split_batches": bool(config.get("split_batches", False)),
        "dispatch_batches": config.get("dispatch_batches"),
        "even_batches": bool(config.get("even_batches", True)),
        "use_seedable_sampler": bool(config.get("use_seedable_sampler", True)),
        "sync_each_batch": bool(accumulation.get("sync_each_batch", False)),
    }
    if accumulation.get("num_steps") is not None and ctx.get("gradient_accumulation_steps") != 1:
        return refused(
            "gradient_accumulation_kwargs['num_steps'] is set while gradient_accumulation_steps > 1 (T9); "
            "set only gradient_accumulation_steps (rules: docs/reference-behaviour.md)"
        )
    return honoured(
        "data/samplers.py / data/dataloaders.py: batch sharding and sampler options (R7.4); HFLightningModule: "
        "sync_each_batch (num_steps: see gradient_accumulation_steps)",
        module=settings,
    )


# ------------------------------------------------------------------ dataloader


def _length_column_name(field: str, value: Any, ctx: Context) -> Decision:
    if ctx.get("train_sampling_strategy") in ("group_by_length", "batch_rebalance"):
        return honoured("samplers.py: lengths read from this column of a datasets.Dataset")
    return not_applicable("only the length-aware samplers read it")


def _train_sampling_strategy(field: str, value: Any, ctx: Context) -> Decision:
    known = ("random", "sequential", "group_by_length", "batch_rebalance")
    if value not in known:
        return honoured(
            f"samplers.py: an unknown value behaves like 'random' (as in the reference); known: {known}"
        )
    return honoured(f"samplers.py: the reference's {value!r} order (R3.1)")


def _dataloader_prefetch_factor(field: str, value: Any, ctx: Context) -> Decision:
    if value is not None and not ctx.get("dataloader_num_workers"):
        return refused("needs dataloader_num_workers > 0 (V11)")
    return honoured("data/dataloaders.py: DataLoader prefetch_factor")


# ------------------------------------------------------------------ debug

_DEBUG_REASONS = {
    "underflow_overflow": "the underflow/overflow detector is not supported; use torch.autograd.set_detect_anomaly(True) or your own forward hooks",
    "tpu_metrics_debug": "TPU metrics are XLA-only and hf_lightning runs on CUDA, MPS or CPU",
}


def _debug(field: str, value: Any, ctx: Context) -> Decision:
    options = value.split() if isinstance(value, str) else list(value or [])
    if not options:
        return honoured("no debug options")
    reasons = [f"{option!r}: {_DEBUG_REASONS.get(option, 'unknown debug option')}" for option in options]
    return refused("; ".join(reasons) + "; remove it from debug")


def _skip_memory_metrics(field: str, value: Any, ctx: Context) -> Decision:
    if value:
        return honoured("no memory metrics")
    return honoured("memory.py: init/train/eval/test memory deltas added to the metrics (EVAL-2.13, R6.6)")


_SCRIPT_FLAG = "script flag: read by your script, not by the trainer (as in the reference)"

ENTRIES: list[FieldEntry] = [
    FieldEntry(
        "full_determinism",
        False,
        _full_determinism,
        "`enable_full_determinism`; Lightning `deterministic=True`, `benchmark=False`",
    ),
    FieldEntry(
        "seed",
        42,
        always(
            "facade: set_seed(seed) when the trainer is built, as the reference; Lightning's seed_everything is never called"
        ),
        "global seed",
    ),
    FieldEntry("data_seed", None, _data_seed, "train sampler seed"),
    FieldEntry(
        "use_cpu",
        False,
        _use_cpu,
        "Lightning accelerator / devices; several GPUs in one process are refused (no DataParallel)",
    ),
    FieldEntry(
        "accelerator_config",
        None,
        _accelerator_config,
        "data sharding options, implemented by hf_lightning's samplers; `use_configured_state` accepted (the "
        "launcher's process layout is the configured one)",
    ),
    FieldEntry(
        "parallelism_config",
        None,
        parallelism_config_decision,
        "dp_shard_size: FSDP2, tp_size: the model's tp plan, on ModelParallelStrategy's mesh; "
        "cp / sp / dp_replicate refused",
    ),
    FieldEntry(
        "dataloader_drop_last",
        False,
        always("data/dataloaders.py: drop_last of the train, eval and test dataloaders"),
        "DataLoader drop_last",
    ),
    FieldEntry(
        "dataloader_num_workers",
        0,
        always("data/dataloaders.py: DataLoader num_workers, workers seeded as the reference (R3.8)"),
        "DataLoader workers",
    ),
    FieldEntry(
        "dataloader_pin_memory", True, always("data/dataloaders.py: DataLoader pin_memory"), "DataLoader pin_memory"
    ),
    FieldEntry(
        "dataloader_persistent_workers",
        False,
        always("data/dataloaders.py: DataLoader persistent_workers"),
        "DataLoader persistent_workers",
    ),
    FieldEntry("dataloader_prefetch_factor", None, _dataloader_prefetch_factor, "DataLoader prefetch_factor"),
    FieldEntry(
        "dataloader_multiprocessing_context",
        None,
        always("data/dataloaders.py: DataLoader multiprocessing_context"),
        "DataLoader multiprocessing_context",
    ),
    FieldEntry("dataloader_in_order", True, always("data/dataloaders.py: DataLoader in_order"), "DataLoader in_order"),
    FieldEntry(
        "remove_unused_columns",
        True,
        always("data/model_inputs.py / data/collate.py: inputs forward() does not accept are dropped (R3.11)"),
        "drop unused dataset columns",
    ),
    FieldEntry(
        "label_names",
        None,
        always("data/model_inputs.py: label keys (default derived from the model's forward, R3.12)"),
        "label keys",
    ),
    FieldEntry(
        "train_sampling_strategy",
        "random",
        _train_sampling_strategy,
        "train order (random, sequential, group_by_length, batch_rebalance)",
    ),
    FieldEntry("length_column_name", "length", _length_column_name, "precomputed lengths column"),
]

# After the distributed fields in the reference's order.
TAIL_ENTRIES: list[FieldEntry] = [
    FieldEntry(
        "debug",
        "",
        _debug,
        "empty only: each option (`underflow_overflow`, `tpu_metrics_debug`) is refused with its reason",
        support="default only",
    ),
    FieldEntry(
        "skip_memory_metrics",
        True,
        _skip_memory_metrics,
        "`False`: the reference's memory keys (psutil, hf_lightning/engine/memory.py)",
    ),
    FieldEntry("do_train", False, script_flag(_SCRIPT_FLAG), "script flag (no effect, as in the reference)"),
    FieldEntry("do_eval", False, script_flag(_SCRIPT_FLAG), "script flag (no effect, as in the reference)"),
    FieldEntry(
        "do_predict", False, script_flag(_SCRIPT_FLAG), "script flag (no effect, as in the reference)"
    ),
    FieldEntry(
        "resume_from_checkpoint",
        None,
        script_flag(
            "script flag: pass it to trainer.train(resume_from_checkpoint=...) (as in the reference)"
        ),
        "script flag (no effect, as in the reference)",
    ),
    FieldEntry(
        "local_rank",
        -1,
        script_flag("ranks come from the launcher's environment, as in the reference"),
        "accepted for old launchers; ignored",
    ),
]
