"""Every `transformers.Trainer` method a subclass may override: called by the engine, or refused at construction.

A library's trainer (TRL's, sentence-transformers', an in-house one) overrides reference methods and expects the
loop to call them. `OVERRIDES` holds one entry per method of `transformers.Trainer` (and the names the reference
used to have that libraries still define): `Called` (the engine calls the facade method of that name at the
reference's moment, with the reference's arguments, so an override runs), `UserApi` (the reference's loop never
calls it either; only the user's code does, which reaches an override) or `Refused` (nothing in Lightning's loop
calls it: a subclass that overrides it is refused when the trainer is built, with what to override instead).
`tests/engine/test_overridable.py` walks the table against the reference's own calls.

To make a refused method overridable: have the engine call the facade method at the reference's moment, then turn
its entry into `Called`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Called:
    """The engine calls it where the reference does (`when`: in which part of a run)."""

    when: str


@dataclass(frozen=True)
class UserApi:
    """Public API the reference's loop does not call either: an override is reached by the user's own calls."""

    what: str = ""


@dataclass(frozen=True)
class Refused:
    """Lightning's loop has no such step; `instead` says what to override (or set) to get the effect."""

    instead: str


_LOOP = "Lightning's fit runs the training loop (one Lightning training_step per update)"

OVERRIDES: dict[str, Called | UserApi | Refused] = {
    # ---- construction -----------------------------------------------------------------------------------------
    "__init__": Called("construction"),
    "_validate_args": Refused("the arguments are validated by TrainingArguments and at construction; override "
                              "__init__ and check before calling super().__init__()"),
    "_build_accelerator_args": Refused("hf_lightning builds no accelerate Accelerator (the plan configures "
                                       "Lightning); set the TrainingArguments fields or lightning_trainer_overrides"),
    "create_accelerator_and_postprocess": Refused(
        "hf_lightning builds no accelerate Accelerator; set the TrainingArguments fields or lightning_trainer_overrides"
    ),
    "_move_model_to_device": Refused("the model is placed at construction (place_model_on_device) and by "
                                     "Lightning's strategy; move it before calling super().__init__()"),
    "init_hf_repo": Called("construction, with push_to_hub"),
    "call_model_init": Called("construction and train(), with model_init"),
    "add_callback": Called("construction"),
    "pop_callback": UserApi(),
    "remove_callback": UserApi(),
    # ---- data -------------------------------------------------------------------------------------------------
    "get_train_dataloader": Called("train()"),
    "get_eval_dataloader": Called("evaluate()"),
    "get_test_dataloader": Called("predict()"),
    "_get_dataloader": Called("train(), evaluate(), predict()"),
    "_get_train_sampler": Called("train()"),
    "_get_eval_sampler": Called("evaluate(), predict()"),
    "_set_signature_columns_if_needed": Called("train(), evaluate(), predict()"),
    "_remove_unused_columns": Refused("column removal keeps the columns `_set_signature_columns_if_needed` sets; "
                                      "override that, or get_train_dataloader / get_eval_dataloader"),
    "_get_collator_with_removed_columns": Refused(
        "column removal keeps the columns `_set_signature_columns_if_needed` sets; override that, or the dataloader "
        "methods"
    ),
    "num_examples": Called("train()"),
    # ---- optimizer and schedule -------------------------------------------------------------------------------
    "create_optimizer_and_scheduler": Refused("override create_optimizer and create_scheduler, which the run calls"),
    "create_optimizer": Called("train()"),
    "create_scheduler": Called("train()"),
    "get_optimizer_cls_and_kwargs": Called("train()"),
    "get_decay_parameter_names": Called("train()"),
    "_get_learning_rate": Called("train(), at each log"),
    "get_learning_rates": UserApi(),
    "get_optimizer_group": UserApi(),
    "get_num_trainable_parameters": UserApi(),
    # ---- the training loop --------------------------------------------------------------------------------------
    "train": Called("the user's call"),
    "_inner_training_loop": Refused(f"{_LOOP}; override training_step / compute_loss, or add a TrainerCallback"),
    "_init_training_state": Refused(f"{_LOOP}; add a TrainerCallback's on_train_begin"),
    "_prepare_for_training": Refused(f"{_LOOP}; override create_optimizer / create_scheduler or add a "
                                     "TrainerCallback's on_train_begin"),
    "_run_epoch": Refused(f"{_LOOP}; add a TrainerCallback's on_epoch_begin / on_epoch_end"),
    "_finalize_training": Refused(f"{_LOOP}; add a TrainerCallback's on_train_end"),
    "_wrap_model": Refused("Lightning's strategy wraps the model (DDP / FSDP / DeepSpeed) in train(); configure it "
                           "through TrainingArguments or lightning_trainer_overrides"),
    "set_initial_training_values": Called("train()"),
    "get_total_train_batch_size": Called("train()"),
    "get_batch_samples": Called("train(), per update"),
    "_get_num_items_in_batch": Called("train(), per update"),
    "training_step": Called("train(), per micro-batch"),
    "compute_loss": Called("train(), per micro-batch; evaluate()"),
    "compute_loss_context_manager": Called("train(), per micro-batch"),
    "autocast_smart_context_manager": Called("train(), per micro-batch"),
    "_prepare_inputs": Called("train(), evaluate(), predict(), per batch"),
    "_prepare_input": Called("train(), evaluate(), predict(), per batch"),
    "_prepare_context_parallel_inputs": Refused("context parallelism is not supported; override _prepare_inputs"),
    "_track_num_input_tokens": Called("train(), per micro-batch"),
    "_clip_grad_norm": Called("train(), per update"),
    "_get_grad_norm": Refused("override _clip_grad_norm, which returns the norm the log reports"),
    "_has_mixed_mesh_grads": Refused("override _clip_grad_norm"),
    "_mixed_mesh_grad_norm": Refused("override _clip_grad_norm"),
    "_defer_fsdp_gradient_reduction": Refused("Lightning's FSDP strategy syncs the gradients on the window's last "
                                              "micro-batch; configure fsdp / fsdp_config"),
    "_sync_replicated_trainable_parameters": Refused("Lightning's strategy keeps the replicated parameters in sync; "
                                                     "configure fsdp / parallelism_config"),
    "_update_auto_batch_size": Refused("auto_find_batch_size retries the run itself; set _train_batch_size before "
                                       "train() for another batch size"),
    "_maybe_log_save_evaluate": Called("train(), at each update boundary"),
    "log": Called("train(), evaluate()"),
    "store_flos": Called("train()"),
    "floating_point_ops": Called("train(), per micro-batch"),
    "get_tp_size": Called("construction, train()"),
    "get_cp_size": Called("train()"),
    "get_sp_size": Called("train()"),
    # ---- evaluation and prediction ------------------------------------------------------------------------------
    "evaluate": Called("train(), at evaluation steps; the user's call"),
    "_evaluate": Called("train(), at evaluation steps"),
    "evaluation_loop": Called("evaluate(), predict()"),
    "prediction_step": Called("evaluate(), predict(), per batch"),
    "predict": Called("the user's call"),
    "_determine_best_metric": Called("train(), after each evaluation"),
    "_nested_gather": Refused("the evaluation loop gathers through the run's strategy; override evaluation_loop "
                              "(the reference has moved this helper out of the Trainer too)"),
    # ---- checkpoints ----------------------------------------------------------------------------------------------
    "_save_checkpoint": Called("train(), at save steps"),
    "_get_output_dir": Called("train(), at save steps"),
    "save_model": Called("train(), at save steps; the user's call"),
    "_save": Called("save_model()"),
    "_save_optimizer_and_scheduler": Called("train(), at save steps"),
    "_save_scaler": Called("train(), at save steps"),
    "_save_rng_state": Called("train(), at save steps"),
    "save_state": UserApi(),
    "_load_from_checkpoint": Called("train(resume_from_checkpoint=...), load_best_model_at_end"),
    "_issue_warnings_after_load": Called("after a checkpoint's weights are loaded"),
    "_load_best_model": Called("the end of train(), with load_best_model_at_end"),
    "_load_optimizer_and_scheduler": Called("train(resume_from_checkpoint=...), once the optimizer exists"),
    "_load_rng_state": Called("train(resume_from_checkpoint=...), where the resumed epoch restores the RNG"),
    "_load_scaler": Called("train(resume_from_checkpoint=...), after the optimizer and scheduler"),
    "_load_callback_state": Called("train(resume_from_checkpoint=...), with restore_callback_states_from_checkpoint"),
    "_rotate_checkpoints": Refused("rotation follows save_total_limit and the tracked best checkpoint; set "
                                   "save_total_limit, or override _save_checkpoint"),
    "_tune_save_checkpoint": Called("hyperparameter_search(backend='ray'), at each evaluation of a step that saves"),
    # ---- Hub, hyperparameter search, metrics files ------------------------------------------------------------------
    "push_to_hub": UserApi(),
    "_push_from_checkpoint": Called("train(), after each save, with push_to_hub"),
    "_finish_current_push": Called("the end of train()"),
    "create_model_card": Called("push_to_hub()"),
    "hyperparameter_search": UserApi(),
    "_hp_search_setup": Called("train()"),
    "_report_to_hp_search": Called("train(), after each evaluation"),
    "log_metrics": UserApi(),
    "save_metrics": UserApi(),
    "metrics_format": UserApi(),
    "is_local_process_zero": Called("construction"),
    "is_world_process_zero": Called("construction, saves"),
    "end": UserApi(),
}


def overrides(cls: type, name: str) -> bool:
    """Whether `cls` defines `name` itself or through a base that is not hf_lightning's own (a library's
    rebuilt class counts as the library's)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            module = klass.__module__ or ""
            ours = module.startswith("hf_lightning.") and not module.startswith("hf_lightning.adapted.")
            return not ours
    return False


_CHECKED: set[type] = set()


def refuse_uncalled_overrides(cls: type) -> None:
    """Raise TypeError naming each overridden method that the engine never calls, and what to override instead."""
    if cls in _CHECKED:
        return
    refused = [
        f"{cls.__qualname__}.{name}: {rule.instead}"
        for name, rule in OVERRIDES.items()
        if isinstance(rule, Refused) and overrides(cls, name)
    ]
    if refused:
        raise TypeError(
            "These methods override transformers.Trainer methods that hf_lightning's engine never calls "
            "(Lightning runs the loop), so the override would be silently bypassed:\n  " + "\n  ".join(refused)
        )
    _CHECKED.add(cls)
