"""`TrainerCallback` (the events a callback can handle) and `CallbackHandler` (calls them in order).

Mirrors transformers' classes of the same names. The handler also accepts transformers' callbacks (any
object with `on_*` event methods), which then receive our `TrainingArguments`, `TrainerState` and
`TrainerControl`: the attribute names are the reference's. The reference's integration callbacks (`report_to`'s
carriers) get the arguments pickled without their tokens (args/token_free_pickle.py).
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

from hf_lightning.args.token_free_pickle import token_free_pickle, write_back
from hf_lightning.callbacks.state import TrainerControl, TrainerState

logger = logging.getLogger(__name__)

# Every event of the reference's TrainerCallback, in its declaration order.
EVENTS: tuple[str, ...] = (
    "on_init_end",
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_step_begin",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_substep_end",
    "on_step_end",
    "on_evaluate",
    "on_predict",
    "on_save",
    "on_log",
    "on_prediction_step",
    "on_push_begin",
)
# The module of the reference's integration callbacks: their model-logging switches pickle the arguments to disk.
INTEGRATIONS_MODULE = "transformers.integrations"


class TrainerCallback:
    """Base class of objects that watch the training loop at its events and steer it through `control`.

    Every event receives `(args, state, control)` positionally and, as keywords, `model`,
    `processing_class`, `optimizer`, `lr_scheduler`, `train_dataloader`, `eval_dataloader` (plus `logs` for
    `on_log` and `metrics` for `on_evaluate` / `on_predict`). An event may return a `TrainerControl`, which
    then replaces the one passed to the following callbacks and to the trainer.
    """

    def on_init_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Event called at the end of the trainer's `__init__`."""

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Event called at the beginning of training."""

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Event called at the end of training."""

    def on_epoch_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Event called at the beginning of an epoch."""

    def on_epoch_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Event called at the end of an epoch."""

    def on_step_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Event called at the beginning of an optimizer step (before its first micro-batch)."""

    def on_pre_optimizer_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> Any:
        """Event called after gradient clipping, before `optimizer.step()`."""

    def on_optimizer_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> Any:
        """Event called after `optimizer.step()`, before the gradients are zeroed."""

    def on_substep_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Event called after each non-final micro-batch of a gradient-accumulation window."""

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Event called at the end of an optimizer step, after `global_step` and `epoch` are updated."""

    def on_evaluate(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Event called after an evaluation phase (`metrics` in kwargs)."""

    def on_predict(
        self, args: Any, state: TrainerState, control: TrainerControl, metrics: Any, **kwargs: Any
    ) -> Any:
        """Event called after a successful prediction."""

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Event called after a checkpoint save."""

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Event called after logging (`logs` in kwargs)."""

    def on_prediction_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> Any:
        """Event called after each evaluation or prediction batch."""

    def on_push_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Event called before pushing the model (or a checkpoint) to the Hub."""


def _is_default_flow(callback: Any) -> bool:
    # By class name, so transformers' DefaultFlowCallback counts too without importing transformers.
    return any(klass.__name__ == "DefaultFlowCallback" for klass in type(callback).__mro__)


# Modules of the two libraries whose stock callback classes stand for each other by name.
_CALLBACK_LIBRARIES = ("transformers.", "hf_lightning.")


def _is_stock(klass: type) -> bool:
    return klass.__module__.startswith(_CALLBACK_LIBRARIES)


def _same_kind(klass: type, other: type) -> bool:
    """`klass` is `other`, or both are the stock class of one name in the two libraries (a script imports
    `PrinterCallback` from transformers while this handler holds ours)."""
    return klass is other or (_is_stock(klass) and _is_stock(other) and klass.__name__ == other.__name__)


def _is_instance(callback: Any, klass: type) -> bool:
    """`isinstance`, with either library's stock class standing for the other's (by name, no import)."""
    if isinstance(callback, klass):
        return True
    return _is_stock(klass) and any(_same_kind(klass, base) for base in type(callback).__mro__)


def _check_is_callback(callback: Any) -> None:
    """Refuse objects that handle no event at all: they are almost certainly passed by mistake."""
    if isinstance(callback, TrainerCallback):
        return
    if not any(callable(getattr(callback, event, None)) for event in EVENTS):
        raise TypeError(
            f"callbacks: {callback!r} has none of the event methods {', '.join(EVENTS)}. Pass a "
            "TrainerCallback subclass (ours or transformers'), its instance, or an object with on_* methods."
        )


class CallbackHandler(TrainerCallback):
    """Calls the registered callbacks in list order for each event, resetting control flags as the reference.

    Before dispatching: `on_train_begin` clears `should_training_stop`, `on_epoch_begin` clears
    `should_epoch_stop`, `on_step_begin` clears log/evaluate/save, and `on_log` / `on_evaluate` / `on_save`
    clear their own flag.
    """

    def __init__(
        self,
        callbacks: list[Any],
        model: Any,
        processing_class: Any,
        optimizer: Any,
        lr_scheduler: Any,
    ) -> None:
        self.callbacks: list[Any] = []
        for callback in callbacks:
            self.add_callback(callback)
        self.model = model
        self.processing_class = processing_class
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.train_dataloader: Any = None
        self.eval_dataloader: Any = None

        if not any(_is_default_flow(callback) for callback in self.callbacks):
            logger.warning(
                "The Trainer will not work properly if you don't have a `DefaultFlowCallback` in its callbacks. You\n"
                "should add one before training with `trainer.add_callback(DefaultFlowCallback). The current list of"
                "callbacks is\n:" + self.callback_list
            )

    def add_callback(self, callback: Any) -> None:
        """Append a callback (a class is instantiated); warns when one of the same class is already there."""
        instance = callback() if isinstance(callback, type) else callback
        _check_is_callback(instance)
        callback_class = callback if isinstance(callback, type) else callback.__class__
        if any(_same_kind(callback_class, existing.__class__) for existing in self.callbacks):
            logger.warning(
                f"You are adding a {callback_class} to the callbacks of this Trainer, but there is already one. "
                "The current list of callbacks is\n:" + self.callback_list
            )
        self.callbacks.append(instance)

    def pop_callback(self, callback: Any) -> Any:
        """Remove and return the first callback of that class (or that instance); `None` if absent.

        A stock class of either library finds the other's (`pop_callback(transformers.ProgressCallback)`).
        """
        if isinstance(callback, type):
            for existing in self.callbacks:
                if _is_instance(existing, callback):
                    self.callbacks.remove(existing)
                    return existing
        else:
            for existing in self.callbacks:
                if existing == callback:
                    self.callbacks.remove(existing)
                    return existing
        return None

    def remove_callback(self, callback: Any) -> None:
        """Remove the first callback of that class (absent: no-op), or that instance (absent: ValueError).

        A stock class of either library finds the other's (`remove_callback(transformers.PrinterCallback)`).
        """
        if isinstance(callback, type):
            for existing in self.callbacks:
                if _is_instance(existing, callback):
                    self.callbacks.remove(existing)
                    return
        else:
            self.callbacks.remove(callback)

    @property
    def callback_list(self) -> str:
        """The class names of the registered callbacks, one per line."""
        return "\n".join(callback.__class__.__name__ for callback in self.callbacks)

    def on_init_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        return self.call_event("on_init_end", args, state, control, **kwargs)

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        control.should_training_stop = False
        return self.call_event("on_train_begin", args, state, control, **kwargs)

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        return self.call_event("on_train_end", args, state, control, **kwargs)

    def on_epoch_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        control.should_epoch_stop = False
        return self.call_event("on_epoch_begin", args, state, control, **kwargs)

    def on_epoch_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        return self.call_event("on_epoch_end", args, state, control, **kwargs)

    def on_step_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        control.should_log = False
        control.should_evaluate = False
        control.should_save = False
        return self.call_event("on_step_begin", args, state, control, **kwargs)

    def on_pre_optimizer_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> Any:
        return self.call_event("on_pre_optimizer_step", args, state, control, **kwargs)

    def on_optimizer_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> Any:
        return self.call_event("on_optimizer_step", args, state, control, **kwargs)

    def on_substep_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        return self.call_event("on_substep_end", args, state, control, **kwargs)

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        return self.call_event("on_step_end", args, state, control, **kwargs)

    def on_evaluate(
        self, args: Any, state: TrainerState, control: TrainerControl, metrics: Any, **kwargs: Any
    ) -> Any:
        control.should_evaluate = False
        return self.call_event("on_evaluate", args, state, control, metrics=metrics, **kwargs)

    def on_predict(
        self, args: Any, state: TrainerState, control: TrainerControl, metrics: Any, **kwargs: Any
    ) -> Any:
        return self.call_event("on_predict", args, state, control, metrics=metrics, **kwargs)

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        control.should_save = False
        return self.call_event("on_save", args, state, control, **kwargs)

    def on_log(
        self, args: Any, state: TrainerState, control: TrainerControl, logs: Any, **kwargs: Any
    ) -> Any:
        control.should_log = False
        return self.call_event("on_log", args, state, control, logs=logs, **kwargs)

    def on_prediction_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> Any:
        return self.call_event("on_prediction_step", args, state, control, **kwargs)

    def on_push_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        return self.call_event("on_push_begin", args, state, control, **kwargs)

    def call_event(
        self, event: str, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> Any:
        """Call `event` on every callback in order; a non-None return replaces `control` from then on."""
        no_ops = _base_no_ops("transformers.trainer_callback" in sys.modules)
        for callback in self.callbacks:
            handler = getattr(callback, event, None)
            if handler is None or getattr(handler, "__func__", None) in no_ops:
                # A duck-typed callback without this event, or the base class's empty method (returns None):
                # skipping it changes nothing and saves a call with ten arguments per event.
                continue
            # Never a token in the training_args.bin an integration's model logging writes (its fake Trainer).
            integration = type(callback).__module__.startswith(INTEGRATIONS_MODULE)
            callback_args = token_free_pickle(args) if integration else args
            result = handler(
                callback_args,
                state,
                control,
                model=self.model,
                processing_class=self.processing_class,
                optimizer=self.optimizer,
                lr_scheduler=self.lr_scheduler,
                train_dataloader=self.train_dataloader,
                eval_dataloader=self.eval_dataloader,
                **kwargs,
            )
            write_back(callback_args, args)
            if result is not None:
                control = result
        return control


@functools.cache
def _base_no_ops(reference_loaded: bool) -> frozenset:
    """The empty event methods of our `TrainerCallback` and, once transformers' callbacks module is loaded, of
    its `TrainerCallback` too (the same no-ops, inherited by callbacks written for the reference)."""
    functions = {value for name, value in vars(TrainerCallback).items() if name.startswith("on_")}
    if reference_loaded:
        reference = sys.modules["transformers.trainer_callback"].TrainerCallback
        functions |= {value for name, value in vars(reference).items() if name.startswith("on_")}
    return frozenset(functions)
