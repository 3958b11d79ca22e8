"""`LightningAccelerator`: what `trainer.accelerator` is, accelerate's public names with their meanings.

A `Trainer` subclass (TRL's trainers, a project's own) calls `self.accelerator.gather_for_metrics(...)`,
`.num_processes`, `.unwrap_model(...)`, ... The object exists from the trainer's construction. Process facts come
from the launcher's variables until a run exists and from its Lightning strategy afterwards; collectives go through
`collectives.py`. What accelerate does that Lightning's engine does itself (preparing the training model, the
optimizer and the scheduler, accumulation, trackers, checkpoint state) raises an error naming what to use instead.
Where the meaning differs from accelerate's, docs/divergences.md says so.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from hf_lightning.core.autocast import convert_outputs_to_fp32
from hf_lightning.core.devices import empty_device_cache
from hf_lightning.engine.accelerator import collectives
from hf_lightning.engine.accelerator import state as run_state
from hf_lightning.engine.accelerator.ports import AcceleratorOwner
from hf_lightning.engine.accelerator.process_control import ProcessControlMixin
from hf_lightning.engine.accelerator.state import (
    AcceleratorStateView,
    DataLoaderConfigView,
    DistributedType,
    GradientStateView,
)
from hf_lightning.strategies.fsdp.policies import gradient_sync_disabled
from hf_lightning.strategies.steps import clip_scaled_grad_norm
from hf_lightning.translation.parallelism import parallelism_sizes

_NO_COMPOSABLE_PARALLELISM = (
    "context / pipeline parallelism and accelerate's Ulysses adapter are not supported (parallelism_config takes "
    "dp_shard_size and tp_size); use process_index / num_processes, tensor_parallel_rank, data_parallel_shard_rank"
)
# accelerate's names that Lightning's engine carries out itself: what to use instead.
_OWNED_BY_THE_ENGINE = {
    "accumulate": "set TrainingArguments.gradient_accumulation_steps; the run accumulates and syncs the window",
    "prepare_optimizer": "pass the optimizer through Trainer(optimizers=...) or override create_optimizer(); "
    "Lightning's strategy sets it up in train()",
    "prepare_scheduler": "pass the scheduler through Trainer(optimizers=...) or override create_scheduler()",
    "save_state": "use save_strategy / trainer.save_model(); train(resume_from_checkpoint=...) restores a run",
    "load_state": "use train(resume_from_checkpoint=...)",
    "save_model": "use trainer.save_model(output_dir)",
    "register_for_checkpointing": "make the object a TrainerCallback with state() (ExportableState); "
    "checkpoints keep it",
    "skip_first_batches": "train(resume_from_checkpoint=...) skips the batches already seen",
    "init_trackers": "set TrainingArguments.report_to (Lightning loggers)",
    "log": "call trainer.log(logs); report_to chooses the Lightning loggers",
    "end_training": "the trainer closes its loggers when train() ends",
    "get_tracker": "use trainer.lightning_trainer.loggers",
    "join_uneven_inputs": "keep accelerator_config.even_batches=True (every process gets the same batch count)",
    "set_trigger": "set control.should_training_stop in a TrainerCallback",
    "check_trigger": "set control.should_training_stop in a TrainerCallback",
    "profile": "pass a Lightning profiler through trainer.lightning_trainer_overrides['profiler']",
    "unscale_gradients": "the run unscales fp16 gradients before clipping (max_grad_norm)",
    "lomo_backward": "use optim='lomo' / 'adalomo' in TrainingArguments; the run calls the optimizer's backward",
    "trigger_sync_in_backward": "the run all-reduces on the last micro-batch of each window (sync_each_batch: "
    "every micro-batch)",
    "register_save_state_pre_hook": "override save_model() or add a TrainerCallback's on_save",
    "register_load_state_pre_hook": "add a TrainerCallback with state() (ExportableState)",
    "maybe_context_parallel": "context parallelism is not supported; leave parallelism_config unset",
    "project_dir": "read TrainingArguments.output_dir",
    "logging_dir": "read TrainingArguments.logging_dir",
    "save_iteration": "read trainer.state.global_step",
    "context_parallel_rank": _NO_COMPOSABLE_PARALLELISM,
    "pipeline_parallel_rank": _NO_COMPOSABLE_PARALLELISM,
    "deepspeed_ulysses_dl_adapter": _NO_COMPOSABLE_PARALLELISM,
    "fp8_backend": "fp8 training is not supported; use bf16=True or fp16=True",
    "optimizer_step_was_skipped": "read trainer.state.global_step: a skipped fp16 step still counts as in the "
    "reference",
}


class LightningAccelerator(ProcessControlMixin):
    """accelerate's `Accelerator` surface for one trainer, carried out by its Lightning run (not accelerate)."""

    def __init__(self, trainer: AcceleratorOwner):
        self._trainer = trainer
        self.state = AcceleratorStateView(trainer)
        self.gradient_state = GradientStateView(trainer)
        self.dataloader_config = DataLoaderConfigView(trainer)

    # ---- process facts ---------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """The device this process computes on."""
        return self.state.device

    @property
    def num_processes(self) -> int:
        """Processes of the run (the launcher's until `train()`, then the Lightning strategy's world size)."""
        return self.state.num_processes

    @property
    def process_index(self) -> int:
        """This process's global rank."""
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        """This process's rank on its node."""
        return self.state.local_process_index

    @property
    def is_main_process(self) -> bool:
        """Whether this is the global main process."""
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        """Whether this is the main process of its node."""
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        """Whether this is the process with the highest rank."""
        return self.state.is_last_process

    @property
    def distributed_type(self) -> DistributedType:
        """accelerate's kind of run (NO, MULTI_CPU, MULTI_GPU, DEEPSPEED, FSDP)."""
        return self.state.distributed_type

    @property
    def mixed_precision(self) -> str:
        """The mixed precision, "bf16", "fp16" or "no"."""
        return self.state.mixed_precision

    @property
    def use_distributed(self) -> bool:
        """Whether the run has several processes."""
        return self.state.use_distributed

    @property
    def parallelism_config(self) -> Any:
        """The arguments' `parallelism_config` (None: plain data parallelism over every process)."""
        return self.state.parallelism_config

    @property
    def sync_gradients(self) -> bool:
        """Whether the current micro-batch closes its accumulation window."""
        return self.gradient_state.sync_gradients

    @property
    def gradient_accumulation_steps(self) -> int:
        """1: the trainer accumulates (as the reference's accelerator is configured), not the accelerator."""
        return self.gradient_state.num_steps

    @property
    def split_batches(self) -> bool:
        """accelerator_config's `split_batches`."""
        return self.dataloader_config.split_batches

    @property
    def dispatch_batches(self) -> bool | None:
        """accelerator_config's `dispatch_batches`."""
        return self.dataloader_config.dispatch_batches

    @property
    def even_batches(self) -> bool:
        """accelerator_config's `even_batches`, or the value last set here."""
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        # As accelerate's setter: the dataloaders prepared from now on (the trainer's own included) deal their last
        # round by this value; sentence-transformers sets it before preparing its train and eval loaders.
        self.dataloader_config.even_batches = value

    @property
    def use_seedable_sampler(self) -> bool:
        """accelerator_config's `use_seedable_sampler`."""
        return self.dataloader_config.use_seedable_sampler

    @property
    def non_blocking(self) -> bool:
        """accelerator_config's `non_blocking`."""
        return self.dataloader_config.non_blocking

    @property
    def multi_device(self) -> bool:
        """Whether the run spans several accelerator devices (not CPU processes), as accelerate defines it."""
        return self.use_distributed and self.distributed_type == DistributedType.MULTI_GPU

    @property
    def should_save_model(self) -> bool:
        """Whether this process writes model files (each node's main process, without parallelism_config)."""
        return self.is_local_main_process

    @property
    def use_stateful_dataloader(self) -> bool:
        """False: a resumed run skips the batches already seen (resume_from_checkpoint)."""
        return False

    @property
    def torch_device_mesh(self) -> Any:
        """The device mesh of Lightning's ModelParallelStrategy once `train()` set it up (dimensions
        `data_parallel` x `tensor_parallel`, not accelerate's names); None otherwise."""
        lightning_trainer = self._trainer.lightning_trainer
        strategy = None if lightning_trainer is None else lightning_trainer.strategy
        return getattr(strategy, "_device_mesh", None)

    # ---- parallelism_config ranks (accelerate's meanings) ------------------------------------------------
    def _parallel_sizes(self, rank_name: str) -> dict[str, int]:
        """parallelism_config's sizes; without one accelerate raises RuntimeError, and so do we."""
        sizes = parallelism_sizes(self.parallelism_config)
        if sizes is None:
            raise RuntimeError(f"accelerator.{rank_name}: parallelism is not configured. Set `parallelism_config` first.")
        return sizes

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's rank within its tensor-parallel group (0 when tp_size is 1)."""
        tp_size = self._parallel_sizes("tensor_parallel_rank")["tp_size"]
        return self.process_index % tp_size  # the mesh's tensor_parallel dimension is the inner one

    @property
    def data_parallel_shard_rank(self) -> int:
        """This process's rank along the sharded data-parallel dimension (0 when dp_shard_size is 1)."""
        sizes = self._parallel_sizes("data_parallel_shard_rank")
        return self.process_index // sizes["tp_size"] if sizes["dp_shard_size"] > 1 else 0

    @property
    def data_parallel_rank(self) -> int:
        """This process's replica rank (always 0: dp_replicate_size > 1 is refused before training)."""
        self._parallel_sizes("data_parallel_rank")
        return 0

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        """Whether the run shards with FSDP2, as accelerate defines it."""
        return self.is_fsdp2

    @property
    def is_fsdp2(self) -> bool:
        """Whether the run shards with FSDP2 (`fully_shard`)."""
        strategy = self._trainer.plan.strategy
        return strategy is not None and strategy.name == "fsdp2"

    # ---- collectives -------------------------------------------------------------------------------------
    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point."""
        collectives.barrier(self._trainer)

    def gather(self, tensor: Any) -> Any:
        """Every process's tensors concatenated on dim 0, in rank order."""
        return collectives.gather(self._trainer, tensor)

    def gather_object(self, obj: Any) -> list[Any]:
        """Every process's list of picklable objects, flattened in rank order."""
        return collectives.gather_object(self._trainer, obj)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """`gather` (or `gather_object` for non-tensors), the last batch cut to its real samples as accelerate does."""
        try:
            collectives.apply_to_tensors(lambda tensor: tensor, input_data, "gather_for_metrics")
            all_tensors = True
        except TypeError:
            all_tensors = False
        use_gather_object = use_gather_object or not all_tensors
        data = self.gather_object(input_data) if use_gather_object else self.gather(input_data)
        gradient_state = self.gradient_state
        remainder = gradient_state.remainder
        if not gradient_state.end_of_dataloader or remainder <= 0:
            return data
        try:
            if use_gather_object:
                return data[:remainder]
            return collectives.apply_to_tensors(lambda tensor: tensor[:remainder], data, "gather_for_metrics")
        except Exception:
            return data  # as accelerate: data that cannot be cut is returned whole

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """A copy of `tensor` reduced across processes ("sum", "mean" or "max")."""
        return collectives.reduce(self._trainer, tensor, reduction=reduction, scale=scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> Any:
        """Pad every tensor on `dim` to the largest size of any process."""
        return collectives.pad_across_processes(
            self._trainer, tensor, dim=dim, pad_index=pad_index, pad_first=pad_first
        )

    def broadcast(self, tensor: Any, from_process: int = 0) -> Any:
        """Overwrite every tensor in place with process `from_process`'s, and return it."""
        return collectives.broadcast(self._trainer, tensor, from_process=from_process)

    def broadcast_object_list(self, object_list: list[Any], from_process: int = 0) -> list[Any]:
        """Fill a list of picklable objects in place with process `from_process`'s."""
        return collectives.broadcast_object_list(self._trainer, object_list, from_process=from_process)

    # ---- models --------------------------------------------------------------------------------------------
    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True):
        """The user's module inside DDP / DeepSpeed / `torch.compile` wrappers (FSDP modules are returned as is)."""
        compiled = None
        if _is_compiled(model):
            compiled, model = model, model._orig_mod
        while isinstance(
            model, (nn.parallel.DistributedDataParallel, nn.DataParallel)
        ) or _is_deepspeed_engine(model):
            model = model.module
        if not keep_fp32_wrapper and "_original_forward" in model.__dict__:
            _restore_forward(model)
        if compiled is not None and keep_torch_compile:
            return compiled
        return model

    def prepare_model(
        self, model: nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ):
        """A frozen model (`evaluation_mode=True`, e.g. a reference model) on the device with the run's autocast.

        The model being trained is prepared by the run's Lightning strategy in `train()`; `evaluation_mode=False`
        raises a ValueError that says so.
        """
        if not evaluation_mode:
            raise ValueError(
                "accelerator.prepare_model(model) for training: under Lightning the run's strategy wraps the trained "
                "model (DDP / FSDP / DeepSpeed) in train(); pass it as Trainer(model=...). For a frozen model used "
                "alongside it (a reference or teacher model), call prepare_model(model, evaluation_mode=True)."
            )
        if getattr(model, "_is_accelerate_prepared", False):
            return model
        if device_placement is None:
            device_placement = getattr(model, "hf_device_map", None) is None
        if device_placement:
            model.to(self.device)
        dtype = run_state.autocast_dtype(self._trainer)
        if dtype is not None:
            _wrap_forward_in_autocast(model, self.device.type, dtype)
        model._is_accelerate_prepared = True
        return model

    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Frozen models through `prepare_model(evaluation_mode=True)`, DataLoaders sharded across processes with
        batches on the device (engine/accelerator/dataloader.py); other objects are returned unchanged.

        A trainable model, an optimizer or a scheduler raise a ValueError: the trainer's Lightning run sets those up.
        """
        placements = device_placement if device_placement is not None else [None] * len(args)
        prepared = tuple(self._prepare_one(obj, placement) for obj, placement in zip(args, placements))
        return prepared[0] if len(prepared) == 1 else prepared

    def _prepare_one(self, obj: Any, device_placement: bool | None) -> Any:
        if isinstance(obj, nn.Module):
            if obj.training and any(p.requires_grad for p in obj.parameters()):
                raise ValueError(
                    "accelerator.prepare(model) with a trainable model: under Lightning the run's strategy wraps "
                    "the trained model in train(); pass it as Trainer(model=...). For a frozen model, call "
                    "model.eval() (or prepare_model(model, evaluation_mode=True))."
                )
            return self.prepare_model(obj, device_placement=device_placement, evaluation_mode=True)
        if isinstance(obj, torch.optim.Optimizer):
            raise ValueError(f"accelerator.prepare(optimizer): {_OWNED_BY_THE_ENGINE['prepare_optimizer']}.")
        if isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
            raise ValueError(f"accelerator.prepare(scheduler): {_OWNED_BY_THE_ENGINE['prepare_scheduler']}.")
        if isinstance(obj, torch.utils.data.DataLoader):
            return self.prepare_data_loader(obj, device_placement=device_placement)
        return obj

    def prepare_data_loader(
        self, data_loader: torch.utils.data.DataLoader, device_placement: bool | None = None
    ):
        """This process's share of `data_loader`, batches on the device (see `prepare`)."""
        # lazy: loads Lightning only when a subclass prepares a dataloader itself
        from hf_lightning.engine.accelerator.dataloader import PreparedDataLoader

        return PreparedDataLoader(self._trainer, data_loader, device_placement=device_placement is not False)

    @contextlib.contextmanager
    def autocast(self, autocast_handler: Any = None) -> Iterator[None]:
        """`torch.autocast` with the run's mixed-precision dtype (nothing in full precision)."""
        dtype = run_state.autocast_dtype(self._trainer)
        if dtype is None:
            yield
            return
        kwargs = {} if autocast_handler is None else _autocast_kwargs(autocast_handler)
        with torch.autocast(device_type=self.device.type, dtype=dtype, **kwargs):
            yield

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """No gradient all-reduce in the block's backward passes (DDP's / FSDP2's no_sync)."""
        if callable(getattr(model, "set_requires_gradient_sync", None)):

            with gradient_sync_disabled(model):
                yield
            return
        no_sync = getattr(model, "no_sync", None)
        with no_sync() if callable(no_sync) else contextlib.nullcontext():
            yield

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backward through the run's Lightning module during `train()` (precision and strategy hooks see it);
        `loss.backward(**kwargs)` outside a run. The loss is not divided: the trainer scales for accumulation."""
        run = self._trainer._training_run
        module = None if run is None else run.module
        if module is None or module._trainer is None:
            loss.backward(**kwargs)
        elif kwargs:
            module.release_held_gradients()  # this backward reuses their memory (engine/held_gradients.py)
            module.manual_backward(loss, **kwargs)
        else:
            module.backward_loss(loss)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        """Clip the gradients' total norm at `max_norm` and return the norm before clipping (unscaled under fp16)."""
        parameters = [p for p in parameters if p.grad is not None]
        scaler = self._grad_scaler()
        inv_scale = None if scaler is None else 1.0 / scaler.get_scale()
        return clip_scaled_grad_norm(parameters, max_norm, inv_scale, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Clip every gradient element to [-clip_value, clip_value] (of the unscaled gradients under fp16)."""
        parameters = [p for p in parameters if p.grad is not None]
        scaler = self._grad_scaler()
        scale = 1.0 if scaler is None else float(scaler.get_scale())
        torch.nn.utils.clip_grad_value_(parameters, clip_value * scale)

    def verify_device_map(self, model: nn.Module) -> bool:
        """Whether `model` (or a submodule) was loaded with a device map over several devices."""
        return any(len(getattr(module, "hf_device_map", None) or {}) > 1 for module in model.modules())

    @property
    def deepspeed_plugin(self) -> None:
        """None: DeepSpeed is configured through `TrainingArguments.deepspeed` and run by Lightning's strategy."""
        return None

    def _grad_scaler(self) -> Any:
        lightning_trainer = self._trainer.lightning_trainer
        return (
            None if lightning_trainer is None else getattr(lightning_trainer.precision_plugin, "scaler", None)
        )

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The model's state dict (unwrapped first); sharded runs are refused with what to use instead."""
        if self.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
            raise ValueError(
                f"accelerator.get_state_dict under {self.distributed_type.value}: the full weights are assembled by "
                "trainer.save_model(output_dir), which writes them as the reference does; load them from there."
            )
        if unwrap:
            model = self.unwrap_model(model)
        return model.state_dict()

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """Save `obj` from the main process only (`torch.save`, or safetensors with `safe_serialization`)."""
        if not self.is_main_process:
            return
        if safe_serialization:
            from safetensors.torch import save_file

            save_file(obj, f, metadata={"format": "pt"})
        else:
            torch.save(obj, f)

    def free_memory(self, *objects: Any) -> list[None]:
        """Drop the references passed, collect garbage and empty the device cache; returns as many Nones."""
        released: list[None] = [None] * len(objects)
        del objects
        empty_device_cache(collect_garbage=True)
        return released

    def clear(self, *objects: Any) -> list[None]:
        """Alias of `free_memory`."""
        return self.free_memory(*objects)

    # ---- what the engine owns -----------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name in _OWNED_BY_THE_ENGINE:
            raise AttributeError(
                f"accelerator.{name} has no meaning under hf_lightning (Lightning runs the loop): "
                f"{_OWNED_BY_THE_ENGINE[name]}."
            )
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(\n{self.state!r})"


def _is_compiled(model: Any) -> bool:
    return hasattr(model, "_orig_mod") and type(model).__name__ == "OptimizedModule"


def _is_deepspeed_engine(model: Any) -> bool:
    return type(model).__name__ in ("DeepSpeedEngine", "PipelineEngine") and hasattr(model, "module")


def _wrap_forward_in_autocast(model: nn.Module, device_type: str, dtype: torch.dtype) -> None:
    """As accelerate's `prepare_model`: the forward autocasts and returns float32 outputs."""
    model._original_forward = model.forward
    original = model.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device_type, dtype=dtype):
            outputs = original(*args, **kwargs)
        return convert_outputs_to_fp32(outputs)

    model.forward = forward


def _restore_forward(model: nn.Module) -> None:
    original = model.__dict__.pop("_original_forward")
    if isinstance(original, types.MethodType) and original.__self__ is model:
        model.__dict__.pop("forward", None)  # the class's forward again
    else:
        model.forward = original


def _autocast_kwargs(handler: Any) -> dict[str, Any]:
    to_kwargs = getattr(handler, "to_kwargs", None)
    return dict(to_kwargs()) if callable(to_kwargs) else dict(handler)
