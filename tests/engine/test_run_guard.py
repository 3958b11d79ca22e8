"""The run guard (engine/run_guard.py): with an injected bad window, `skip` and `rollback` give weights bit-identical
to a run whose sampler order simply lacks that window's examples; `stop` saves and ends naming what happened; the
guard without an event changes nothing."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import IterableDataset, Sampler

from hf_lightning import RunGuard, RunGuardStop, Trainer, TrainingArguments
from hf_lightning.checkpoint.files import is_complete_checkpoint
from tests.models import DropoutMLP, ListDataset, regression_data

BATCH = 2
# Spikes far off the running mean only: the per-update loss of this tiny model is noisy.
SETTINGS = {"window": 4, "warmup": 2, "rtol": 50.0}


class OrderSampler(Sampler):
    """The examples in the given order (a reference run's order lacks the bad ones)."""

    def __init__(self, order: list[int]) -> None:
        self.order = list(order)

    def __iter__(self):
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


class OrderedTrainer(Trainer):
    order: list[int] = []

    def _get_train_sampler(self, train_dataset=None):
        return OrderSampler(self.order)


class Stream(IterableDataset):
    """The same examples as an unsized stream (iterable / streamed data)."""

    def __init__(self, items: list[dict]) -> None:
        self.items = items

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is None:
            return iter(self.items)
        # Worker w yields batches w, w + workers, ...: the loader's round-robin order is the stream's order.
        batches = [self.items[i : i + BATCH] for i in range(0, len(self.items), BATCH)]
        return (item for batch in batches[info.id :: info.num_workers] for item in batch)


def _items(n: int, bad: list[int], kind: str) -> list[dict]:
    items = [dict(item) for item in regression_data(n).items]
    for index in bad:
        items[index]["labels"] = torch.tensor(math.nan if kind == "nan" else 1e4)
    return items


def _bad_window(window: int, ga: int) -> list[int]:
    """The example indices of update `window` (0-based) in the natural order."""
    return list(range(window * ga * BATCH, (window + 1) * ga * BATCH))


def _train(tmp_path, name, *, ga, order, items, data="map", guard=None, max_steps=8, save_steps=2, resume=None,
           workers=0, logging_steps=2, **extra):  # fmt: skip
    args = TrainingArguments(
        output_dir=str(tmp_path / name), report_to="none", disable_tqdm=True, use_cpu=True, seed=0,
        per_device_train_batch_size=BATCH, gradient_accumulation_steps=ga, max_steps=max_steps, learning_rate=0.05,
        logging_steps=logging_steps, save_steps=save_steps, save_strategy="steps" if save_steps else "no",
        lr_scheduler_type="linear", dataloader_num_workers=workers, **extra,
    )  # fmt: skip
    if data == "map":
        dataset = ListDataset(items)
        trainer_class = type("Ordered", (OrderedTrainer,), {"order": order})
    else:
        dataset = Stream([items[i] for i in order])
        trainer_class = Trainer
    trainer = trainer_class(
        model=DropoutMLP(seed=0), args=args, train_dataset=dataset, callbacks=[] if guard is None else [guard]
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in trainer.model.state_dict().items()}


def _max_difference(a: dict, b: dict) -> float:
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def _logged(trainer) -> list[tuple]:
    """The training log entries (the epoch fraction counts drawn batches, so it is left out)."""
    return [
        (entry["step"], entry["loss"], entry["grad_norm"], entry["learning_rate"])
        for entry in trainer.state.log_history
        if "loss" in entry
    ]


def _reference(tmp_path, ga, n, bad, data="map", max_steps=8, logging_steps=2):
    items = _items(n, bad, "explode")
    order = [i for i in range(n) if i not in bad]
    return _train(tmp_path, "reference", ga=ga, order=order, items=items, data=data, save_steps=0,
                  max_steps=max_steps, logging_steps=logging_steps)  # fmt: skip


@pytest.mark.parametrize("ga", [1, 4])
@pytest.mark.parametrize("kind", ["explode", "nan"])
def test_skip_equals_a_run_without_the_bad_window(tmp_path, ga, kind):
    n = 10 * ga * BATCH
    bad = _bad_window(4, ga)
    reference = _reference(tmp_path, ga, n, bad)
    guard = RunGuard("skip", **SETTINGS)
    guarded = _train(tmp_path, "guarded", ga=ga, order=list(range(n)), items=_items(n, bad, kind), guard=guard)
    assert _max_difference(_weights(guarded), _weights(reference)) == 0.0
    assert _logged(guarded) == _logged(reference)
    assert guarded.state.global_step == reference.state.global_step == 8
    assert [(e["step"], e["action"], e["batches"], e["epoch"]) for e in guard.events] == [
        (5, "skip", [4 * ga, 5 * ga - 1], 0)
    ]
    assert guard.summary["skipped_windows"] == [{"epoch": 0, "first": 4 * ga, "count": ga, "at_step": 4}]


@pytest.mark.parametrize("save_only_model", [False, True])
def test_skip_in_the_first_window_without_checkpoints_goes_back_to_the_start(tmp_path, save_only_model):
    """`skip` decides at the log of step 2, after the bad update 1 was applied; with no checkpoint written it goes
    back to the state kept at train start (optimizer and RNG included under `save_only_model`), and the run (logged
    losses and `train_loss` included) is the one without the window. Its private folder is gone at the end."""
    ga, n = 2, 20 * BATCH
    bad = _bad_window(0, ga)
    reference = _reference(tmp_path, ga, n, bad)
    guard = RunGuard("skip", **SETTINGS)
    guarded = _train(tmp_path, "guarded", ga=ga, order=list(range(n)), items=_items(n, bad, "nan"), guard=guard,
                     save_steps=0, save_only_model=save_only_model)  # fmt: skip
    assert _max_difference(_weights(guarded), _weights(reference)) == 0.0
    assert _logged(guarded) == _logged(reference)
    assert guarded.state.log_history[-1]["train_loss"] == reference.state.log_history[-1]["train_loss"]
    assert [(e["step"], e["action"], e["batches"]) for e in guard.events] == [(1, "skip", [0, ga - 1])]
    assert guard.rollbacks == 0
    assert list((tmp_path / "guarded").iterdir()) == []


def test_skip_decided_between_logs_keeps_the_logged_loss(tmp_path):
    """Decisions every 2 updates, logs every 4: the state kept at step 2 holds half a logging window; going back to
    it from the decision at step 4 (bad update 3) logs what the run without the window logs."""
    ga, n = 1, 24
    bad = _bad_window(2, ga)
    reference = _reference(tmp_path, ga, n, bad, logging_steps=4)
    guard = RunGuard("skip", **SETTINGS, check_every_n_steps=2)
    guarded = _train(tmp_path, "guarded", ga=ga, order=list(range(n)), items=_items(n, bad, "nan"), guard=guard,
                     save_steps=0, logging_steps=4)  # fmt: skip
    assert _max_difference(_weights(guarded), _weights(reference)) == 0.0
    assert _logged(guarded) == _logged(reference) and len(_logged(reference)) == 2
    assert guarded.state.log_history[-1]["train_loss"] == reference.state.log_history[-1]["train_loss"]
    assert [(e["step"], e["action"]) for e in guard.events] == [(3, "skip")]


@pytest.mark.parametrize("ga", [1, 4])
@pytest.mark.parametrize("kind", ["explode", "nan"])
def test_rollback_equals_a_run_without_the_bad_window(tmp_path, ga, kind):
    n = 10 * ga * BATCH
    bad = _bad_window(4, ga)  # update 5, decided at the log of step 6, rolled back to checkpoint-4
    reference = _reference(tmp_path, ga, n, bad)
    guard = RunGuard("rollback", **SETTINGS)
    guarded = _train(tmp_path, "guarded", ga=ga, order=list(range(n)), items=_items(n, bad, kind), guard=guard)
    assert _max_difference(_weights(guarded), _weights(reference)) == 0.0
    assert _logged(guarded) == _logged(reference)
    assert guard.rollbacks == 1
    assert [(e["step"], e["action"], e["batches"]) for e in guard.events] == [(5, "rollback", [4 * ga, 5 * ga - 1])]


@pytest.mark.parametrize("action", ["rollback", "skip"])
def test_a_resume_after_a_rollback_continues_exactly(tmp_path, action):
    """checkpoint-6 of the rolled-back path stands one window past its step; a resume from it is the same run."""
    ga, n = 1, 24
    bad = _bad_window(4, 1)
    reference = _reference(tmp_path, ga, n, bad, max_steps=10)
    items = _items(n, bad, "nan")
    guarded = _train(tmp_path, "guarded", ga=ga, order=list(range(n)), items=items, guard=RunGuard(action, **SETTINGS),
                     max_steps=10)  # fmt: skip
    assert _max_difference(_weights(guarded), _weights(reference)) == 0.0
    checkpoint = tmp_path / "guarded" / "checkpoint-6"
    resumed = _train(tmp_path, "guarded", ga=ga, order=list(range(n)), items=items, guard=RunGuard(action, **SETTINGS),
                     max_steps=10, resume=str(checkpoint))  # fmt: skip
    assert _max_difference(_weights(resumed), _weights(reference)) == 0.0


@pytest.mark.parametrize(("ga", "kind"), [(1, "explode"), (2, "nan"), (4, "explode"), (4, "nan")])
@pytest.mark.parametrize("action", ["skip", "rollback"])
def test_iterable_data(tmp_path, action, ga, kind):
    n = 10 * ga * BATCH
    bad = _bad_window(4, ga)
    reference = _reference(tmp_path, ga, n, bad, data="iterable")
    guard = RunGuard(action, **SETTINGS)
    guarded = _train(tmp_path, "guarded", ga=ga, order=list(range(n)), items=_items(n, bad, kind), data="iterable",
                     guard=guard)  # fmt: skip
    assert _max_difference(_weights(guarded), _weights(reference)) == 0.0
    assert len(guard.events) == 1


def test_stop_saves_and_names_the_step_the_value_and_the_batches(tmp_path):
    n = 24
    guard = RunGuard("stop", **SETTINGS)
    with pytest.raises(RunGuardStop) as stopped:
        _train(tmp_path, "guarded", ga=1, order=list(range(n)), items=_items(n, _bad_window(4, 1), "explode"),
               guard=guard)
    message = str(stopped.value)
    assert "at step 5" in message and "loss=" in message and "batches 4..4 of epoch 0" in message
    assert "window mean of" in message and "checkpoint-4" in message
    assert "RunGuard(action='rollback') or 'skip'" in message  # both run here (not under FSDP: the FSDP test)
    assert is_complete_checkpoint(str(tmp_path / "guarded" / "checkpoint-6"))
    assert not (tmp_path / "guarded" / "checkpoint-8").exists()


def test_too_many_events_stop(tmp_path):
    n = 24
    bad = _bad_window(4, 1) + _bad_window(6, 1)  # two bad windows; one rollback allowed
    guard = RunGuard("rollback", **SETTINGS, max_events=1)
    with pytest.raises(RunGuardStop, match="max_events=1"):
        _train(tmp_path, "guarded", ga=1, order=list(range(n)), items=_items(n, bad, "nan"), guard=guard)
    assert [e["action"] for e in guard.events] == ["rollback", "stop"]


def test_no_event_changes_nothing(tmp_path):
    n = 24
    items = _items(n, [], "explode")
    plain = _train(tmp_path, "plain", ga=2, order=list(range(n)), items=items, save_steps=0)
    for action in ("skip", "rollback"):
        guard = RunGuard(action, grad_norm=True, **SETTINGS)
        guarded = _train(tmp_path, action, ga=2, order=list(range(n)), items=items, guard=guard, save_steps=0)
        assert _max_difference(_weights(guarded), _weights(plain)) == 0.0
        assert guarded.state.log_history[:-1] == plain.state.log_history[:-1]
        assert guard.events == []


def test_skip_with_ignore_data_skip_is_refused_before_training(tmp_path):
    guard = RunGuard("skip", **SETTINGS)
    with pytest.raises(ValueError, match="ignore_data_skip=True.*Set ignore_data_skip=False"):
        _train(tmp_path, "guarded", ga=1, order=list(range(8)), items=_items(8, [], "nan"), guard=guard,
               ignore_data_skip=True)  # fmt: skip
    assert guard.events == [] and not (tmp_path / "guarded" / "checkpoint-2").exists()


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="action='undo'.*window=0"):
        RunGuard("undo", window=0)


