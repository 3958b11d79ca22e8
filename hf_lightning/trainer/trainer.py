"""`HFLightningTrainer`: the facade users hold, with the reference Trainer's constructor and methods.

It owns the model, data, `TrainerState` and HF callbacks; `train()` builds a `lightning.Trainer` from the
translation plan and runs `fit` on an `HFLightningModule`, which calls back into the overridable methods
here (`get_batch_samples`, `training_step`, `compute_loss`, `create_optimizer`, `create_scheduler`, `log`).
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

import hf_lightning.data.model_inputs as data_layer
from hf_lightning.args.accelerator_config import write_planned_accumulation
from hf_lightning.args.changes import (
    CONSTRUCTION_FIELDS,
    arguments_snapshot,
    changed_fields,
    warn_kept,
    with_construction_values,
)
from hf_lightning.args.training_args import TrainingArguments, as_training_arguments
from hf_lightning.args.user_warnings import user_stacklevel
from hf_lightning.args.validation import invalid_arguments
from hf_lightning.callbacks import (
    CallbackHandler,
    DefaultFlowCallback,
    PrinterCallback,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    is_exportable_state,
)
from hf_lightning.callbacks.notebook import default_progress_callback
from hf_lightning.checkpoint.checkpointer import Checkpointer
from hf_lightning.checkpoint.output_folder import make_output_dir
from hf_lightning.core.outputs import TrainOutput
from hf_lightning.core.reference_logging import route_reference_lines
from hf_lightning.core.seeding import seed_from_args
from hf_lightning.data.collate import collates_as_a_default, pick_default_collator
from hf_lightning.engine.accelerator import LightningAccelerator
from hf_lightning.engine.input_checks import (
    check_constructor_arguments,
    check_train_labels,
    check_trainer_inputs,
)
from hf_lightning.engine.jit_checkpoint import JITCheckpointCallback
from hf_lightning.engine.library_logging import set_library_log_level
from hf_lightning.engine.loss import (
    LabelSmoother,
    loss_shifts_labels,
)
from hf_lightning.engine.memory import TrainerMemoryTracker
from hf_lightning.engine.overridable import refuse_uncalled_overrides
from hf_lightning.engine.telemetry.meter import TelemetryMeter
from hf_lightning.engine.telemetry.settings import resolve_telemetry
from hf_lightning.integrations.hub import hub_progress_bars_suppressed
from hf_lightning.integrations.loggers import build_loggers
from hf_lightning.integrations.reporting_callbacks import reporting_callbacks
from hf_lightning.strategies.launch import maybe_launch_over_devices
from hf_lightning.strategies.tensor_parallel import plans as tensor_parallel_plans
from hf_lightning.trainer.checkpoint_methods import CheckpointMixin
from hf_lightning.trainer.data_methods import DataMethodsMixin
from hf_lightning.trainer.evaluation_methods import EvaluationMixin
from hf_lightning.trainer.hp_search_methods import HyperparameterSearchMixin
from hf_lightning.trainer.hub_methods import HubMixin
from hf_lightning.trainer.model_card_methods import ModelCardMixin
from hf_lightning.trainer.optimizer_methods import OptimizerMixin
from hf_lightning.trainer.step_methods import TrainingStepMixin
from hf_lightning.translation.plan import Plan
from hf_lightning.translation.translate import explain, translate

logger = logging.getLogger(__name__)


class HFLightningTrainer(
    TrainingStepMixin,
    DataMethodsMixin,
    OptimizerMixin,
    EvaluationMixin,
    CheckpointMixin,
    ModelCardMixin,
    HubMixin,
    HyperparameterSearchMixin,
):
    """Drop-in for `transformers.Trainer` whose training loop is Lightning's.

    What it is: the reference's constructor, attributes and methods (`train`, `evaluate`, `predict`, `save_model`,
    `push_to_hub`, `hyperparameter_search`, ...), with the arguments translated once into a `Plan`
    (`translation/`) that says how each field is carried out on Lightning.

    How a run flows: `train()` builds a `TrainingRun` (engine/training_run.py), which resumes through its `Resumer`,
    builds a `lightning.Trainer` from the plan and fits an `HFLightningModule` whose every `training_step` is one
    reference update; at each update boundary `_maybe_log_save_evaluate` logs, evaluates (one `EvaluationLoop` per
    `evaluation_loop`) and saves (this trainer's `Checkpointer`), as the flow callbacks decided. docs/design.md has
    the component map.

    Where to override: the reference's methods, called at the reference's moments with its arguments:
    `compute_loss`, `training_step`, `prediction_step`, `evaluation_loop`, `get_batch_samples`, `create_optimizer`,
    `create_scheduler`, `get_train_dataloader` / `get_eval_dataloader` / `get_test_dataloader`, `log`,
    `_maybe_log_save_evaluate`, `_evaluate`, `_save_checkpoint`, `_save`, `_load_from_checkpoint`,
    `_load_optimizer_and_scheduler`, `_load_rng_state`, `_load_best_model`, `_determine_best_metric`. Lightning
    callbacks, loggers, plugins and strategies come in through `callbacks=` and `lightning_trainer_overrides`.
    """

    # None: decide per step as the reference does (R4.5); a subclass sets True/False for its own loss.
    loss_is_scaled_for_ga: bool | None = None
    # On CPU, keep the gradients an update frees for the next backward to reuse (engine/held_gradients.py): faster
    # steps for up to one set of gradients of extra peak memory; a subclass sets False to free them as the reference.
    reuse_gradient_memory: bool = True
    # With persistent workers, the eval DataLoaders built so far (replaced, never mutated), as the reference's.
    _eval_dataloaders: dict[str, Any] = {}  # noqa: RUF012
    # The translation of `args` (translation/plan.py), set by the constructor once the model is built.
    plan: Plan | None = None

    def __init__(
        self,
        model: nn.Module | None = None,
        args: TrainingArguments | None = None,
        data_collator: Callable | None = None,
        train_dataset: Dataset | None = None,
        eval_dataset: Dataset | dict[str, Dataset] | None = None,
        processing_class: Any = None,
        model_init: Callable[..., nn.Module] | None = None,
        compute_loss_func: Callable | None = None,
        compute_metrics: Callable | Mapping[str, Any] | None = None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple[torch.optim.Optimizer | None, Any] = (None, None),
        optimizer_cls_and_kwargs: tuple[type[torch.optim.Optimizer], dict[str, Any]] | None = None,
        preprocess_logits_for_metrics: Callable | None = None,
        **deprecated_kwargs: Any,
    ):
        # An override of a reference method Lightning's loop never calls is refused here, before anything runs.
        refuse_uncalled_overrides(type(self))
        # Our own keyword (not in the reference's signature, which stays the reference's): the telemetry's options.
        telemetry = deprecated_kwargs.pop("telemetry", True)
        processing_class = _fold_tokenizer_alias(processing_class, deprecated_kwargs)
        if args is None:
            args = TrainingArguments(output_dir="tmp_trainer")
        self.args = as_training_arguments(args)
        args = self.args
        # Several GPUs and no launcher: one process per GPU, as Lightning's DDP launcher does (docs/divergences.md).
        maybe_launch_over_devices(args)
        seed_from_args(args)
        # Memory metrics (skip_memory_metrics=False): the `init` stage spans the rest of the constructor.
        self._memory_tracker = TrainerMemoryTracker(args.skip_memory_metrics)
        self._memory_tracker.start(stage="init")
        self.lightning_trainer = None
        # accelerate's surface for subclasses (TRL reads it in __init__): the launcher's processes until train().
        self.accelerator = LightningAccelerator(self)
        self._loggers_before_training: list[Any] | None = None
        self.model = model
        self._set_process_log_level()

        if model is None:
            if model_init is None:
                raise RuntimeError("`Trainer` requires either a `model` or `model_init` argument")
            self.model_init = model_init
            model = self.call_model_init()
        else:
            if model_init is not None:
                raise ValueError(
                    "`Trainer` requires either a `model` or `model_init` argument, but not both."
                )
            self.model_init = model_init

        self.is_model_parallel = _is_model_parallel(model)
        self.is_deepspeed_enabled = False
        self.is_fsdp_enabled = False
        # The DeepSpeed engine once `train()` has built it (the reference's `self.deepspeed`); None before.
        self.deepspeed = None
        self.model_wrapped = model
        self.model = model

        base_model = data_layer.unwrap_peft_model(model)
        self.model_accepts_loss_kwargs = data_layer.model_accepts_loss_kwargs(base_model)
        default_label_names = data_layer.infer_label_names(base_model)
        self.label_names = default_label_names if args.label_names is None else args.label_names
        self.can_return_loss = data_layer.can_return_loss(base_model)
        self._loss_shifts_labels = loss_shifts_labels(base_model)

        self.data_collator = (
            data_collator if data_collator is not None else pick_default_collator(processing_class)
        )
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.processing_class = processing_class
        self.compute_loss_func = compute_loss_func
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.optimizer, self.lr_scheduler = optimizers
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        check_constructor_arguments(self)
        # Bad values of the arguments, the model or the data: one error naming each, before anything runs.
        check_trainer_inputs(
            args,
            model,
            train_dataset,
            own_scheduler=self.lr_scheduler is not None,
            neftune_noise_alpha=args.neftune_noise_alpha,
            eval_dataset=eval_dataset,
            default_collator=collates_as_a_default(self.data_collator),
        )

        # Refusals of unsupported fields surface here, before any training starts.
        self.plan = translate(args)

        # The model's tensor-parallel plan, or a model split at load without tp_size: before training.
        refusal = tensor_parallel_plans.tp_model_refusal(model, self.get_tp_size())
        if refusal:
            raise ValueError(refusal)
        write_planned_accumulation(args, self.plan.module.gradient_accumulation_steps)
        # What the plan was translated from: train() compares the arguments with it (args/changes.py).
        self._planned_arguments = arguments_snapshot(args)
        # The planned settings the facade keeps under the reference's attribute names.
        self.label_smoother = self._build_label_smoother()
        self.neftune_noise_alpha = self.plan.module.neftune_noise_alpha
        # As the reference at construction (its accelerator state): DeepSpeed is on from here, not only once the
        # engine exists, so evaluate / predict / resume before `train()` see it.
        self.is_deepspeed_enabled = _plan_uses_deepspeed(self.plan)
        self._place_model(model)

        hf_callbacks, self.lightning_callbacks = _split_callbacks(callbacks)
        # Where the run's time goes (engine/telemetry/): on unless `telemetry=False` or `Telemetry(enabled=False)`.
        telemetry_settings, telemetry_holder = resolve_telemetry(telemetry, self.lightning_callbacks)
        self._telemetry = (
            TelemetryMeter(self, telemetry_settings, telemetry_holder) if telemetry_settings.enabled else None
        )
        # As the reference: the flow callback, the report_to integrations' own callbacks (docs/design.md, "Who
        # carries report_to"), the SIGTERM checkpoint callback, then the user's.
        jit_callbacks = [JITCheckpointCallback(self)] if args.enable_jit_checkpoint else []
        self.callback_handler = CallbackHandler(
            [DefaultFlowCallback] + reporting_callbacks(self.plan) + jit_callbacks + hf_callbacks,
            self.model,
            self.processing_class,
            self.optimizer,
            self.lr_scheduler,
        )
        self.add_callback(PrinterCallback if args.disable_tqdm else default_progress_callback())

        self.hub_model_id = None  # set by init_hf_repo (trainer/hub_methods.py) when push_to_hub is on
        if self.plan.hub.push_to_hub:
            self.init_hf_repo()  # a wrong or missing token fails here, before any training
        if args.should_save:

            make_output_dir(args.output_dir)  # an existing file there: a ValueError naming output_dir

        self.control = TrainerControl()
        self.state = TrainerState(
            is_local_process_zero=self.is_local_process_zero(),
            is_world_process_zero=self.is_world_process_zero(),
            stateful_callbacks=self._stateful_callbacks(),
        )
        self.is_in_train = False
        self.hp_name = None
        self.hp_search_backend = None
        self.current_flos = 0
        self._signature_columns = None
        self._train_batch_size = args.train_batch_size
        self._created_lr_scheduler = False
        self._trial = None  # the reference's: the trial of the last train() (hp search), read by TrainerState
        # The current train() call (engine/training_run.TrainingRun), which owns every per-run value; None outside.
        self._training_run = None
        # Checkpoint saves: the protocol, its background writer (which a later train() joins), the last rotation.
        self._checkpointer = Checkpointer(self)
        self.control = self.callback_handler.on_init_end(self.args, self.state, self.control)
        if getattr(self.model, "config", None) is not None:
            self.model.config.use_cache = args.use_cache
        self._memory_tracker.stop_and_update_metrics(stage="init")

    def explain(self) -> str:
        """How each argument is translated onto Lightning, one line per field, then the `lightning.Trainer` overrides."""
        # lazy: Lightning loads when a run starts, not at `from hf_lightning import Trainer`
        from hf_lightning.engine.lightning_bridge import explain_lightning_overrides

        return explain(self.plan) + explain_lightning_overrides(self.lightning_trainer_overrides, self.plan)

    @property
    def lightning_trainer_overrides(self) -> dict[str, Any]:
        """Native `lightning.Trainer` arguments merged last into each run's Trainer (empty by default).

        Only keys that leave the engine's contract intact are accepted (`lightning_bridge.SAFE_LIGHTNING_OVERRIDES`);
        a refused key raises ValueError naming the TrainingArguments field to use instead.
        """
        return self.__dict__.setdefault("_lightning_trainer_overrides", {})

    @lightning_trainer_overrides.setter
    def lightning_trainer_overrides(self, overrides: Mapping[str, Any]) -> None:
        # lazy: Lightning loads when a run starts, not at `from hf_lightning import Trainer`
        from hf_lightning.engine.lightning_bridge import check_lightning_overrides

        self._lightning_trainer_overrides = check_lightning_overrides(overrides)

    # ---- construction helpers ---------------------------------------------------------------
    def _set_process_log_level(self) -> None:
        transformers_logging = _transformers_logging()
        if transformers_logging is not None:
            transformers_logging.set_verbosity(self.args.get_process_log_level())
        route_reference_lines(to_transformers=transformers_logging is not None)
        chosen = self.args.log_level if self.args.should_log else self.args.log_level_replica
        if chosen != "passive":  # passive leaves our loggers to the application's logging set-up

            set_library_log_level(self.args.get_process_log_level())

    def _place_model(self, model: nn.Module) -> None:
        """The reference's `place_model_on_device`: the argument's value, else not under model parallelism,
        DeepSpeed (the engine places the model) or full fp16 / bf16 evaluation; then move the model."""
        args = self.args
        plan = self.plan
        if args.place_model_on_device is not None:
            self.place_model_on_device = args.place_model_on_device
        else:
            self.place_model_on_device = not (
                self.is_model_parallel
                or self._strategy_steps.engine_places_model
                or plan.evaluation.fp16_full_eval
                or plan.evaluation.bf16_full_eval
            )
        if self.place_model_on_device:
            model.to(args.device)

    def _build_label_smoother(self) -> LabelSmoother | None:
        if self.plan.module.label_smoothing_factor == 0:
            return None
        if getattr(getattr(self.model, "config", None), "problem_type", None) == "multi_label_classification":
            warnings.warn(
                "Label smoothing is not compatible with multi-label classification. "
                "Disabling label smoothing for this training run.",
                UserWarning,
                stacklevel=3,
            )
            return None
        return LabelSmoother(epsilon=self.plan.module.label_smoothing_factor)

    def _stateful_callbacks(self) -> list:
        return [cb for cb in self.callback_handler.callbacks + [self.control] if is_exportable_state(cb)]

    # ---- callbacks ------------------------------------------------------------------------------
    def add_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> None:
        """Add a callback (a class is instantiated with no arguments)."""
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> TrainerCallback | None:
        """Remove a callback and return it (None when absent)."""
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> None:
        """Remove a callback (an absent instance raises ValueError, as in the reference)."""
        self.callback_handler.remove_callback(callback)

    def _fire(self, event: str) -> None:
        self.control = getattr(self.callback_handler, event)(self.args, self.state, self.control)

    # ---- processes --------------------------------------------------------------------------------
    def is_local_process_zero(self) -> bool:
        """Whether this process is the main one of its node."""
        return self.args.local_process_index == 0

    def is_world_process_zero(self) -> bool:
        """Whether this process is the global main process."""
        return self.args.process_index == 0

    def call_model_init(self, trial: Any = None) -> nn.Module:
        """Call `model_init` with the trial when it takes one argument (the reference's rule)."""
        model_init_argcount = len(inspect.signature(self.model_init).parameters)
        if model_init_argcount == 0:
            model = self.model_init()
        elif model_init_argcount == 1:
            model = self.model_init(trial)
        else:
            raise RuntimeError("model_init should have 0 or 1 argument.")
        if model is None:
            raise RuntimeError("model_init should not return None.")
        return model

    def _current_loggers(self) -> list[Any]:
        """The Lightning loggers a log goes to: the last fit's or, before any `train()`, the plan's, built at the
        first use (the reference's integrations also start at their first event) and handed to `train()`.

        A `logger` in `lightning_trainer_overrides` replaces the plan's before training too: its logger(s), or
        none for `False` / `None` / `True` (Lightning makes its default logger only when the fit starts).
        """
        if self.lightning_trainer is not None:
            return list(self.lightning_trainer.loggers)
        overrides = self.lightning_trainer_overrides
        if "logger" in overrides:
            chosen = overrides["logger"]
            if chosen is None or isinstance(chosen, bool):
                return []
            return list(chosen) if isinstance(chosen, (list, tuple)) else [chosen]
        if self._loggers_before_training is None:
            if not self.plan.logging.loggers:
                return []

            self._loggers_before_training = build_loggers(self.plan)
            for pl_logger in self._loggers_before_training:
                # As train begin does; the reference's W&B / MLflow setup at their first event logs them too.
                pl_logger.log_hyperparams(self.args.to_sanitized_dict())
        return self._loggers_before_training

    # ---- training ---------------------------------------------------------------------------------------------
    def end(self) -> None:
        """Finish the run's loggers and destroy the default process group (call once, at the script's end)."""
        for pl_logger in self._current_loggers():
            pl_logger.finalize("success")
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    def _read_changed_arguments(self) -> None:
        """Fields changed since the plan was translated: translated again (the run reads them; a refused value
        raises here, before training), but those the reference reads only in its constructor keep their value then,
        with a warning naming each (args/changes.py)."""
        before = self._planned_arguments
        changed = changed_fields(before, self.args)
        if not changed:
            return
        kept = [name for name in changed if name in CONSTRUCTION_FIELDS]
        warn_kept(kept, before, self.args)
        read = [name for name in changed if name not in CONSTRUCTION_FIELDS]
        if not read:
            return
        logger.info(f"TrainingArguments changed since the trainer was built, translated again: {', '.join(read)}")
        self.plan = translate(with_construction_values(self.args, before, kept))
        current = arguments_snapshot(self.args)
        before.update({name: current[name] for name in read})

    def _check_train_labels(self) -> None:
        """At `train()`: the first train example's labels, as a default collator (the trainer's pick, or one passed as
        `data_collator`) will batch them, in one error before training (a trainer built only to evaluate or predict
        may hold unlabelled train data)."""
        if not collates_as_a_default(self.data_collator):
            return
        base_model = data_layer.unwrap_peft_model(self.model)
        if not hasattr(base_model, "config"):  # a plain module: its data is its author's, read only by training
            return
        # The model's own loss, which transformers' models compute only when given labels.
        loss_needs_labels = (
            self.compute_loss_func is None
            and type(self).compute_loss is HFLightningTrainer.compute_loss
            and not self.can_return_loss
        )
        problems = check_train_labels(self.train_dataset, self.label_names, base_model, loss_needs_labels)
        if problems:
            raise invalid_arguments("Trainer", problems)

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
    ) -> TrainOutput:
        """Train with Lightning's loop, reproducing the reference's steps, logs and metrics."""
        # lazy: Lightning loads when a run starts, not at `from hf_lightning import Trainer`
        from hf_lightning.engine.training_run import TrainingRun

        if self._training_run is None:
            self._read_changed_arguments()
            self._check_train_labels()

        outer_run, self._training_run = self._training_run, TrainingRun(self, trial, ignore_keys_for_eval)
        try:
            with hub_progress_bars_suppressed(self.plan.hub.push_to_hub):
                return self._training_run.execute(resume_from_checkpoint)
        finally:
            self._training_run = outer_run  # None again once the outermost train() returns


def _split_callbacks(callbacks: list | None) -> tuple[list, list]:
    """HF-style callbacks go to the callback handler; Lightning callbacks go to `lightning.Trainer`."""
    import lightning.pytorch as pl

    # lazy: the Lightning bridge imports Lightning's trainer, which a facade built for evaluation only never needs
    from hf_lightning.engine.lightning_bridge import refuse_ray_lightning

    hf_callbacks, lightning_callbacks = [], []
    for callback in callbacks or []:
        is_lightning = isinstance(callback, pl.Callback) or (
            isinstance(callback, type) and issubclass(callback, pl.Callback)
        )
        if is_lightning:
            refuse_ray_lightning(callback, "callbacks=")
            lightning_callbacks.append(callback() if isinstance(callback, type) else callback)
        else:
            hf_callbacks.append(callback)
    return hf_callbacks, lightning_callbacks


def _plan_uses_deepspeed(plan: Any) -> bool:
    return plan.strategy is not None and plan.strategy.name == "deepspeed"


def _is_model_parallel(model: nn.Module) -> bool:
    device_map = getattr(model, "hf_device_map", None)
    if device_map is None:
        return False
    devices = {d for d in device_map.values() if d not in ("cpu", "disk")}
    return len(devices) > 1


def _transformers_logging():
    import sys

    if sys.modules.get("transformers") is None:
        return None
    from transformers.utils import logging as transformers_logging

    return transformers_logging


def _fold_tokenizer_alias(processing_class: Any, deprecated_kwargs: dict[str, Any]) -> Any:
    """`tokenizer=` (v4) is a deprecated alias of `processing_class`; any other keyword is a TypeError."""
    given = "tokenizer" in deprecated_kwargs
    tokenizer = deprecated_kwargs.pop("tokenizer", None)
    if deprecated_kwargs:
        unexpected = next(iter(deprecated_kwargs))
        raise TypeError(f"HFLightningTrainer.__init__() got an unexpected keyword argument '{unexpected}'")
    if not given:
        return processing_class
    warnings.warn(
        "`tokenizer` is deprecated (transformers v4 name); use `processing_class` instead.",
        FutureWarning,
        stacklevel=user_stacklevel(),
    )
    if processing_class is not None and processing_class is not tokenizer:
        raise ValueError(
            "Both `tokenizer` and `processing_class` were given with different objects; pass only one."
        )
    return tokenizer


Trainer = HFLightningTrainer


def _public_signature(init: Callable) -> inspect.Signature:
    """The reference's constructor signature: the hidden v4 `tokenizer=` keyword is not advertised."""
    signature = inspect.signature(init)
    visible = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    return signature.replace(parameters=visible)


HFLightningTrainer.__init__.__signature__ = _public_signature(HFLightningTrainer.__init__)
