"""Registry entries: run length, learning rate, optimizer, stability, precision, checkpointing of
activations, compilation and the other optimisation switches (R1.1)."""

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
)

# ------------------------------------------------------------------ output and run length


def _output_dir(field: str, value: Any, ctx: Context) -> Decision:
    return honoured(
        "facade: outputs, checkpoints and logs go here; Lightning default_root_dir",
        lightning={"default_root_dir": value},
    )


def _num_train_epochs(field: str, value: Any, ctx: Context) -> Decision:
    if (ctx.get("max_steps") or -1) > 0:
        return not_applicable("max_steps > 0 sets the run length instead (as in the reference)")
    return honoured(
        "schedule.py: max_steps = ceil(num_train_epochs * updates per epoch) at train start; "
        "Lightning gets max_epochs = ceil(num_train_epochs) and max_steps = that update count"
    )


def _max_steps(field: str, value: Any, ctx: Context) -> Decision:
    if value is not None and value > 0:
        return honoured(
            "facade: Lightning max_steps set to this value at train start (one step = one update)"
        )
    return honoured(
        "facade: resolved from num_train_epochs at train start and given to Lightning's max_steps"
    )


# ------------------------------------------------------------------ scheduler

_METRIC_DRIVEN_SCHEDULES = ("reduce_lr_on_plateau", "greedy")


def _lr_scheduler_type(field: str, value: Any, ctx: Context) -> Decision:
    if value in _METRIC_DRIVEN_SCHEDULES:
        return honoured("schedulers.py: stepped with metric_for_best_model after each evaluation")
    return honoured(
        "schedulers.py: stepped by the LightningModule after each optimizer update "
        "(not after an fp16 step the scaler skipped)"
    )


def _lr_scheduler_kwargs(field: str, value: Any, ctx: Context) -> Decision:
    if not value:
        return honoured("no extra schedule arguments")
    return honoured("schedulers.py: passed to the schedule factory (unknown keys raise there)")


# ------------------------------------------------------------------ optimizer

_TARGET_MODULE_OPTIMIZERS = ("galore", "apollo")


def _optim_target_modules(field: str, value: Any, ctx: Context) -> Decision:
    optim = str(ctx.get("optim"))
    uses_targets = optim.startswith(_TARGET_MODULE_OPTIMIZERS)
    if uses_targets:
        return honoured("optim/extras.py: selects the modules GaLore / APOLLO project")
    return not_applicable(
        f"only GaLore / APOLLO optimizers read it; optim={optim!r} does not (as in the reference)"
    )


def _optim_args(field: str, value: Any, ctx: Context) -> Decision:
    if not value:
        return honoured("no extra optimizer options")
    return honoured("optim/optimizers.py: parsed as 'k=v,...'; each optimizer converts the keys it knows")


# ------------------------------------------------------------------ stability


def _gradient_accumulation_steps(field: str, value: Any, ctx: Context) -> Decision:
    accelerate_options = config_as_dict(ctx.get("accelerator_config")) or {}
    num_steps = (accelerate_options.get("gradient_accumulation_kwargs") or {}).get("num_steps")
    steps, source = value, ""
    if num_steps is not None and value == 1:
        # T9: with GA == 1 the reference accumulates over accelerator_config's num_steps instead.
        steps, source = num_steps, f" (accelerator_config gradient_accumulation_kwargs num_steps={num_steps})"
    return honoured(
        f"HFLightningModule: one training_step pulls a window of {steps} micro-batch(es) and makes one "
        f"update{source} (Lightning accumulate_grad_batches=1)",
        module={"gradient_accumulation_steps": steps},
    )


def _average_tokens_across_devices(field: str, value: Any, ctx: Context) -> Decision:
    settings = {"average_tokens_across_devices": bool(value)}
    if ctx.env.world_size > 1:
        return honoured(
            "loss.py: num_items_in_batch summed over processes and the loss multiplied by the world size"
            if value
            else "loss.py: num_items_in_batch counted per process",
            module=settings,
        )
    return not_applicable("one process: nothing to average across", module=settings)


