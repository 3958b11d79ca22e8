"""Run state shared with callbacks: `TrainerState`, `TrainerControl` and `ExportableState`.

Mirrors transformers' `trainer_callback.py` field for field, so a `trainer_state.json` written by either
library loads in the other and a user's callback sees the same attribute names.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class TrialReferences(Protocol):
    """What `TrainerState.init_training_references` reads of the trainer: the trial's naming, the process flags."""

    hp_name: Callable[[Any], str] | None
    _trial: Any  # the search's trial (set by `_hp_search_setup`), None outside a search

    def is_local_process_zero(self) -> bool: ...
    def is_world_process_zero(self) -> bool: ...


def is_exportable_state(obj: Any) -> bool:
    """True when `obj` exports its state into checkpoints: ours or transformers' `ExportableState`.

    transformers stays optional, so its `ExportableState` is recognised by class name in the MRO rather than
    by import; either kind implements `state()` and the `from_state` classmethod.
    """
    if isinstance(obj, ExportableState):
        return True
    return any(klass.__name__ == "ExportableState" for klass in type(obj).__mro__) and callable(
        getattr(obj, "state", None)
    )


class ExportableState:
    """A callback (or control) whose state is written into `trainer_state.json` at every checkpoint.

    Subclasses implement `state() -> {"args": {...}, "attributes": {...}}`; `from_state` rebuilds the object
    as `cls(**args)` and sets the attributes, so no pickling is needed.
    """

    def state(self) -> dict:
        raise NotImplementedError("You must implement a `state` function to utilize this class.")

    @classmethod
    def from_state(cls, state: dict) -> Any:
        """Build an instance from a dict returned by `state()`."""
        instance = cls(**state["args"])
        for key, value in state["attributes"].items():
            setattr(instance, key, value)
        return instance


@dataclass
class TrainerState:
    """The trainer's run state, saved as `trainer_state.json` in every checkpoint and passed to callbacks.

    One step is one optimizer update (a whole gradient-accumulation window). Fields, order and defaults are
    those of `transformers.TrainerState`.
    """

    epoch: float = 0
    global_step: int = 0
    max_steps: int = 0
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: int | None = None
    num_train_epochs: int = 0
    num_input_tokens_seen: int = 0
    total_flos: float = 0
    log_history: list[dict[str, float]] | None = None
    best_metric: float | None = None
    best_global_step: int | None = None
    best_model_checkpoint: str | None = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    is_hyper_param_search: bool = False
    trial_name: str | None = None
    trial_params: dict[str, str | float | int | bool] | None = None
    stateful_callbacks: list[Any] | dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.log_history is None:
            self.log_history = []
        if self.stateful_callbacks is None:
            self.stateful_callbacks = {}
        elif isinstance(self.stateful_callbacks, dict):
            # Loaded from a state file: already in the exported form.
            pass
        else:
            self.stateful_callbacks = _export_callback_states(self.stateful_callbacks)

    def save_to_json(self, json_path: str) -> None:
        """Write this state to `json_path` in the reference's layout (indent 2, sorted keys, final newline)."""
        json_string = json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"
        with open(json_path, "w", encoding="utf-8") as f:
            f.write(json_string)

    @classmethod
    def load_from_json(cls, json_path: str) -> TrainerState:
        """Read a state written by `save_to_json` (ours or the reference's)."""
        with open(json_path, encoding="utf-8") as f:
            content = json.loads(f.read())
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(content) - known)
        if unknown:
            raise ValueError(
                f"{json_path} holds TrainerState fields this version does not know: {unknown}. "
                "It was written by a newer library; remove those keys or upgrade hf_lightning."
            )
        return cls(**content)

    def compute_steps(self, args: Any, max_steps: int) -> None:
        """Resolve `logging_steps`, `eval_steps`, `save_steps` of `args` into absolute step counts.

        A value below 1 is a fraction of `max_steps`, rounded up (R2.9); `None` keeps the state's value.
        The arguments are not modified.
        """
        for step_kind in ("logging", "eval", "save"):
            num_steps = getattr(args, f"{step_kind}_steps")
            if num_steps is not None:
                if num_steps < 1:
                    num_steps = math.ceil(max_steps * num_steps)
                setattr(self, f"{step_kind}_steps", num_steps)

    def init_training_references(
        self, trainer: TrialReferences, max_steps: int, num_train_epochs: int, trial: Any
    ) -> None:
        """Store the run's references at train start: trial name and params, step budget, process flags.

        `trainer` provides `hp_name`, `_trial`, `is_local_process_zero()` and `is_world_process_zero()`
        (`TrialReferences`), as the reference's Trainer does.
        """
        if trainer.hp_name is not None and trainer._trial is not None:
            # The trial kept on the trainer, because under DDP the HP search only calls the trainer's setup.
            self.trial_name = trainer.hp_name(trainer._trial)
        self.trial_params = None
        if trial is not None:
            self.trial_params = hp_params(trial)
        self.max_steps = max_steps
        self.num_train_epochs = num_train_epochs
        self.is_local_process_zero = trainer.is_local_process_zero()
        self.is_world_process_zero = trainer.is_world_process_zero()


def hp_params(trial: Any) -> dict[str, Any]:
    """The hyperparameters of an HP-search trial: an optuna trial's `params`, or a dict (ray / wandb)."""
    if isinstance(trial, dict):
        return trial
    try:
        import optuna
    except ImportError:
        optuna = None
    if optuna is not None and isinstance(trial, optuna.trial.BaseTrial):
        return trial.params
    raise RuntimeError(f"Unknown type for trial {trial.__class__}")


def _export_callback_states(callbacks: list[Any]) -> dict[str, Any]:
    """Map class name -> `state()`; several instances of one class become a list, in order."""
    states: dict[str, Any] = {}
    for callback in callbacks:
        if not is_exportable_state(callback):
            raise TypeError(
                "All callbacks passed to be saved must inherit `ExportableState`, but received "
                f"{type(callback)}"
            )
        name = callback.__class__.__name__
        if name in states:
            if not isinstance(states[name], list):
                states[name] = [states[name]]
            states[name].append(callback.state())
        else:
            states[name] = callback.state()
    return states


@dataclass
class TrainerControl(ExportableState):
    """Switches callbacks flip to steer the loop: stop training or the epoch, save, evaluate, log.

    `should_training_stop` is only reset at train begin, `should_epoch_stop` at epoch begin, and the three
    per-step flags at step begin (the callback handler does these resets).
    """

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False

    def _new_training(self) -> None:
        """Reset the flag for a new training."""
        self.should_training_stop = False

    def _new_epoch(self) -> None:
        """Reset the flag for a new epoch."""
        self.should_epoch_stop = False

    def _new_step(self) -> None:
        """Reset the per-step flags for a new step."""
        self.should_save = False
        self.should_evaluate = False
        self.should_log = False

    def state(self) -> dict:
        return {
            "args": {
                "should_training_stop": self.should_training_stop,
                "should_epoch_stop": self.should_epoch_stop,
                "should_save": self.should_save,
                "should_evaluate": self.should_evaluate,
                "should_log": self.should_log,
            },
            "attributes": {},
        }
