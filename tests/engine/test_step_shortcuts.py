"""Per-step shortcuts change nothing a user can see: Lightning's `self.log`, train mode, column removal, the
profiler and epoch loop, device moves."""

from __future__ import annotations

import contextlib
import copy
import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import Logger
from lightning.pytorch.loops import _TrainingEpochLoop
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies import Strategy
from torch import nn

import hf_lightning.engine.lean_lightning as lean_lightning
import hf_lightning.engine.lean_logging as lean_logging
from hf_lightning import TrainerCallback, TrainingArguments
from hf_lightning.data.collate import RemoveColumnsCollator, default_data_collator
from hf_lightning.engine.lean_lightning import LeanPassThroughProfiler, LeanTrainingEpochLoop
from hf_lightning.engine.lean_logging import LeanLoggerConnector
from hf_lightning.engine.module import _moved_to_device
from hf_lightning.engine.train_mode import ensure_train_mode
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import RegressionMLP, make_regression_mlp, regression_data


def _args(tmp_path, **overrides) -> TrainingArguments:
    options = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        per_device_train_batch_size=3,
        num_train_epochs=2,
        logging_steps=2,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=5,
    )
    options.update(overrides)
    return TrainingArguments(**options)


# ---- Lightning's logger connector ------------------------------------------------------------------------
TIMINGS = ("runtime", "per_second")  # wall-clock speed metrics differ from run to run


def _without_timings(metrics: dict) -> dict:
    """The metrics whose values do not depend on the clock (the telemetry's `perf/` figures all do, or may)."""
    return {
        k: float(v) for k, v in metrics.items() if not k.startswith("perf/") and not any(word in k for word in TIMINGS)
    }


class RecordingLogger(Logger):
    """Keeps every `log_metrics` call, tensors turned into floats."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[dict, int | None]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.calls.append((_without_timings(metrics), step))


class LogsFromCallback(pl.Callback):
    """A user's Lightning callback that logs through `pl_module.log` from the batch-end hook."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.log("probe", float(batch_idx) + 0.5, on_step=True, on_epoch=False, batch_size=3)


def _run_with_lightning_logging(tmp_path, lean: bool, monkeypatch) -> tuple[list, dict, type]:
    if not lean:
        monkeypatch.setattr(lean_logging, "use_lean_logger_connector", lambda trainer: None)
    recorder = RecordingLogger()
    trainer = HFLightningTrainer(
        model=make_regression_mlp(),
        args=_args(tmp_path, logging_steps=1),
        train_dataset=regression_data(12),
        callbacks=[LogsFromCallback()],
    )
    trainer.lightning_trainer_overrides["logger"] = recorder
    trainer.train()
    monkeypatch.undo()
    lightning_trainer = trainer.lightning_trainer
    callback_metrics = _without_timings(lightning_trainer.callback_metrics)
    return recorder.calls, callback_metrics, type(lightning_trainer._logger_connector)


def test_values_logged_by_a_lightning_callback_reach_the_loggers_as_without_the_shortcut(tmp_path, monkeypatch):
    lean_calls, lean_metrics, lean_type = _run_with_lightning_logging(tmp_path / "lean", True, monkeypatch)
    plain_calls, plain_metrics, plain_type = _run_with_lightning_logging(tmp_path / "plain", False, monkeypatch)
    assert lean_type is LeanLoggerConnector and plain_type is not LeanLoggerConnector
    assert any("probe" in metrics for metrics, _ in lean_calls)  # Lightning's own path did run
    assert lean_calls == plain_calls
    assert lean_metrics == plain_metrics and "probe" in lean_metrics


# ---- train mode ------------------------------------------------------------------------------------------
class ModeRecordingMLP(RegressionMLP):
    def __init__(self) -> None:
        super().__init__()
        self.modes: list[bool] = []

    def forward(self, x, labels=None):
        self.modes.append(all(module.training for module in self.modules()))
        return super().forward(x, labels)


class EvalOnStepBegin(TrainerCallback):
    def on_step_begin(self, args, state, control, model=None, **kwargs):
        model.eval()


