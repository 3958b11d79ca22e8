"""`RunGuard`: an opt-in Lightning callback that catches loss spikes, NaN/Inf and bad batches, and skips, rolls back
or stops (README, "When a batch goes bad").

It watches each update's training loss (the sum of its window's micro-batch losses, averaged over processes) and,
optionally, its gradient norm, with Lightning's `SpikeDetection` (its running window, warmup, mode, atol and rtol;
one detector per watched value); a non-finite loss or gradient norm is always an event. The engine feeds it from
inside the training step (engine/module.py), so Lightning's loop calls nothing of it per batch: each update's values
stay on the device until the next decision, at a training log (one all-reduce and one host read there, plus one
collective making FSDP2's sharded gradient norms whole; nothing on other steps), so a decision lags by at most one
logging window.
- `skip`: the update of an offending window is not applied (weights, optimizer state, scheduler, step counter and
  random state as if its micro-batches were absent; their loss leaves the logged loss). At train start, and at a
  decision that finds nothing once the time since the last copy is 100 times its cost, the run is kept in CPU memory,
  one copy of the model and optimizer state (engine/guard_snapshot.py); on an event the run goes back to it and
  makes the updates since again without the window.
- `rollback` reloads the newest complete checkpoint written before the event, in the same process, takes the
  offending window out of the path and continues; `stop` saves a checkpoint and ends `train()` with `RunGuardStop`
  naming the step, the value, the window mean and the batches.
Every event is logged under `guard/` to the loggers, kept in `RunGuard.events` and listed at the end of `train()`;
after `max_events` events within `within_steps` updates the guard stops instead of looping.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import TYPE_CHECKING, Any, Protocol

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.fabric.utilities.spike import SpikeDetection

from hf_lightning.core.enums import enum_value
from hf_lightning.engine.guard_path import SkippedWindow, checkpoint_before
from hf_lightning.engine.guard_snapshot import (
    GuardSnapshot,
    SnapshotSource,
    refuse_unsnapshottable,
    remove_snapshot_folder,
)

if TYPE_CHECKING:
    from hf_lightning.callbacks import TrainerControl, TrainerState

logger = logging.getLogger(__name__)

ACTIONS = ("stop", "skip", "rollback")
METRICS = ("loss", "grad_norm")
# Updates between two decisions when the run does not log training by steps (and no check_every_n_steps is set).
_UNLOGGED_CHECK_EVERY = 50


class GuardedTrainer(SnapshotSource, Protocol):
    """The trainer as the run guard sees it: the state and control it reads and stops, the loggers its events go to
    and the run folder its checkpoints are in (and, for `skip`, what the snapshot reads)."""

    state: TrainerState
    control: TrainerControl
    lightning_trainer: pl.Trainer | None

    def _get_output_dir(self, trial: Any) -> str: ...


class RunGuardStop(RuntimeError):
    """`train()` ended by the run guard (action `stop`, or too many events): the message names what happened."""


class RunGuard(pl.Callback):
    """Catch loss spikes, NaN/Inf losses and bad batches; `skip`, `rollback` or `stop` (opt-in; README).

    Args:
        action: "stop" (save, then end `train()` with `RunGuardStop`), "skip" (the offending update is not applied;
            keeps one CPU copy of the model and optimizer state, renewed at decisions within 1% of the run: pick
            "rollback" for a model whose copy does not fit in host memory) or "rollback" (reload the newest complete
            checkpoint before the event, leave the offending window out, continue).
        loss: watch the training loss for spikes.
        grad_norm: also watch the gradient norm for spikes (non-finite values of both are always events).
        mode, window, warmup, atol, rtol: Lightning's `SpikeDetection` settings: a value that is not better (per
            `mode`) than the previous one and off the running mean of the last `window` values by at least `atol`
            and `rtol` x mean is a spike, once `warmup` values have been seen.
        max_events: events within `within_steps` updates after which the guard stops instead of acting again.
        check_every_n_steps: decide also every this many updates; by default at each training log, or every 50
            updates when training is not logged by steps.
    """

    def __init__(
        self,
        action: str = "stop",
        *,
        loss: bool = True,
        grad_norm: bool = False,
        mode: str = "min",
        window: int = 10,
        warmup: int = 1,
        atol: float | None = None,
        rtol: float | None = 2.0,
        max_events: int = 3,
        within_steps: int = 1000,
        check_every_n_steps: int | None = None,
    ) -> None:
        _check_settings(action, mode, window, warmup, max_events, within_steps, check_every_n_steps)
        self.action = action
        self.watched = tuple(name for name, on in (("loss", loss), ("grad_norm", grad_norm)) if on)
        self.detection = {"mode": mode, "window": window, "warmup": warmup, "atol": atol, "rtol": rtol}
        self.max_events = max_events
        self.within_steps = within_steps
        self.check_every_n_steps = check_every_n_steps
        self.events: list[dict[str, Any]] = []  # this train()'s events (README, "When a batch goes bad")
        self.summary: dict[str, Any] | None = None  # the last train()'s events and windows taken out
        self._pending: list[tuple[int, list, Any, tuple[int, int, int]]] = []
        self._history: list[tuple[int, list[float]]] = []  # (step, values) of the updates accepted
        self._detectors: dict[str, SpikeDetection] = {}
        self.rollbacks = 0
        self._snapshot = GuardSnapshot()  # `skip`: the run at a recent decision (engine/guard_snapshot.py)
        self._renew_snapshot = False  # the last decision agreed to renew it

    # ---- a train() ---------------------------------------------------------------------------------------------
    def begin_train(self, facade: GuardedTrainer) -> None:
        """A fresh `train()`: no events, an empty running window (`skip` with what it cannot snapshot refused)."""
        if self.action == "skip":
            refuse_unsnapshottable(facade)
        self.events, self.summary, self.rollbacks = [], None, 0
        self._snapshot.clear()
        self._rewind(-1)

    def _rewind(self, step: int) -> None:
        """The detectors as they stood after update `step` (the updates accepted up to it fed again)."""
        self._pending = []
        self._history = [entry for entry in self._history if entry[0] <= step]
        self._detectors = {name: _detector(self.detection) for name in self.watched}
        for _, values in self._history:
            self._feed(values)

    def finish(self, run: Any) -> None:
        """At the end of `train()`: the summary, printed when something happened."""
        self.summary = {
            "events": list(self.events),
            "skipped_windows": run.skipped_windows.as_json(),
            "rollbacks": self.rollbacks,
        }
        self._snapshot.clear()
        remove_snapshot_folder(run.facade, run.facade._get_output_dir(trial=run.trial))
        if self.events:
            lines = [f"RunGuard: {len(self.events)} event(s) in this run"] + [_event_line(e) for e in self.events]
            logger.warning("\n  ".join(lines))

    # ---- fed by the training step (engine/module.py) ---------------------------------------------------------------
    def at_epoch_start(self, facade: GuardedTrainer, run: Any) -> None:
        """`skip`: the state at the start of a fresh run (epoch 0, no update yet), the snapshot the first decision
        window goes back to (a resumed run goes back to the checkpoint it resumed from)."""
        if self.action == "skip" and self._snapshot.staged is None and facade.state.global_step == 0:
            if run.resume.point is None:
                self._snapshot.take(facade, run)

    def record(self, step: int, losses: list, grad_norm: Any, window: tuple[int, int, int]) -> None:
        """Keep this update's values (device tensors, no host read) for the next decision."""
        self._pending.append((step, losses, grad_norm, window))

    def due(self, should_log: bool, state: Any, args: Any) -> bool:
        """Whether to decide at this step boundary: at a training log, or after enough unlogged updates."""
        if not self._pending:
            return False
        if should_log:
            return True
        every = self.check_every_n_steps
        if every is None:
            by_steps = enum_value(args.logging_strategy) == "steps"
            every = max(1, int(state.logging_steps)) if by_steps and state.logging_steps else _UNLOGGED_CHECK_EVERY
        return len(self._pending) >= every

    def decide(self, facade: GuardedTrainer, run: Any, at_end: bool = False) -> None:
        """Judge the updates since the last decision (one all-reduce, one host read)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        rows = _window_values(pending)
        if self.action == "skip":  # whether to renew the snapshot after this decision, agreed in the same all-reduce
            due = float(self._snapshot.due())
            rows = torch.cat([rows, torch.tensor([[due, due]], device=rows.device)])
        reduced = _reduced(rows).tolist()
        if self.action == "skip":
            self._renew_snapshot = reduced.pop()[0] > 0  # any process due: all renew
        for (step, _, _, window), values in zip(pending, reduced):
            verdict = self._judge(values)
            if verdict is None:
                self._accept(step, values)
                continue
            reason = "action='stop'"
            if self.action != "stop":
                if self._too_many(step):
                    reason = self._too_many_reason()
                elif (found := self._restart_point(facade, run, step)) is None:
                    reason = "no complete checkpoint to roll back to precedes the event"
                else:
                    self._rollback(facade, run, self._event(facade, step, verdict, window, self.action), found)
                    return
            self._stop(facade, run, self._event(facade, step, verdict, window, "stop"), save_now=at_end, reason=reason)
            return

    def after_decision(self, facade: GuardedTrainer, run: Any) -> None:
        """`skip`: at the end of a step boundary whose decision accepted every update (logged, evaluated, saved),
        the snapshot a later event goes back to."""
        if self.action == "skip" and not run.guard_halted and self._renew_snapshot:
            self._snapshot.take(facade, run)
            self._renew_snapshot = False

    def _restart_point(self, facade: GuardedTrainer, run: Any, step: int) -> tuple[int, str] | None:
        """(step, folder) the run goes back to for an event at update `step`: `skip`'s snapshot written out, else
        (`rollback`, or `skip` in the first window after a resume) the newest complete checkpoint before it."""
        run_dir = facade._get_output_dir(trial=run.trial)
        snapshot = self._snapshot
        if self.action == "skip" and snapshot.step is not None and snapshot.step < step:
            run.rollback_continuation = snapshot.continue_run
            return snapshot.step, snapshot.write(facade, run_dir)
        return checkpoint_before(run_dir, step)

    # ---- judging (Lightning's SpikeDetection) ---------------------------------------------------------------------
    def _judge(self, values: list[float]) -> tuple[str, float, float] | None:
        """(metric, value, window mean) of the first offending value, or None."""
        for name, value in zip(METRICS, values):
            detector = self._detectors.get(name)
            if not math.isfinite(value):
                return name, value, _mean(detector)
            if detector is not None and len(self._history) >= self.detection["warmup"]:
                if detector._is_spike(np.float32(value)):
                    return name, value, _mean(detector)
        return None

    def _accept(self, step: int, values: list[float]) -> None:
        self._history.append((step, values))
        self._feed(values)

    def _feed(self, values: list[float]) -> None:
        for name, value in zip(METRICS, values):
            detector = self._detectors.get(name)
            if detector is not None:
                detector._update_stats(np.float32(value))

    def _too_many_reason(self) -> str:
        return f"{self.max_events} events within {self.within_steps} updates (max_events={self.max_events})"

    def _too_many(self, step: int) -> bool:
        recent = [event for event in self.events if event["step"] > step - self.within_steps]
        return len(recent) >= self.max_events

    # ---- acting ------------------------------------------------------------------------------------------------------
    def _event(self, facade: GuardedTrainer, step: int, verdict: tuple, window: tuple[int, int, int], action: str) -> dict:
        metric, value, reference = verdict
        epoch, first, count = window
        event = {
            "step": step, "metric": metric, "value": value, "reference": reference, "action": action,
            "epoch": epoch, "batches": [first, first + count - 1],
        }  # fmt: skip
        self.events.append(event)
        logger.warning(_event_line(event))
        lightning_trainer = facade.lightning_trainer
        if lightning_trainer is not None:
            metrics = {
                f"guard/{metric}": value, "guard/reference": reference, f"guard/action_{action}": 1.0,
                "guard/epoch": float(epoch), "guard/first_batch": float(first), "guard/last_batch": float(first + count - 1),
            }  # fmt: skip
            for lightning_logger in lightning_trainer.loggers:
                lightning_logger.log_metrics(metrics, step=step)
        return event

    def _rollback(self, facade: GuardedTrainer, run: Any, event: dict, found: tuple[int, str]) -> None:
        saved_step, checkpoint = found
        epoch, (first, last) = event["epoch"], event["batches"]
        run.skipped_windows.add(SkippedWindow(epoch, first, last - first + 1, at_step=event["step"] - 1))
        run.rollback_to = checkpoint
        run.guard_halted = True
        self.rollbacks += self.action == "rollback"
        self._rewind(saved_step)
        control = facade.control
        control.should_evaluate = control.should_save = False
        control.should_training_stop = True
        where = f"the state kept at step {saved_step}" if self.action == "skip" else f"{checkpoint} (step {saved_step})"
        logger.warning(f"RunGuard: rolling back to {where} and leaving those batches out.")

    def _stop(self, facade: GuardedTrainer, run: Any, event: dict, save_now: bool, reason: str) -> None:
        control = facade.control
        control.should_training_stop = True
        run.guard_halted = True
        if save_now:
            run.checkpointing.save_at_step_boundary(run.trial)
        else:
            control.should_save = True  # saved at this step boundary, right after the decision
        found = checkpoint_before(facade._get_output_dir(trial=run.trial), event["step"])
        # `skip` is named only where it runs (refused with FSDP, DeepSpeed, tensor parallelism, ignore_data_skip).
        can_skip = facade._checkpoint_io.supports_background_writes and not facade.plan.checkpointing.ignore_data_skip
        run.guard_stop = _stop_message(event, facade.state.global_step, found, reason, can_skip)


def _check_settings(action, mode, window, warmup, max_events, within_steps, check_every_n_steps) -> None:
    problems = []
    if action not in ACTIONS:
        problems.append(f"action={action!r}: use one of {ACTIONS}")
    if mode not in ("min", "max"):
        problems.append(f"mode={mode!r}: use 'min' (a loss) or 'max'")
    for name, value, low in (("window", window, 1), ("warmup", warmup, 0), ("max_events", max_events, 1),
                             ("within_steps", within_steps, 1)):  # fmt: skip
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            problems.append(f"{name}={value!r}: use an integer >= {low}")
    if check_every_n_steps is not None and (not isinstance(check_every_n_steps, int) or check_every_n_steps < 1):
        problems.append(f"check_every_n_steps={check_every_n_steps!r}: use a positive integer or None")
    if problems:
        raise ValueError("RunGuard: " + "; ".join(problems))


class _WindowMean:
    """The running mean Lightning's `SpikeDetection` keeps, torchmetrics' `Running(MeanMetric(), window)`, computed as
    it does (a float32 sum over the window's slots in slot order, over the count; NaN while empty), as a NumPy float32
    scalar, without torchmetrics' per-update cost (about 0.3 ms a value on CPU, paid for every update of a logging
    window)."""

    def __init__(self, window: int) -> None:
        self.slots = [np.float32(0.0)] * window
        self.seen = 0

    def update(self, value: np.float32) -> None:
        self.slots[self.seen % len(self.slots)] = np.float32(value)
        self.seen += 1

    def compute(self) -> np.float32:
        count = min(self.seen, len(self.slots))
        if count == 0:
            return np.float32(math.nan)
        total = np.float32(0.0)
        for value in self.slots:
            total = total + value  # float32 + float32: float32
        return total / np.float32(count)


def _detector(settings: dict[str, Any]) -> SpikeDetection:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detector = SpikeDetection(finite_only=True, **settings)
    # Lightning's judgement (`_is_spike`, `_update_stats`, its atol / rtol / mode checks) on float32 scalars, as its
    # tensors compute them, a few microseconds a value: the window mean above, every operand float32 (NumPy 1 would
    # widen a float32 by a Python float to float64). Non-finite values are events before the detector is asked.
    detector.running_mean = _WindowMean(settings["window"])
    detector.last_val = np.float32(0.0)
    detector.atol = None if detector.atol is None else np.float32(detector.atol)
    detector.rtol = None if detector.rtol is None else np.float32(detector.rtol)
    detector.finite_only = False
    return detector


def _mean(detector: SpikeDetection | None) -> float:
    if detector is None:
        return math.nan
    return float(detector.running_mean.compute())


def _window_values(pending: list) -> torch.Tensor:
    """The (loss, grad norm) rows of the updates since the last decision, float32 on the loss's device: stacked
    column by column when each update has one loss and a norm tensor (the usual case), else update by update."""
    losses = [entry[1] for entry in pending]
    norms = _whole_norms([entry[2] for entry in pending])
    if all(len(terms) == 1 for terms in losses) and all(isinstance(norm, torch.Tensor) for norm in norms):
        loss_column = torch.stack([terms[0].detach().reshape(()) for terms in losses]).float()
        norm_column = torch.stack([norm.detach().reshape(()) for norm in norms]).float().to(loss_column.device)
        return torch.stack([loss_column, norm_column], dim=1)
    return torch.stack([_update_values(terms, norm) for terms, norm in zip(losses, norms)])


def _whole_norms(norms: list) -> list:
    """The gradient norms as plain tensors: FSDP2's are DTensors still to be reduced across shards (torch's
    `clip_grad_norm_` leaves them so), made whole together in one collective, as every process decides at once."""
    sharded = [index for index, norm in enumerate(norms) if hasattr(norm, "full_tensor")]
    if not sharded:
        return norms
    whole = torch.stack([norms[index].detach().float().reshape(()) for index in sharded]).full_tensor()
    norms = list(norms)
    for index, value in zip(sharded, whole.unbind()):
        norms[index] = value
    return norms


def _update_values(losses: list, grad_norm: Any) -> torch.Tensor:
    """One update's (loss, grad norm) as a float32 tensor on the loss's device (no host read)."""
    loss = losses[0].detach().float()
    for term in losses[1:]:
        loss = loss + term.detach().float()
    if isinstance(grad_norm, torch.Tensor):
        norm = grad_norm.detach().float().to(loss.device)
    else:
        norm = torch.tensor(math.nan if grad_norm is None else float(grad_norm), device=loss.device)
    return torch.stack([loss.reshape(()), norm.reshape(())])


def _reduced(rows: torch.Tensor) -> torch.Tensor:
    """The rows averaged over processes (one all-reduce; a non-finite value on any process stays non-finite)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
        if world > 1:
            rows = rows.clone()
            torch.distributed.all_reduce(rows)
            rows /= world
    return rows


def _event_line(event: dict[str, Any]) -> str:
    first, last = event["batches"]
    return (
        f"RunGuard: step {event['step']}: {event['metric']}={event['value']:.6g} against a window mean of "
        f"{event['reference']:.6g}; batches {first}..{last} of epoch {event['epoch']} (positions in the train "
        f"loader's order); action: {event['action']}"
    )


def _stop_message(event: dict, global_step: int, found: tuple[int, str] | None, reason: str, can_skip: bool) -> str:
    first, last = event["batches"]
    actions = "RunGuard(action='rollback') or 'skip'" if can_skip else "RunGuard(action='rollback')"
    where = (
        f"{found[1]} (step {found[0]}) is the newest complete checkpoint before the event: resume from it with "
        f"{actions} to leave these batches out"
        if found is not None
        else "no complete checkpoint precedes the event (save more often: save_steps)"
    )
    return (
        f"RunGuard stopped training at step {global_step} ({reason}): {event['metric']}={event['value']:.6g} at step "
        f"{event['step']} against a window mean of {event['reference']:.6g}, from batches {first}..{last} of epoch "
        f"{event['epoch']} (positions in the train loader's order). A checkpoint of step {global_step} is saved; "
        f"{where}."
    )
