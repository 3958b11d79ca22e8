"""DeepSpeed the reference's way under Lightning: the engine wraps the user's model, one update per window.

Decision. Lightning's `DeepSpeedStrategy` wraps the LightningModule in the engine and lets the engine
count micro-batches (`gradient_accumulation_steps` = Lightning's `accumulate_grad_batches`, which manual
optimization must keep at 1). The reference (accelerate) instead wraps the user's model, runs every micro-batch
through the engine, and for each one sets the engine's accumulation boundary itself
(`set_gradient_accumulation_boundary(do_sync_step)`), calls `engine.backward(loss, scale_wrt_gas=False)` (the
trainer already divided the loss, R4.5) and, on the window's last micro-batch, `engine.step()`, which clips at
the config's `gradient_clipping`, steps the optimizer, and steps a scheduler the engine owns. The trainer's own
`optimizer.step()` / `zero_grad()` are then no-ops and its grad norm is the engine's.

`HFDeepSpeedStrategy` does the same inside Lightning's manual optimization, which Lightning permits with
DeepSpeed: our LightningModule still owns the window (`HFLightningModule.training_step`), the engine wraps the
user's model and is handed to the facade as `model_wrapped` (the LightningModule stays unwrapped, so Lightning
calls its `training_step` directly), `manual_backward` reaches the engine through `EnginePrecision`, and
Lightning's `optimizer.step()` only advances Lightning's counters. The engine's accumulation count is the
config's (the reference's value; 1 when the config has none), not Lightning's. The engine owns mixed precision
(the config's `fp16` / `bf16` sections), so whichever precision plugin Lightning derives from the plan is
replaced by `EnginePrecision`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import glob
import logging
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.plugins.precision import DeepSpeedPrecision
from lightning.pytorch.strategies import DeepSpeedStrategy

from hf_lightning.args.deepspeed_config import (
    ResolvedDeepSpeedConfig,
    config_owns_optimizer,
    config_owns_scheduler,
    finalize_deepspeed_config,
)
from hf_lightning.core.checkpoint_files import (
    SAFE_WEIGHTS_NAME,
    SCHEDULER_NAME,
    WEIGHTS_NAME,
    safe_torch_load,
)
from hf_lightning.data.model_inputs import is_peft_model
from hf_lightning.strategies.deepspeed.safe_load import verify_engine_checkpoint
from hf_lightning.strategies.deepspeed.steps import engine_global_grad_norm, engine_learning_rate
from hf_lightning.strategies.process_group_options import process_group_kwargs

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from hf_lightning.strategies.ports import CheckpointIOOwner, HandOverModule, ScheduleBuilder
    from hf_lightning.translation.plan import Plan

logger = logging.getLogger(__name__)

__all__ = [
    "EngineOptimizerView",
    "EnginePrecision",
    "EngineSchedulerView",
    "HFDeepSpeedStrategy",
    "build_deepspeed_strategy",
    "engine_global_grad_norm",
    "engine_learning_rate",
    "is_deepspeed_engine",
    "load_engine_checkpoint",
    "save_deepspeed_model",
    "save_deepspeed_optimizer_and_scheduler",
]

_WEIGHTS_FILES = (WEIGHTS_NAME, SAFE_WEIGHTS_NAME)


# ---------------------------------------------------------------- what the trainer holds


class EngineOptimizerView(torch.optim.Optimizer):
    """The trainer's `optimizer` under DeepSpeed (accelerate's `DeepSpeedOptimizerWrapper`): DeepSpeed's optimizer
    behind a `torch.optim.Optimizer` face, so an HF scheduler can be built on it. `step` and `zero_grad` do
    nothing: the engine stepped inside the window's last backward."""

    def __init__(self, optimizer: Any):  # no super().__init__: the groups and state are DeepSpeed's
        self.optimizer = optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return getattr(self.optimizer, "defaults", {})

    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        pass

    def zero_grad(self, set_to_none: bool | None = None) -> None:  # type: ignore[override]
        pass

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        self.optimizer.load_state_dict(state_dict)

    @property
    def step_was_skipped(self) -> bool:
        """Whether the engine skipped the last update (an fp16 overflow)."""
        return bool(getattr(self.optimizer, "overflow", False))

    def __repr__(self) -> str:
        return f"EngineOptimizerView({type(self.optimizer).__name__})"