def test_a_model_switched_to_eval_trains_in_train_mode_again(tmp_path):
    torch.manual_seed(0)
    model = ModeRecordingMLP()
    trainer = HFLightningTrainer(
        model=model, args=_args(tmp_path), train_dataset=regression_data(12), callbacks=[EvalOnStepBegin()]
    )
    trainer.train()
    assert len(model.modes) == 8 and all(model.modes)


class FrozenNorm(nn.LayerNorm):
    """A submodule whose `train()` keeps it in eval mode (as models with frozen normalisation do)."""

    def train(self, mode: bool = True):
        self.train_calls = getattr(self, "train_calls", 0) + 1
        return super().train(False)


def test_train_is_still_called_when_a_submodule_overrides_it():
    model = make_regression_mlp()
    model.norm = FrozenNorm(4)
    ensure_train_mode(model)
    ensure_train_mode(model)
    assert model.norm.train_calls == 2 and not model.norm.training and model.net.training


def test_train_is_skipped_only_when_it_would_change_nothing():
    calls = []
    model = make_regression_mlp()
    model.train = lambda mode=True: calls.append(mode)  # a spy on this instance; the class keeps Module.train
    ensure_train_mode(model)  # every module is in train mode already
    assert calls == []
    model.net[1].training = False
    ensure_train_mode(model)
    assert calls == [True]


# ---- column removal --------------------------------------------------------------------------------------
def test_column_removal_without_copies_gives_the_same_batch_and_leaves_examples_alone():
    columns = ["x", "labels"]
    kept = [{"x": torch.tensor([float(i), 1.0]), "labels": torch.tensor(float(i))} for i in range(4)]
    extra = [dict(item, idx=i) for i, item in enumerate(kept)]
    before = copy.deepcopy(extra)
    fast = RemoveColumnsCollator(default_data_collator, columns)(kept)
    dropped = RemoveColumnsCollator(default_data_collator, columns)(extra)
    through_copies = RemoveColumnsCollator(lambda features: default_data_collator(features), columns)(kept)
    for batch in (dropped, through_copies):
        assert batch.keys() == fast.keys() == {"x", "labels"}
        for key in fast:
            assert torch.equal(batch[key], fast[key])
    assert [item.keys() for item in extra] == [item.keys() for item in before]


def test_the_column_check_finds_one_odd_example_anywhere_in_the_batch():
    from collections import UserDict

    from hf_lightning.data.collate import _plain_dicts_within

    columns = frozenset({"x", "labels"})
    plain = [{"x": torch.tensor([float(i)]), "labels": torch.tensor(float(i))} for i in range(5)]
    assert _plain_dicts_within(plain, columns)
    assert not _plain_dicts_within([], columns)
    assert not _plain_dicts_within(plain[:4] + [dict(plain[4], idx=4)], columns)  # an extra key, last
    assert not _plain_dicts_within(plain[:2] + [UserDict(plain[2])] + plain[3:], columns)  # a non-dict mapping
    odd = plain[:3] + [dict(plain[3], idx=3)] + plain[4:]
    through_copies = RemoveColumnsCollator(lambda features: default_data_collator(features), list(columns))(odd)
    batch = RemoveColumnsCollator(default_data_collator, list(columns))(odd)
    assert batch.keys() == through_copies.keys() == {"x", "labels"}
    assert all(torch.equal(batch[key], through_copies[key]) for key in batch)


def test_train_mode_walk_reaches_shared_and_skips_empty_child_slots():
    calls = []
    model = make_regression_mlp()
    model.empty = None  # a registered child slot holding None, as `train` meets it
    model.register_module("empty_slot", None)
    model.shared = model.net  # the same submodule under two names
    model.train = lambda mode=True: calls.append(mode)
    ensure_train_mode(model)
    assert calls == []
    model.shared[1].training = False  # reached through either name
    ensure_train_mode(model)
    assert calls == [True]


# ---- Lightning's profiler and epoch loop ----------------------------------------------------------------
def _trained(tmp_path, lean: bool, monkeypatch, **overrides):
    if not lean:
        monkeypatch.setattr(lean_lightning, "use_lean_profiler", lambda trainer: None)
        monkeypatch.setattr(lean_lightning, "use_lean_epoch_loop", lambda trainer: None)
    torch.manual_seed(0)
    trainer = HFLightningTrainer(
        model=make_regression_mlp(),
        args=_args(tmp_path, logging_steps=1, gradient_accumulation_steps=2, **overrides),
        train_dataset=regression_data(12),
    )
    trainer.train()
    monkeypatch.undo()
    return trainer