def _max_grad_norm(field: str, value: Any, ctx: Context) -> Decision:
    how = (
        f"HFLightningModule: gradients clipped to total norm {value}; the pre-clip norm is logged"
        if value is not None and value > 0
        else "HFLightningModule: no clipping; the gradient norm is still computed and logged"
    )
    return honoured(how, module={"max_grad_norm": value})


def _label_smoothing_factor(field: str, value: Any, ctx: Context) -> Decision:
    how = "loss.py: label smoother with this epsilon" if value else "no label smoothing"
    return honoured(how, module={"label_smoothing_factor": value})


# ------------------------------------------------------------------ precision


def mixed_precision(ctx: Context) -> str:
    """The reference's `mixed_precision`: fp16 / bf16 flags, else env ACCELERATE_MIXED_PRECISION
    (kept by the arguments as `args.mixed_precision`)."""
    if ctx.get("fp16"):
        return "fp16"
    if ctx.get("bf16"):
        return "bf16"
    from_env = ctx.get("mixed_precision", "no")
    return from_env if from_env in ("fp16", "bf16") else "no"


def _bf16(field: str, value: Any, ctx: Context) -> Decision:
    if value and ctx.get("fp16"):
        return refused("fp16 and bf16 are both set; choose one")
    if mixed_precision(ctx) != "bf16":
        return honoured("no bf16 autocast")
    return honoured(
        "bf16 autocast around the model's forward only, outputs cast to float32 (R7.6); Lightning runs "
        "'32-true' since its 'bf16-mixed' would autocast the whole step (precision.py)",
        lightning={"precision": "bf16-mixed"},
        module={"forward_autocast": "bf16"},
    )


def _fp16(field: str, value: Any, ctx: Context) -> Decision:
    if mixed_precision(ctx) != "fp16":
        return honoured("no fp16 autocast")
    if ctx.accelerator == "cpu":
        # accelerate turns native AMP off for fp16 on CPU, so the reference trains in float32;
        # Lightning would silently substitute bf16, which would change the numbers.
        return honoured(
            "Lightning precision='32-true': the reference runs fp16 on CPU without autocast or scaler "
            "(accelerate disables fp16 AMP on CPU)",
            lightning={"precision": "32-true"},
        )
    return honoured(
        "fp16 autocast around the model's forward only (R7.6); Lightning's 16-mixed plugin keeps the "
        "gradient scaler without its step-wide autocast; the LR schedule does not step when the scaler "
        "skips an update (precision.py)",
        lightning={"precision": "16-mixed"},
        module={"forward_autocast": "fp16"},
    )


def _full_eval(field: str, value: Any, ctx: Context) -> Decision:
    if value:
        return honoured("facade: evaluate()/predict() outside training cast the model in place")
    return honoured("evaluation runs in the training dtype")


def _tf32(field: str, value: Any, ctx: Context) -> Decision:
    if value is None:
        return honoured("TF32 mode left as it is")
    if value and ctx.accelerator != "gpu":
        return refused("TF32 needs an Ampere or newer CUDA GPU; none is in use. Leave tf32=None")
    state = "on" if value else "off"
    # The arguments switch the mode when they are built (as the reference's do); nothing is left to plan.
    return honoured(f"facade: TF32 matmul mode switched {state} when the trainer is built")


# ------------------------------------------------------------------ activation checkpointing


def _activation_checkpointing(field: str, value: Any, ctx: Context) -> Decision:
    if not value:
        return honoured("off", module={"activation_checkpointing": False})
    return honoured(
        "facade: model.activation_checkpointing_enable(...) (or gradient_checkpointing_enable) at train()",
        module={"activation_checkpointing": True},
    )


def _activation_checkpointing_kwargs(field: str, value: Any, ctx: Context) -> Decision:
    if not ctx.get("activation_checkpointing"):
        return not_applicable("activation_checkpointing is off")
    return honoured(
        "facade: every_n_layers / offload and the rest passed to the enable call",
        module={"activation_checkpointing_kwargs": value},
    )


