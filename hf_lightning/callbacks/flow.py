"""`DefaultFlowCallback`: decides when the loop logs, evaluates, saves and stops (the reference's rules)."""

from __future__ import annotations

from typing import Any

from hf_lightning.callbacks.base import TrainerCallback
from hf_lightning.callbacks.state import TrainerControl, TrainerState
from hf_lightning.core.enums import enum_value


class DefaultFlowCallback(TrainerCallback):
    """Sets `should_log` / `should_evaluate` / `should_save` / `should_training_stop` at step and epoch ends.

    Reads the strategies from `args` and the resolved step intervals from `state` (CB-4.6, EVAL-2.16).
    """

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        logging_strategy = enum_value(args.logging_strategy)
        eval_strategy = enum_value(args.eval_strategy)
        save_strategy = enum_value(args.save_strategy)

        if state.global_step == 1 and args.logging_first_step:
            control.should_log = True
        if logging_strategy == "steps" and state.global_step % state.logging_steps == 0:
            control.should_log = True

        if (
            eval_strategy == "steps"
            and state.global_step % state.eval_steps == 0
            and args.eval_delay <= state.global_step
        ):
            control.should_evaluate = True

        if save_strategy == "steps" and state.save_steps > 0 and state.global_step % state.save_steps == 0:
            control.should_save = True

        if state.global_step >= state.max_steps:
            control.should_training_stop = True
            # Evaluate at the end unless this step already evaluates (no duplicate evaluation).
            if (
                eval_strategy == "steps"
                and state.global_step % state.eval_steps != 0
                and args.eval_delay <= state.global_step
            ):
                control.should_evaluate = True
            # Always save the final step under the steps strategy (no forced log, though).
            if save_strategy == "steps":
                control.should_save = True

        return control

    def on_epoch_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        if enum_value(args.logging_strategy) == "epoch":
            control.should_log = True
        # eval_delay counts (float) epochs under the epoch strategy.
        if enum_value(args.eval_strategy) == "epoch" and args.eval_delay <= state.epoch:
            control.should_evaluate = True
        if enum_value(args.save_strategy) == "epoch":
            control.should_save = True
        return control