def test_the_lean_profiler_and_epoch_loop_give_the_same_run(tmp_path, monkeypatch):
    lean = _trained(tmp_path / "lean", True, monkeypatch)
    plain = _trained(tmp_path / "plain", False, monkeypatch)
    assert type(lean.lightning_trainer.profiler) is LeanPassThroughProfiler
    assert type(lean.lightning_trainer.fit_loop.epoch_loop) is LeanTrainingEpochLoop
    assert type(plain.lightning_trainer.profiler) is PassThroughProfiler
    assert type(plain.lightning_trainer.fit_loop.epoch_loop) is _TrainingEpochLoop
    without_timings = [{k: v for k, v in log.items() if "runtime" not in k and "per_second" not in k}
                       for log in lean.state.log_history]
    assert without_timings == [
        {k: v for k, v in log.items() if "runtime" not in k and "per_second" not in k}
        for log in plain.state.log_history
    ]
    for a, b in zip(lean.model.parameters(), plain.model.parameters()):
        assert torch.equal(a, b)
    assert lean.lightning_trainer.global_step == plain.lightning_trainer.global_step == lean.state.global_step


class RecordsBatchHooks(pl.Callback):
    """A user's Lightning callback that notes what each batch hook sees, and logs from the batch-start hook."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def _note(self, hook, trainer, pl_module, batch_idx, outputs=None):
        loop = trainer.fit_loop.epoch_loop
        self.seen.append((
            hook, batch_idx, pl_module._current_fx_name, outputs, trainer.current_epoch, trainer.global_step,
            loop.batch_progress.current.ready, loop.batch_progress.current.completed, loop.batch_progress.is_last_batch,
        ))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._note("start", trainer, pl_module, batch_idx)
        pl_module.log("seen_start", float(batch_idx), on_step=True, on_epoch=False, batch_size=3)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._note("end", trainer, pl_module, batch_idx, outputs)


class StopsAnEpochEarly(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            control.should_epoch_stop = True


def _fit_recorded(tmp_path, lean: bool, monkeypatch):
    if not lean:
        monkeypatch.setattr(lean_lightning, "_lean_batch_hooks", lambda trainer: None)
    recorder = RecordsBatchHooks()
    torch.manual_seed(0)
    trainer = HFLightningTrainer(
        model=make_regression_mlp(),
        args=_args(tmp_path, logging_steps=1, num_train_epochs=3),
        train_dataset=regression_data(12),
        callbacks=[recorder, StopsAnEpochEarly()],
    )
    trainer.train()
    monkeypatch.undo()
    return trainer, recorder


def test_a_batch_without_the_generic_hook_dispatch_is_the_batch_lightning_runs(tmp_path, monkeypatch):
    lean, lean_recorder = _fit_recorded(tmp_path / "lean", True, monkeypatch)
    plain, plain_recorder = _fit_recorded(tmp_path / "plain", False, monkeypatch)
    # The same hooks, in the same order, with the same arguments, progress counters and current hook name.
    assert lean_recorder.seen == plain_recorder.seen
    assert [hook[2] for hook in lean_recorder.seen[:2]] == ["on_train_batch_start", "on_train_batch_end"]
    assert len(lean_recorder.seen) > 2 * lean.state.global_step - 2  # the epoch stopped early; the rest trained
    lean_loop, plain_loop = lean.lightning_trainer.fit_loop, plain.lightning_trainer.fit_loop
    assert lean_loop.state_dict() == plain_loop.state_dict()  # every loop's progress, batches_that_stepped
    assert lean_loop.epoch_loop._batches_that_stepped == plain_loop.epoch_loop._batches_that_stepped > 0
    assert _without_timings(lean.lightning_trainer.callback_metrics) == _without_timings(
        plain.lightning_trainer.callback_metrics
    )
    assert [log.get("loss") for log in lean.state.log_history] == [log.get("loss") for log in plain.state.log_history]
    for a, b in zip(lean.model.parameters(), plain.model.parameters()):
        assert torch.equal(a, b)


def test_the_batch_shortcut_is_taken_only_where_nothing_could_tell(tmp_path):
    trainer = HFLightningTrainer(model=make_regression_mlp(), args=_args(tmp_path), train_dataset=regression_data(12))
    trainer.train()
    lightning_trainer = trainer.lightning_trainer
    hooks = lean_lightning._lean_batch_hooks(lightning_trainer)
    assert hooks is not None and hooks.batch_start == hooks.batch_end == []
    lightning_trainer.callbacks = [*lightning_trainer.callbacks, RecordsBatchHooks()]
    hooks = lean_lightning._lean_batch_hooks(lightning_trainer)
    assert [type(c) for c in hooks.batch_start] == [type(c) for c in hooks.batch_end] == [RecordsBatchHooks]
    lightning_trainer.profiler = PassThroughProfiler()  # not the lean one: Lightning's own path
    assert lean_lightning._lean_batch_hooks(lightning_trainer) is None


class CountsTrainStepContexts(Precision):
    """A precision plugin with its own training-step context: Lightning's strategy must enter it every step."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = 0

    @contextlib.contextmanager
    def train_step_context(self):
        self.entered += 1
        with super().train_step_context():
            yield