def _gradient_checkpointing_alias(field: str, value: Any, ctx: Context) -> Decision:
    return honoured("deprecated alias: TrainingArguments mirrors it into activation_checkpointing*")


# ------------------------------------------------------------------ compilation and kernels


def _torch_compile(field: str, value: Any, ctx: Context) -> Decision:
    if not value:
        return honoured("no compilation", module={"torch_compile": False})
    return honoured(
        "facade: torch.compile(model, backend, mode) when the model is prepared",
        module={
            "torch_compile": True,
            "torch_compile_backend": ctx.get("torch_compile_backend"),
            "torch_compile_mode": ctx.get("torch_compile_mode"),
        },
    )


def _compile_option(field: str, value: Any, ctx: Context) -> Decision:
    if not ctx.get("torch_compile"):
        return not_applicable("torch_compile is off")
    return honoured("facade: passed to torch.compile")


def _use_liger_kernel(field: str, value: Any, ctx: Context) -> Decision:
    if not value:
        return honoured("off")
    if "liger_kernel" not in ctx.env.installed_packages:
        return refused(
            "the liger_kernel package is not installed: pip install liger-kernel, or set use_liger_kernel=False"
        )
    return honoured("facade: the model is patched with Liger kernels at train() (liger_kernel_config)")


def _liger_kernel_config(field: str, value: Any, ctx: Context) -> Decision:
    if not ctx.get("use_liger_kernel"):
        return not_applicable("use_liger_kernel is off")
    return honoured("facade: keyword arguments of the Liger patch")


# ------------------------------------------------------------------ miscellaneous optimisations


def _neftune_noise_alpha(field: str, value: Any, ctx: Context) -> Decision:
    if value is None:
        return honoured("no NEFTune noise")
    return honoured(
        "facade: NEFTune noise hook on the input embeddings during training",
        module={"neftune_noise_alpha": value},
    )


def _torch_empty_cache_steps(field: str, value: Any, ctx: Context) -> Decision:
    if value is None:
        return honoured(
            "the device cache is never emptied", module={"torch_empty_cache_steps": None}
        )
    return honoured(
        "HFLightningModule: empties the device cache in micro-steps taken while global_step % n == 0",
        module={"torch_empty_cache_steps": value},
    )


def _auto_find_batch_size(field: str, value: Any, ctx: Context) -> Decision:
    if not value:
        return honoured("off: an out-of-memory error propagates")
    return honoured(
        "facade: on out-of-memory the per-device batch shrinks and training restarts, as the reference does"
    )


