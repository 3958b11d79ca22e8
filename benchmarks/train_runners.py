"""The training runners: a hand-written loop, transformers.Trainer, bare Lightning and hf_lightning (with its
telemetry on, the default, and off).

Each runner imports its framework itself (so the start-up it reports is its own), trains the workload
with the reference's default recipe (AdamW, linear schedule, clipping at 1.0, zero_grad after each
update), ticks the StepClock at the end of every optimizer step and returns the probe loss.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.timing import StepClock
from benchmarks.workloads import (
    EpochSeededSampler,
    Workload,
    epochs_needed,
    probe_loss,
    stack_collate,
    window_item_counts,
)

ADAM_KWARGS = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
MAX_GRAD_NORM = 1.0


def linear_schedule(optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The reference's `linear` schedule with no warm-up: lr * (T - step) / T."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: max(0.0, float(total_steps - step) / float(max(1, total_steps)))
    )


# Parameter names the reference keeps out of weight decay (biases and norms), matched on the lower-cased full name.
_NO_DECAY_NAME = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")


def reference_parameter_groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    """The reference's two optimizer groups: weight decay on every trainable weight outside a `LayerNorm` whose name
    names no bias or norm, none on the rest. Both exist with `weight_decay=0.0` too, so each step updates two groups."""
    norm_modules = [name for name, module in model.named_modules() if isinstance(module, torch.nn.LayerNorm)]

    def decays(name: str) -> bool:
        in_norm = any(name.startswith(f"{module}.") for module in norm_modules)
        return not in_norm and _NO_DECAY_NAME.search(name.lower()) is None

    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for name, p in trainable if decays(name)], "weight_decay": ADAM_KWARGS["weight_decay"]},
        {"params": [p for name, p in trainable if not decays(name)], "weight_decay": 0.0},
    ]


def reference_optimizer(model: torch.nn.Module, learning_rate: float) -> torch.optim.Optimizer:
    """The reference's default optimizer on torch >= 2.8: `adamw_torch_fused` over its two parameter groups."""
    return torch.optim.AdamW(reference_parameter_groups(model), lr=learning_rate, fused=True, **ADAM_KWARGS)


def training_loader(workload: Workload, dataset, sampler: EpochSeededSampler) -> torch.utils.data.DataLoader:
    """The hand-built runners' DataLoader: the workload's batch size, the shared sampler, stacked examples."""
    return torch.utils.data.DataLoader(
        dataset, batch_size=workload.batch_size, sampler=sampler, collate_fn=stack_collate
    )