class UsesPrecision(pl.Callback):
    """Sets the run's precision plugin, and counts the strategy's `post_training_step` calls (an instance override)."""

    def __init__(self, precision: Precision) -> None:
        self.precision = precision
        self.post_steps = 0

    def setup(self, trainer, pl_module, stage):
        trainer.strategy.precision_plugin = self.precision
        trainer.strategy.post_training_step = self._count_post_step

    def _count_post_step(self) -> None:
        self.post_steps += 1


class NotesTheCallStack(HFLightningTrainer):
    """Notes, on every micro-batch, whether Lightning's `Strategy.training_step` is on the call stack."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        frame, codes = sys._getframe(), set()
        while frame is not None:
            codes.add(frame.f_code)
            frame = frame.f_back
        self.through_strategy = [*getattr(self, "through_strategy", []), Strategy.training_step.__code__ in codes]
        return super().training_step(model, inputs, num_items_in_batch)


def test_the_strategy_step_is_skipped_only_when_it_would_just_call_the_module(tmp_path):
    base, counting = Precision(), CountsTrainStepContexts()
    runs = {}
    for precision in (base, counting):
        uses = UsesPrecision(precision)
        trainer = NotesTheCallStack(
            model=make_regression_mlp(), args=_args(tmp_path), train_dataset=regression_data(12), callbacks=[uses],
        )
        trainer.train()
        runs[precision] = trainer
        assert uses.post_steps == trainer.state.global_step == 8  # an overriding post_training_step runs every step
    assert runs[base].through_strategy == [False] * 8  # the module's step, called directly
    assert runs[counting].through_strategy == [True] * 8
    assert counting.entered == 8  # the plugin's own context, entered by the strategy on every step
    for a, b in zip(runs[base].model.parameters(), runs[counting].model.parameters()):
        assert torch.equal(a, b)
    strategy = runs[base].lightning_trainer.strategy
    assert lean_lightning._strategy_step_is_module_step(strategy)
    strategy.precision_plugin = MixedPrecision("bf16-mixed", "cpu")  # an autocast forward context
    assert not lean_lightning._strategy_step_is_module_step(strategy)
    strategy.precision_plugin = Precision()
    strategy.model = nn.Sequential(strategy.lightning_module)  # a wrapped module (DDP's place)
    assert not lean_lightning._strategy_step_is_module_step(strategy)
    strategy.model = None
    strategy.training_step = lambda *args, **kwargs: None  # an instance override
    assert not lean_lightning._strategy_step_is_module_step(strategy)
    del strategy.training_step
    assert lean_lightning._strategy_step_is_module_step(strategy)
    del strategy.post_training_step
    assert lean_lightning._lean_batch_hooks(runs[base].lightning_trainer).post_training_step is None


class CountsLossContexts(HFLightningTrainer):
    def compute_loss_context_manager(self):
        self.loss_contexts = getattr(self, "loss_contexts", 0) + 1
        return super().compute_loss_context_manager()


class CountsAutocastContexts(HFLightningTrainer):
    def autocast_smart_context_manager(self, cache_enabled=True):
        self.autocast_contexts = getattr(self, "autocast_contexts", 0) + 1
        return contextlib.nullcontext()


def test_an_overridden_loss_context_is_entered_for_every_micro_batch(tmp_path):
    args = _args(tmp_path, gradient_accumulation_steps=2)  # 2 epochs of 4 micro-batches
    by_class = CountsLossContexts(model=make_regression_mlp(), args=args, train_dataset=regression_data(12))
    by_class.train()
    autocast = CountsAutocastContexts(model=make_regression_mlp(), args=args, train_dataset=regression_data(12))
    autocast.train()
    by_instance = HFLightningTrainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(12))
    entered = []
    by_instance.compute_loss_context_manager = lambda: entered.append(1) or contextlib.nullcontext()
    by_instance.train()
    assert by_class.loss_contexts == autocast.autocast_contexts == len(entered) == 8
    plain = HFLightningTrainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(12))
    plain.train()
    for a, b in zip(plain.model.parameters(), by_class.model.parameters()):
        assert torch.equal(a, b)  # an empty context skipped or entered: the same training


def test_a_profiler_the_user_chose_is_kept_and_records_the_hooks(tmp_path):
    from lightning.pytorch.profilers import SimpleProfiler

    profiler = SimpleProfiler()
    trainer = HFLightningTrainer(
        model=make_regression_mlp(), args=_args(tmp_path), train_dataset=regression_data(12)
    )
    trainer.lightning_trainer_overrides["profiler"] = profiler
    trainer.train()
    assert trainer.lightning_trainer.profiler is profiler
    assert any("run_training_batch" in name for name in profiler.recorded_durations)


def test_the_lean_profiler_nests_and_lets_exceptions_through():
    profiler = LeanPassThroughProfiler()
    with profiler.profile("outer"), profiler.profile("inner"):
        pass
    try:
        with profiler.profile("raises"):
            raise KeyError("seen")
    except KeyError as error:
        assert error.args == ("seen",)
    else:
        raise AssertionError("the exception was swallowed")


# ---- device moves and `_prepare_inputs` ------------------------------------------------------------------
def test_a_plain_dict_on_the_device_moves_as_lightning_moves_it():
    from lightning.fabric.utilities.apply_func import move_data_to_device

    device = torch.device("cpu")
    batch = {"x": torch.ones(2, 3), "labels": torch.zeros(2)}
    fast, lightning = _moved_to_device(batch, device), move_data_to_device(batch, device)
    assert fast is not batch and type(fast) is dict and fast.keys() == lightning.keys()
    assert all(fast[k] is lightning[k] is batch[k] for k in batch)
    mixed = {"x": torch.ones(2), "ids": [1, 2], "name": "a"}
    assert _moved_to_device(mixed, device) == move_data_to_device(mixed, device)


class CountingInputs(HFLightningTrainer):
    def _prepare_input(self, data):
        self.prepared = getattr(self, "prepared", 0) + 1
        return super()._prepare_input(data)


def test_prepare_inputs_gives_the_recursive_result_and_honours_an_override(tmp_path):
    trainer = HFLightningTrainer(model=make_regression_mlp(), args=_args(tmp_path))
    inputs = {"x": torch.ones(2, 4), "nested": {"y": torch.zeros(1)}, "ids": [torch.ones(1)], "flag": True}
    fast, recursive = trainer._prepare_inputs(inputs), trainer._prepare_input(inputs)
    assert fast is not inputs and fast.keys() == recursive.keys()
    assert torch.equal(fast["x"], recursive["x"]) and torch.equal(fast["nested"]["y"], recursive["nested"]["y"])
    assert fast["flag"] is True and torch.equal(fast["ids"][0], recursive["ids"][0])
    counting = CountingInputs(model=make_regression_mlp(), args=_args(tmp_path))
    counting._prepare_inputs({"x": torch.ones(2, 4)})
    assert counting.prepared == 2  # the dict, then its tensor: the override's own recursion ran