ENTRIES: list[FieldEntry] = [
    FieldEntry("output_dir", None, _output_dir, "where outputs go; Lightning `default_root_dir`"),
    FieldEntry(
        "per_device_train_batch_size",
        8,
        always("data/dataloaders.py: batch size of each process's train dataloader"),
        "train dataloader batch size",
    ),
    FieldEntry(
        "num_train_epochs",
        3.0,
        _num_train_epochs,
        "resolved into the update count at train start (fractional epochs supported)",
    ),
    FieldEntry("max_steps", -1, _max_steps, "Lightning `max_steps`, counted in optimizer updates"),
    FieldEntry(
        "learning_rate",
        5e-5,
        always("optim/optimizers.py: lr of every parameter group (peak of the schedule)"),
        "optimizer learning rate",
    ),
    FieldEntry(
        "lr_scheduler_type",
        "linear",
        _lr_scheduler_type,
        "every schedule, stepped per update by the module; `reduce_lr_on_plateau` / `greedy` are stepped "
        "with the evaluation metric after each evaluation",
    ),
    FieldEntry("lr_scheduler_kwargs", None, _lr_scheduler_kwargs, "passed to the schedule factory"),
    FieldEntry(
        "warmup_steps",
        0,
        always("schedulers.py: steps if >= 1, else ratio of max_steps rounded up (R1.9)"),
        "warmup steps or ratio",
    ),
    FieldEntry(
        "optim",
        "adamw_torch_fused",
        always(
            "optim/optimizers.py: optimizer class and kwargs built at train start (missing optional packages raise there, as in the reference)"
        ),
        "optimizer name; `adamw_torch` on torch < 2.8",
    ),
    FieldEntry("optim_args", None, _optim_args, "extra optimizer options `k=v,...`"),
    FieldEntry(
        "weight_decay",
        0.0,
        always("optim/optimizers.py: decay parameter group only (R5.2)"),
        "weight decay of the decay group",
    ),
    FieldEntry(
        "adam_beta1",
        0.9,
        always("optim/optimizers.py: Adam-family optimizers (others ignore it, as in the reference)"),
        "Adam beta1",
    ),
    FieldEntry(
        "adam_beta2",
        0.999,
        always("optim/optimizers.py: Adam-family optimizers (others ignore it, as in the reference)"),
        "Adam beta2",
    ),
    FieldEntry(
        "adam_epsilon",
        1e-8,
        always("optim/optimizers.py: Adam-family optimizers (others ignore it, as in the reference)"),
        "Adam epsilon",
    ),
    FieldEntry("optim_target_modules", None, _optim_target_modules, "GaLore / APOLLO target modules"),
    FieldEntry(
        "gradient_accumulation_steps",
        1,
        _gradient_accumulation_steps,
        "done by the LightningModule (manual optimization), not Lightning's `accumulate_grad_batches`",
    ),
    FieldEntry(
        "average_tokens_across_devices",
        True,
        _average_tokens_across_devices,
        "token count summed over processes",
    ),
    FieldEntry("max_grad_norm", 1.0, _max_grad_norm, "clipping by the LightningModule; pre-clip norm logged"),
    FieldEntry("label_smoothing_factor", 0.0, _label_smoothing_factor, "built-in label smoother"),
    FieldEntry("bf16", False, _bf16, "Lightning `precision='bf16-mixed'`"),
    FieldEntry(
        "fp16", False, _fp16, "Lightning `precision='16-mixed'` on GPU; `'32-true'` on CPU, as the reference"
    ),
    FieldEntry(
        "bf16_full_eval", False, _full_eval, "bf16 evaluation outside training", carries=("evaluation", "bf16_full_eval")
    ),
    FieldEntry(
        "fp16_full_eval", False, _full_eval, "fp16 evaluation outside training", carries=("evaluation", "fp16_full_eval")
    ),
    FieldEntry("tf32", None, _tf32, "TF32 matmul mode (refused without a CUDA GPU)"),
    FieldEntry(
        "activation_checkpointing",
        None,
        _activation_checkpointing,
        "model's checkpointing enabled at `train()`",
    ),
    FieldEntry(
        "activation_checkpointing_kwargs",
        None,
        _activation_checkpointing_kwargs,
        "arguments of the enable call",
    ),
    FieldEntry(
        "gradient_checkpointing",
        None,
        _gradient_checkpointing_alias,
        "deprecated alias of `activation_checkpointing`",
    ),
    FieldEntry(
        "gradient_checkpointing_kwargs",
        None,
        _gradient_checkpointing_alias,
        "deprecated alias of `activation_checkpointing_kwargs`",
    ),
    FieldEntry("torch_compile", False, _torch_compile, "`torch.compile` of the model"),
    FieldEntry("torch_compile_backend", None, _compile_option, "compile backend"),
    FieldEntry("torch_compile_mode", None, _compile_option, "compile mode"),
    FieldEntry(
        "use_liger_kernel",
        False,
        _use_liger_kernel,
        "Liger kernels (refused when `liger_kernel` is not installed)",
    ),
    FieldEntry("liger_kernel_config", None, _liger_kernel_config, "Liger patch options"),
    FieldEntry(
        "use_cache",
        False,
        always("facade: written into model.config.use_cache when the trainer is built"),
        "`model.config.use_cache`",
    ),
    FieldEntry("neftune_noise_alpha", None, _neftune_noise_alpha, "NEFTune embedding noise"),
    FieldEntry("torch_empty_cache_steps", None, _torch_empty_cache_steps, "periodic device cache emptying"),
    FieldEntry("auto_find_batch_size", False, _auto_find_batch_size, "batch size shrinks on out-of-memory"),
]