def _window_count(workload: Workload, window: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    labels = [b["labels"][..., 1:] if workload.shifts_labels else b["labels"] for b in window]
    return sum(label.ne(-100).sum() for label in labels)


# ---- hand-written loop -----------------------------------------------------------------------------------
def train_by_hand(workload: Workload, clock: StepClock) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    """What the reference does by default, written out: window, count items, forward/backward, clip, step."""
    model = workload.seeded_model()
    model.train()
    dataset = workload.train_dataset()
    sampler = EpochSeededSampler(len(dataset))
    loader = training_loader(workload, dataset, sampler)
    optimizer = reference_optimizer(model, workload.learning_rate)
    scheduler = linear_schedule(optimizer, workload.max_steps)
    step = 0
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        batches = iter(loader)
        while step < workload.max_steps:
            window = list(itertools.islice(batches, workload.grad_accum))
            if not window:
                break
            num_items = _window_count(workload, window) if workload.passes_num_items else None
            for batch in window:
                if num_items is not None:
                    loss = model(**batch, num_items_in_batch=num_items)["loss"]
                else:
                    loss = model(**batch)["loss"] / len(window)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            scheduler.step()
            model.zero_grad()
            step += 1
            clock.tick()
        if step >= workload.max_steps:
            break
    return model, optimizer, scheduler


def run_hand(workload: Workload, clock: StepClock, output_dir: str) -> dict[str, Any]:
    """The hand-written loop (the baseline of the `cls` and `clm` targets)."""
    clock.imports_done()
    model, _, _ = train_by_hand(workload, clock)
    return {"final_loss": probe_loss(model, workload)}


# ---- transformers.Trainer and hf_lightning ---------------------------------------------------------------
def _run_hf_style(
    workload: Workload,
    clock: StepClock,
    output_dir: str,
    trainer_cls: type,
    args_cls: type,
    callback_base: type,
    **trainer_kwargs: Any,
) -> dict[str, Any]:
    class StepEnd(callback_base):
        def on_step_end(self, args, state, control, **kwargs):
            clock.tick()

    model = workload.seeded_model()
    args = args_cls(**workload.trainer_args(output_dir))
    trainer = trainer_cls(
        model=model, args=args, train_dataset=workload.train_dataset(), callbacks=[StepEnd()], **trainer_kwargs
    )
    output = trainer.train()
    return {"final_loss": probe_loss(trainer.model, workload), "train_loss": output.training_loss}


def run_transformers(workload: Workload, clock: StepClock, output_dir: str) -> dict[str, Any]:
    """transformers.Trainer with the workload's arguments."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    clock.imports_done()
    return _run_hf_style(workload, clock, output_dir, Trainer, TrainingArguments, TrainerCallback)


def run_hf_lightning(workload: Workload, clock: StepClock, output_dir: str) -> dict[str, Any]:
    """hf_lightning with the very same arguments as the transformers run."""
    from hf_lightning import Trainer, TrainerCallback, TrainingArguments

    clock.imports_done()
    return _run_hf_style(workload, clock, output_dir, Trainer, TrainingArguments, TrainerCallback)


def run_hf_lightning_telemetry_off(workload: Workload, clock: StepClock, output_dir: str) -> dict[str, Any]:
    """hf_lightning as `run_hf_lightning`, its telemetry switched off (`telemetry=False`): the pair prices the
    telemetry (README, "Telemetry")."""
    from hf_lightning import Trainer, TrainerCallback, TrainingArguments

    clock.imports_done()
    return _run_hf_style(workload, clock, output_dir, Trainer, TrainingArguments, TrainerCallback, telemetry=False)


# ---- bare Lightning --------------------------------------------------------------------------------------
def bare_lightning_options(output_dir: str) -> dict[str, Any]:
    """`lightning.pytorch.Trainer` options for a bare run on one CPU: no logger, checkpoint, progress bar,
    summary or validation, epochs unbounded (the runner stops it), so only the training loop is timed."""
    return {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": -1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "limit_val_batches": 0,
        "default_root_dir": output_dir,
    }


def run_lightning(workload: Workload, clock: StepClock, output_dir: str) -> dict[str, Any]:
    """A plain LightningModule with automatic optimization: same model, optimizer, schedule and clipping."""
    import lightning.pytorch as pl

    clock.imports_done()

    class StepEnd(pl.Callback):
        def __init__(self) -> None:
            self.last_global_step = 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.global_step != self.last_global_step:  # an optimizer step happened
                self.last_global_step = trainer.global_step
                clock.tick()

    class BareModule(pl.LightningModule):
        def __init__(self, model: torch.nn.Module, window_counts: list | None):
            super().__init__()
            self.model = model
            self.window_counts = window_counts

        def training_step(self, batch, batch_idx):
            if self.window_counts is None:
                return self.model(**batch)["loss"]
            # The reference normalises by the window's label count; Lightning divides every micro-batch
            # loss by `accumulate_grad_batches`, so multiply it back to get the same gradient.
            num_items = self.window_counts[self.current_epoch][batch_idx // workload.grad_accum]
            return self.model(**batch, num_items_in_batch=num_items)["loss"] * workload.grad_accum

        def configure_optimizers(self):
            optimizer = reference_optimizer(self.model, workload.learning_rate)
            scheduler = linear_schedule(optimizer, workload.max_steps)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    dataset = workload.train_dataset()
    counts = None
    if workload.passes_num_items:
        counts = window_item_counts(
            dataset, workload.batch_size, workload.grad_accum, epochs_needed(workload), workload.shifts_labels
        )
    module = BareModule(workload.seeded_model(), counts)
    trainer = pl.Trainer(
        max_steps=workload.max_steps,
        accumulate_grad_batches=workload.grad_accum,
        gradient_clip_val=MAX_GRAD_NORM,
        callbacks=[StepEnd()],
        **bare_lightning_options(output_dir),
    )
    trainer.fit(module, train_dataloaders=training_loader(workload, dataset, EpochSeededSampler(len(dataset))))
    return {"final_loss": probe_loss(module.model, workload)}


TRAIN_RUNNERS: dict[str, Callable[[Workload, StepClock, str], dict[str, Any]]] = {
    "hand": run_hand,
    "transformers": run_transformers,
    "lightning": run_lightning,
    "hf_lightning": run_hf_lightning,
    "hf_lightning_telemetry_off": run_hf_lightning_telemetry_off,
}