@pytest.mark.slow
@pytest.mark.parametrize("data", ["map", "iterable"])
@pytest.mark.parametrize("action", ["skip", "rollback"])
def test_two_dataloader_workers(tmp_path, data, action):
    ga, n = 2, 40
    bad = _bad_window(4, ga)
    items = _items(n, bad, "nan")
    order = [i for i in range(n) if i not in bad]
    reference = _train(tmp_path, "reference", ga=ga, order=order, items=_items(n, bad, "explode"), data=data,
                       save_steps=0, workers=2)  # fmt: skip
    guard = RunGuard(action, **SETTINGS)
    guarded = _train(tmp_path, "guarded", ga=ga, order=list(range(n)), items=items, data=data, guard=guard, workers=2)
    assert _max_difference(_weights(guarded), _weights(reference)) == 0.0
    assert [e["batches"] for e in guard.events] == [[4 * ga, 5 * ga - 1]]


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize(("window", "atol", "rtol"), [(1, None, 2.0), (5, 0.07, 0.3), (10, None, 0.1), (12, 1.0, None)])
def test_the_guards_detector_judges_as_lightnings_spike_detection(mode, window, atol, rtol):
    """The guard's detector keeps Lightning's judgement with a float32 window mean computed as torchmetrics'
    `Running(MeanMetric())` does (engine/run_guard.py `_WindowMean`): the same verdict and the same mean, bit for bit,
    for every value of a random series, as Lightning's own `SpikeDetection` on tensors."""
    import random
    import warnings

    import numpy as np
    from lightning.fabric.utilities.spike import SpikeDetection

    from hf_lightning.engine.run_guard import _detector

    settings = {"mode": mode, "window": window, "warmup": 1, "atol": atol, "rtol": rtol}
    ours = _detector(settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lightnings = SpikeDetection(finite_only=True, **settings)
    draw = random.Random(window * 7 + (atol or 0) * 100)
    spikes = 0
    for index in range(200):
        value = torch.tensor(draw.gauss(1.0, 2.0))
        if index:
            verdict = bool(ours._is_spike(np.float32(value.item())))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert verdict == lightnings._is_spike(value), index
                expected_mean = lightnings.running_mean.compute()
            assert ours.running_mean.compute().tobytes() == expected_mean.numpy().tobytes(), index
            spikes += verdict
            if verdict:
                continue
        ours._update_stats(np.float32(value.item()))
        lightnings._update_stats(value)
    assert 0 < spikes < 200 or rtol is None  # the series exercises both verdicts