class EngineSchedulerView:
    """The trainer's `lr_scheduler` when the engine owns the schedule (a `scheduler` or `optimizer` section):
    the engine steps it inside `engine.step()`, so `step` does nothing (accelerate's `DeepSpeedSchedulerWrapper`)."""

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler

    def step(self, *args: Any, **kwargs: Any) -> None:
        pass

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["scheduler"], name)


def is_deepspeed_engine(model: Any) -> bool:
    """Duck-typed `deepspeed.DeepSpeedEngine` (importing deepspeed costs seconds)."""
    return any(cls.__name__ == "DeepSpeedEngine" for cls in type(model).__mro__)


# ---------------------------------------------------------------- precision


class EnginePrecision(DeepSpeedPrecision):
    """Backward and step through the engine that wraps the user's model, on the reference's boundaries.

    The engine owns dtypes (the config's fp16 / bf16), so modules, inputs and init contexts are left alone.
    """

    def __init__(self) -> None:
        super().__init__("32-true")

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    def convert_input(self, data: Any) -> Any:
        return data

    def tensor_init_context(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def module_init_context(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def backward(self, tensor: torch.Tensor, model: Any, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        engine = model.trainer.strategy.deepspeed_engine
        # The module says whether this micro-batch closes the window (its `do_sync_step`), as accelerate's
        # gradient state does for the reference.
        boundary = bool(getattr(model, "sync_gradients", True))
        engine.set_gradient_accumulation_boundary(is_boundary=boundary)
        # The trainer already divided the loss by the window length (R4.5): no second division by the engine.
        engine.backward(tensor, scale_wrt_gas=False)
        if boundary:
            engine.step()

    def optimizer_step(self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any) -> Any:
        closure()
        self._after_closure(model, optimizer)
        # The engine already stepped; the view's no-op step keeps torch's scheduler-order bookkeeping happy.
        return optimizer.step()


# ---------------------------------------------------------------- the strategy


class HFDeepSpeedStrategy(DeepSpeedStrategy):
    """Lightning's `DeepSpeedStrategy` with the engine around the user's model and the reference's config.

    Built from the argument-time config (`ResolvedDeepSpeedConfig`); the train-start values (bucket sizes,
    scheduler steps) and the mismatch check happen in `finalize_config`, at the latest in `setup`, before any
    step. The facade's `optimizer`, `lr_scheduler`, `model_wrapped` and `deepspeed` are handed to the LightningModule
    (`adopt_optimizer_and_scheduler`, `adopt_engine`) when the engine exists.
    """

    # Read by HFLightningModule: the engine owns mixed precision (no forward autocast) and gradient reduction
    # (no `no_sync`: ZeRO-2/3 partition gradients during every backward, as under the reference).
    owns_forward_precision = True
    owns_gradient_sync = True

    def __init__(self, resolved: ResolvedDeepSpeedConfig, **kwargs: Any):
        super().__init__(config=copy.deepcopy(resolved.config), **kwargs)
        self.resolved = resolved
        self.config_finalized = False
        self._engine: Any = None

    # ---- config ----------------------------------------------------------------------------------------------
    def finalize_config(self, args: Any, model: Any, num_training_steps: int) -> dict[str, Any]:
        """Fill the train-start values into `self.config`; raises the reference's mismatch ValueError (T13)."""
        self.config = finalize_deepspeed_config(self.resolved, args, model, num_training_steps)
        self.config_finalized = True
        return self.config

    def _format_batch_size_and_grad_accum_config(self) -> None:
        # Lightning refuses `gradient_accumulation_steps` and would derive it and the micro-batch size from its own
        # loop; the config already holds the reference's values, which the engine must see.
        pass

    # ---- precision -------------------------------------------------------------------------------------------
    @property
    def precision_plugin(self) -> Any:
        return self._precision_plugin if self._precision_plugin is not None else EnginePrecision()

    @precision_plugin.setter
    def precision_plugin(self, plugin: Any) -> None:
        # None at construction (so Lightning's trainer may still pass its own plugins); anything Lightning assigns
        # later is replaced, since the engine owns mixed precision.
        self._precision_plugin = None if plugin is None else EnginePrecision()

    # ---- set-up ----------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def model_sharded_context(self) -> Iterator[None]:
        # The user's model exists before training and the engine partitions it (as under the reference); nothing
        # is built in Lightning's `configure_model`, so no `zero.Init` (which would read the unfinalised config).
        yield

    @property
    def deepspeed_engine(self) -> Any:
        return self._engine

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """The reference's `accelerator.optimizer_step_was_skipped`: the engine's optimizer overflowed (fp16)."""
        return self._engine is not None and bool(getattr(self._engine.optimizer, "overflow", False))

    def setup(self, trainer: pl.Trainer) -> None:
        facade = self.lightning_module.facade
        if not self.config_finalized:
            self.finalize_config(facade.args, facade.model, facade.state.max_steps)
        super().setup(trainer)

    def _initialize_deepspeed_train(self, module: HandOverModule) -> None:  # type: ignore[override]
        """The reference's `deepspeed_init` + `accelerator.prepare`: optimizer and scheduler choice, then the engine."""
        import deepspeed

        facade = module.facade
        config = self.config
        deepspeed.utils.logger.setLevel(facade.args.get_process_log_level())
        self._warn_if_given_optimizers_are_dropped(facade.optimizer, facade.lr_scheduler)
        module.adopt_optimizer_and_scheduler(None, None)  # rebuilt on every train() call, as deepspeed_init does
        model = module.model
        optimizer, model_parameters, client_scheduler = None, None, None
        if config_owns_optimizer(config):
            # DeepSpeed builds the optimizer from the config; args.optim is not used (R5.1).
            model_parameters = [p for p in model.parameters() if p.requires_grad]
            if not config_owns_scheduler(config):
                client_scheduler = self._trainer_scheduler_factory(facade, facade.state.max_steps)
        else:
            optimizer = _offload_ready_optimizer(facade.create_optimizer(), config)
        # No device index off CUDA: DeepSpeed then reads LOCAL_RANK, as it does under accelerate.
        device_index = self.root_device.index
        engine, engine_optimizer, _, _ = deepspeed.initialize(
            args=None if device_index is None else argparse.Namespace(device_rank=device_index),
            config=config,
            model=model,
            model_parameters=model_parameters,
            optimizer=optimizer,
            lr_scheduler=client_scheduler,
            dist_init_required=False,
        )
        self._engine = engine
        view = EngineOptimizerView(engine_optimizer)
        self.optimizers = [view]
        self.lr_scheduler_configs = []
        engine_scheduler = None if engine.lr_scheduler is None else EngineSchedulerView(engine.lr_scheduler)
        module.adopt_optimizer_and_scheduler(view, engine_scheduler)
        if engine_scheduler is None:
            # Neither section: the trainer's schedule, built on the wrapped optimizer and stepped by our module.
            facade.create_scheduler(num_training_steps=facade.state.max_steps)
        module.adopt_engine(engine)
        # The engine moved the user's model; the LightningModule's recorded device follows (self.device).
        module._device = self.root_device
        self._set_deepspeed_activation_checkpointing()
        run = facade._training_run  # set while train() runs, which builds the engine
        files = run.resume.files if run is not None else None
        self._resume_engine(None if files is None else files.checkpoint, facade.model, facade.lr_scheduler)

    @staticmethod
    def _trainer_scheduler_factory(facade: ScheduleBuilder, num_training_steps: int) -> Callable[[Any], Any]:
        """DeepSpeed's optimizer with the trainer's schedule: the engine builds it on its optimizer (and steps it)."""

        def build(optimizer: Any) -> Any:
            # A shallow copy, so the facade's own scheduler slot is untouched (the reference does the same).
            trainer_copy = copy.copy(facade)
            trainer_copy.lr_scheduler = None
            return trainer_copy.create_scheduler(num_training_steps=num_training_steps, optimizer=optimizer)

        return build

    @staticmethod
    def _warn_if_given_optimizers_are_dropped(optimizer: Any, lr_scheduler: Any) -> None:
        # What remains in the facade at set-up was passed by the user (ours are views, or reset per train()).
        views = (EngineOptimizerView, EngineSchedulerView)
        given = [obj for obj in (optimizer, lr_scheduler) if obj is not None and not isinstance(obj, views)]
        if given:
            logger.warning(
                "DeepSpeed: the optimizer / scheduler passed to the trainer (`optimizers=`) are not used; the engine "
                "is built from the config's sections or the arguments, as the reference does. Override "
                "`create_optimizer` / `create_scheduler` to customise them."
            )

    def _resume_engine(self, checkpoint: str | None, model: Any, lr_scheduler: Any) -> None:
        """Resuming from `checkpoint` (None: a fresh start): the engine's own checkpoint (weights, optimizer, engine
        scheduler), then `scheduler.pt` into `lr_scheduler` when the trainer's schedule is ours to step (the
        reference's `deepspeed_load_checkpoint` and `_load_optimizer_and_scheduler`)."""
        if checkpoint is None:
            return
        load_engine_checkpoint(self._engine, checkpoint, load_module_strict=not is_peft_model(model))
        if not isinstance(lr_scheduler, EngineSchedulerView):
            state = safe_torch_load(os.path.join(checkpoint, SCHEDULER_NAME))
            lr_scheduler.load_state_dict(state)

    def teardown(self) -> None:
        # Lightning's default moves the model and the optimizer state to CPU after fit; the reference leaves them
        # where the engine placed them (a ZeRO-3 model moved by hand would lose its partitioning).
        self.precision_plugin.teardown()
        self.accelerator.teardown()
        self.checkpoint_io.teardown()


def _offload_ready_optimizer(optimizer: torch.optim.Optimizer, config: dict[str, Any]) -> Any:
    """accelerate's `map_pytorch_optim_to_deepspeed`: with optimizer offload, a torch optimizer becomes DeepSpeed's
    CPU Adam (AdamW mode for `torch.optim.AdamW`) or CPU Adagrad, with its groups, `lr` and `weight_decay`."""
    device = config.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none")
    if device == "none" or not config.get("zero_force_ds_cpu_optimizer", True):
        return optimizer
    defaults = {k: v for k, v in optimizer.defaults.items() if k in ("lr", "weight_decay")}
    if isinstance(optimizer, torch.optim.Adagrad):
        # accelerate also passes `adamw_mode`, which DeepSpeedCPUAdagrad does not take (a TypeError there).
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

        return DeepSpeedCPUAdagrad(optimizer.param_groups, **defaults)
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return DeepSpeedCPUAdam(
        optimizer.param_groups, adamw_mode=isinstance(optimizer, torch.optim.AdamW), **defaults
    )


def build_deepspeed_strategy(
    plan: Plan, model: Any = None, *, args: Any = None, num_training_steps: int | None = None
) -> HFDeepSpeedStrategy:
    """The plan's DeepSpeed strategy; with `args` and `num_training_steps` its config is finalised now (else at
    `setup`, from the facade), so mismatches and missing hidden sizes raise before any step."""
    if plan.strategy is None or plan.strategy.deepspeed is None:
        raise ValueError("the plan does not use DeepSpeed")
    details = plan.strategy.deepspeed
    resolved = ResolvedDeepSpeedConfig(copy.deepcopy(dict(details.config)), list(details.mismatches))
    strategy = HFDeepSpeedStrategy(resolved, **process_group_kwargs(plan.strategy))
    if args is not None and num_training_steps is not None:
        strategy.finalize_config(args, model, num_training_steps)
    return strategy


# ---------------------------------------------------------------- checkpoints


def _consolidated_state_dict(engine: Any) -> dict[str, torch.Tensor]:
    """accelerate's `get_state_dict` for an engine (all ranks: ZeRO-3 gathers). ValueError under ZeRO-3 without
    `stage3_gather_16bit_weights_on_model_save`."""
    if engine.zero_optimization_stage() == 3:
        if not engine.zero_gather_16bit_weights_on_model_save():
            raise ValueError(
                "Cannot get 16bit model weights because `stage3_gather_16bit_weights_on_model_save` in DeepSpeed "
                "config is False."
            )
        return engine._zero3_consolidated_16bit_state_dict()
    from deepspeed.checkpoint.utils import clone_tensors_for_torch_save

    return clone_tensors_for_torch_save(engine.module.state_dict())


def save_deepspeed_model(trainer: CheckpointIOOwner, output_dir: str) -> None:
    """The reference's `save_model` under DeepSpeed (all ranks): consolidated weights, or under ZeRO-3 without the
    16-bit gather the engine's checkpoint (recover the weights with its `zero_to_fp32.py`)."""
    engine = trainer.model_wrapped
    if not is_deepspeed_engine(engine):  # before any train(): the model is not sharded yet
        trainer._save(output_dir)
        return
    try:
        state_dict = _consolidated_state_dict(engine)
        trainer._save(output_dir, state_dict=state_dict)
    except ValueError:
        logger.warning(
            " stage3_gather_16bit_weights_on_model_save=false. Saving the full checkpoint instead, use"
            " zero_to_fp32.py to recover weights"
        )
        trainer._save(output_dir, state_dict={})
        if trainer.args.should_save:
            for name in _WEIGHTS_FILES:  # the empty weights file written just above
                path = os.path.join(output_dir, name)
                if os.path.isfile(path):
                    os.remove(path)
        engine.save_checkpoint(output_dir)


def save_deepspeed_optimizer_and_scheduler(
    engine: Any, model: Any, lr_scheduler: Any, output_dir: str, *, should_save: bool
) -> None:
    """The `engine`'s checkpoint (`global_step<N>/`, `latest`, `zero_to_fp32.py`; all ranks), and `scheduler.pt`
    when the trainer steps its own schedule (not when the engine owns it) and this process saves (`should_save`),
    as the reference saves them. `model`: the user's model (a PEFT model's frozen parameters are left out)."""
    if is_peft_model(model):
        engine.save_checkpoint(output_dir, exclude_frozen_parameters=True)
    else:
        engine.save_checkpoint(output_dir)
    if should_save and not isinstance(lr_scheduler, EngineSchedulerView):
        torch.save(lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))


def load_engine_checkpoint(engine: Any, checkpoint: str, load_module_strict: bool = True) -> None:
    """The reference's `deepspeed_load_checkpoint`: weights, optimizer and engine scheduler from `global_step*`."""
    if not sorted(glob.glob(os.path.join(checkpoint, "global_step*"))):
        raise ValueError(f"Can't find a valid checkpoint at {checkpoint}")
    verify_engine_checkpoint(
        checkpoint
    )  # the engine unpickles without weights_only: refuse what could run code
    logger.info(f"Attempting to resume from {checkpoint}")
    load_path, _ = engine.load_checkpoint(
        checkpoint,
        load_module_strict=load_module_strict,
        load_optimizer_states=True,
        load_lr_scheduler_states=True,
    )
    if load_path is None:
        raise ValueError(f"[deepspeed] failed to resume from checkpoint {checkpoint}")
