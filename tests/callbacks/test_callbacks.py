"""Parity of hf_lightning.callbacks with transformers' trainer_callback.py (the reference, 5.24)."""

from __future__ import annotations

import dataclasses
import itertools
import logging

import pytest
import transformers
import transformers.trainer_callback as ref

from hf_lightning import callbacks as ours

SIX_COMMON_KWARGS = [
    "eval_dataloader",
    "lr_scheduler",
    "model",
    "optimizer",
    "processing_class",
    "train_dataloader",
]


# --------------------------------------------------------------------------------------------------------------
# TrainerState / TrainerControl / ExportableState


def test_trainer_state_fields_and_defaults_equal_reference():
    def describe(cls):
        rows = []
        for field in dataclasses.fields(cls):
            default = field.default
            if field.default_factory is not dataclasses.MISSING:
                default = field.default_factory()
            rows.append((field.name, default))
        return rows

    assert describe(ours.TrainerState) == describe(ref.TrainerState)
    # Values after __post_init__ too (log_history -> [], stateful_callbacks -> {}).
    assert dataclasses.asdict(ours.TrainerState()) == dataclasses.asdict(ref.TrainerState())
    assert describe(ours.TrainerControl) == describe(ref.TrainerControl)


def _filled_state_kwargs() -> dict:
    return dict(
        epoch=1.5,
        global_step=12,
        max_steps=16,
        logging_steps=2,
        eval_steps=4,
        save_steps=3,
        train_batch_size=8,
        num_train_epochs=2,
        num_input_tokens_seen=1234,
        total_flos=3.5e12,
        log_history=[{"loss": 0.123456789, "step": 2, "epoch": 0.25}, {"eval_loss": 1.0, "step": 4}],
        best_metric=0.25,
        best_global_step=8,
        best_model_checkpoint="out/checkpoint-8",
        is_local_process_zero=False,
        is_world_process_zero=False,
        is_hyper_param_search=True,
        trial_name="trial-7",
        trial_params={"learning_rate": 0.001, "name": "a", "flag": True, "n": 3},
    )


def test_save_to_json_is_byte_identical_to_reference(tmp_path):
    kwargs = _filled_state_kwargs()
    ours_state = ours.TrainerState(
        **kwargs,
        stateful_callbacks=[ours.EarlyStoppingCallback(5, 0.1), ours.TrainerControl(should_save=True)],
    )
    ref_state = ref.TrainerState(
        **kwargs, stateful_callbacks=[ref.EarlyStoppingCallback(5, 0.1), ref.TrainerControl(should_save=True)]
    )
    ours_state.save_to_json(tmp_path / "ours.json")
    ref_state.save_to_json(tmp_path / "ref.json")
    ours_bytes = (tmp_path / "ours.json").read_bytes()
    assert ours_bytes == (tmp_path / "ref.json").read_bytes()
    assert ours_bytes.endswith(b"}\n")

    # Each library loads the other's file into equal states.
    loaded = ours.TrainerState.load_from_json(tmp_path / "ref.json")
    assert dataclasses.asdict(loaded) == dataclasses.asdict(ref_state)
    ref_loaded = ref.TrainerState.load_from_json(tmp_path / "ours.json")
    assert dataclasses.asdict(ref_loaded) == dataclasses.asdict(ours_state)


def test_load_from_json_round_trips(tmp_path):
    state = ours.TrainerState(**_filled_state_kwargs())
    state.save_to_json(tmp_path / "s.json")
    loaded = ours.TrainerState.load_from_json(tmp_path / "s.json")
    assert loaded == state
    loaded.save_to_json(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "s.json").read_bytes()


def test_load_from_json_names_unknown_fields(tmp_path):
    (tmp_path / "s.json").write_text('{"global_step": 3, "new_field": 1}')
    with pytest.raises(ValueError, match="new_field"):
        ours.TrainerState.load_from_json(tmp_path / "s.json")


def test_stateful_callbacks_export_matches_reference():
    ours_state = ours.TrainerState(
        stateful_callbacks=[
            ours.EarlyStoppingCallback(5),
            ours.EarlyStoppingCallback(2, 0.5),
            ours.TrainerControl(should_log=True),
        ]
    )
    ref_state = ref.TrainerState(
        stateful_callbacks=[
            ref.EarlyStoppingCallback(5),
            ref.EarlyStoppingCallback(2, 0.5),
            ref.TrainerControl(should_log=True),
        ]
    )
    assert ours_state.stateful_callbacks == ref_state.stateful_callbacks
    assert isinstance(ours_state.stateful_callbacks["EarlyStoppingCallback"], list)
    with pytest.raises(TypeError, match="ExportableState"):
        ours.TrainerState(stateful_callbacks=[ours.PrinterCallback()])
    # transformers' own exportable callbacks are accepted by our state too.
    mixed = ours.TrainerState(stateful_callbacks=[ref.EarlyStoppingCallback(3)])
    assert mixed.stateful_callbacks == {"EarlyStoppingCallback": ref.EarlyStoppingCallback(3).state()}


def test_trainer_control_state_and_resets_match_reference():
    flags = dict(
        should_training_stop=True,
        should_epoch_stop=True,
        should_save=True,
        should_evaluate=True,
        should_log=True,
    )
    assert ours.TrainerControl(**flags).state() == ref.TrainerControl(**flags).state()
    for reset in ("_new_training", "_new_epoch", "_new_step"):
        mine, theirs = ours.TrainerControl(**flags), ref.TrainerControl(**flags)
        getattr(mine, reset)()
        getattr(theirs, reset)()
        assert dataclasses.asdict(mine) == dataclasses.asdict(theirs), reset
    restored = ours.TrainerControl.from_state(ours.TrainerControl(should_save=True).state())
    assert restored == ours.TrainerControl(should_save=True)
    early = ours.EarlyStoppingCallback.from_state(
        {
            "args": {"early_stopping_patience": 4, "early_stopping_threshold": 0.2},
            "attributes": {"early_stopping_patience_counter": 3},
        }
    )
    assert (early.early_stopping_patience, early.early_stopping_threshold) == (4, 0.2)
    assert early.early_stopping_patience_counter == 3


@pytest.mark.parametrize(
    "steps,max_steps",
    [
        (dict(logging_steps=0.25), 10),
        (dict(logging_steps=0.25, eval_strategy="steps", eval_steps=0.1, save_steps=0.5), 7),
        (dict(logging_steps=3, eval_strategy="steps", save_steps=0.33), 100),
        (dict(logging_steps=0.001, eval_strategy="steps", eval_steps=7), 5),
        (dict(eval_strategy="no", save_steps=0.999), 1000),
    ],
)
def test_compute_steps_resolves_ratios_like_reference(make_args, steps, max_steps):
    args = make_args(**steps)
    mine, theirs = ours.TrainerState(), ref.TrainerState()
    mine.compute_steps(args, max_steps)
    theirs.compute_steps(args, max_steps)
    resolved = (mine.logging_steps, mine.eval_steps, mine.save_steps)
    assert resolved == (theirs.logging_steps, theirs.eval_steps, theirs.save_steps)
    assert all(isinstance(value, int) for value in resolved)
    # Arguments are not written back.
    assert args.logging_steps == steps.get("logging_steps", 500)


def test_compute_steps_keeps_default_when_argument_is_none():
    class Args:
        logging_steps = 0.5
        eval_steps = None
        save_steps = 10

    state = ours.TrainerState()
    state.compute_steps(Args(), 9)
    assert (state.logging_steps, state.eval_steps, state.save_steps) == (5, 500, 10)


def test_init_training_references_matches_reference():
    class FakeTrainer:
        def __init__(self, hp_name, trial):
            self.hp_name = hp_name
            self._trial = trial

        def is_local_process_zero(self):
            return False

        def is_world_process_zero(self):
            return True

    for trainer in (FakeTrainer(None, None), FakeTrainer(lambda trial: f"run-{trial}", "t3")):
        mine, theirs = ours.TrainerState(), ref.TrainerState()
        mine.init_training_references(trainer, 40, 3, None)
        theirs.init_training_references(trainer, 40, 3, None)
        assert mine == ours.TrainerState(**dataclasses.asdict(theirs))
    assert mine.trial_name == "run-t3"
    mine.init_training_references(FakeTrainer(None, None), 5, 1, {"lr": 0.1})
    assert mine.trial_params == {"lr": 0.1}
    with pytest.raises(RuntimeError, match="Unknown type for trial"):
        mine.init_training_references(FakeTrainer(None, None), 5, 1, object())


# --------------------------------------------------------------------------------------------------------------
# DefaultFlowCallback


def _flags(control) -> tuple:
    return tuple(dataclasses.astuple(control))


def run_flow(lib, args, steps_per_epoch: int, num_epochs: int, max_steps: int) -> list:
    """Emulate the reference's loop with only the default flow callback and record the control flags."""
    with_warning_silenced = logging.getLogger("hf_lightning.callbacks.base")
    with_warning_silenced.disabled = True
    handler = lib.CallbackHandler([lib.DefaultFlowCallback], None, None, None, None)
    with_warning_silenced.disabled = False
    state, control = lib.TrainerState(), lib.TrainerControl()
    state.compute_steps(args, max_steps)
    state.max_steps, state.num_train_epochs = max_steps, num_epochs
    trace = []

    def act(event):
        nonlocal control
        trace.append((event, state.global_step, state.epoch, _flags(control)))
        if control.should_log:
            control = handler.on_log(args, state, control, logs={})
        if control.should_evaluate:
            control = handler.on_evaluate(args, state, control, metrics={})
        if control.should_save:
            control = handler.on_save(args, state, control)

    control = handler.on_train_begin(args, state, control)
    for epoch in range(num_epochs):
        control = handler.on_epoch_begin(args, state, control)
        for step in range(steps_per_epoch):
            control = handler.on_step_begin(args, state, control)
            state.global_step += 1
            state.epoch = epoch + (step + 1) / steps_per_epoch
            control = handler.on_step_end(args, state, control)
            act("step_end")
            if control.should_epoch_stop or control.should_training_stop:
                break
        control = handler.on_epoch_end(args, state, control)
        act("epoch_end")
        if control.should_training_stop:
            break
    return trace


LOGGING_VARIANTS = [
    dict(logging_strategy="steps", logging_steps=2),
    dict(logging_strategy="steps", logging_steps=0.3, logging_first_step=True),
    dict(logging_strategy="epoch", logging_first_step=True),
    dict(logging_strategy="epoch"),
    dict(logging_strategy="no", logging_first_step=True),
]
EVAL_VARIANTS = [
    dict(eval_strategy="no"),
    dict(eval_strategy="steps"),
    dict(eval_strategy="steps", eval_steps=3),
    dict(eval_strategy="steps", eval_steps=0.25, eval_delay=3),
    dict(eval_strategy="epoch"),
    dict(eval_strategy="epoch", eval_delay=1.5),
    dict(eval_strategy="epoch", eval_delay=2),
]
SAVE_VARIANTS = [
    dict(save_strategy="steps", save_steps=3),
    dict(save_strategy="steps", save_steps=0.5),
    dict(save_strategy="epoch"),
    dict(save_strategy="best", metric_for_best_model="loss"),
    dict(save_strategy="no"),
]
# (steps_per_epoch, num_epochs, max_steps): full runs, and max_steps ending mid-epoch.
RUN_SHAPES = [(4, 2, 8), (4, 3, 10), (5, 2, 7), (3, 1, 3), (1, 4, 4)]


@pytest.mark.parametrize(
    "save", SAVE_VARIANTS, ids=lambda v: v["save_strategy"] + str(v.get("save_steps", ""))
)
def test_default_flow_matches_reference_for_argument_grid(make_args, save):
    flagged = set()
    for logging_variant, eval_variant in itertools.product(LOGGING_VARIANTS, EVAL_VARIANTS):
        args = make_args(**logging_variant, **eval_variant, **save)
        for shape in RUN_SHAPES:
            mine, theirs = run_flow(ours, args, *shape), run_flow(ref, args, *shape)
            assert mine == theirs, (logging_variant, eval_variant, save, shape)
            flagged.update(i for row in mine for i, flag in enumerate(row[3]) if flag)
    # The grid exercised every flag that this save strategy can raise.
    expected = {0, 2, 3, 4} if save["save_strategy"] in ("steps", "epoch") else {0, 3, 4}
    assert flagged == expected


def _events_with(trace, flag_index):
    return [(event, step) for event, step, _, flags in trace if flags[flag_index]]


def test_default_flow_reproduces_spec_trace(make_args):
    # CB-4.12: 4 steps per epoch, 2 epochs, eval per epoch, save_steps=3, logging_steps=2.
    args = make_args(eval_strategy="epoch", save_strategy="steps", save_steps=3, logging_steps=2)
    trace = run_flow(ours, args, 4, 2, 8)
    saves = [step for _, step in _events_with(trace, 2)]
    assert saves == [3, 6, 8]
    assert _events_with(trace, 3) == [("epoch_end", 4), ("epoch_end", 8)]
    assert [step for _, step in _events_with(trace, 4)] == [2, 4, 6, 8]

    # R2.9: logging_steps=0.25, max_steps=10 -> 3, 6, 9 (+1 with logging_first_step).
    args = make_args(logging_steps=0.25, logging_first_step=True, save_strategy="no")
    assert [step for _, step in _events_with(run_flow(ours, args, 10, 1, 10), 4)] == [1, 3, 6, 9]

    # EVAL-2.16: max_steps=6, eval_steps=4, eval_delay=3 -> evaluations at 4 and 6; logs at 1, 5.
    args = make_args(
        eval_strategy="steps", eval_steps=4, eval_delay=3, logging_first_step=True, logging_steps=5
    )
    trace = run_flow(ours, args, 6, 1, 6)
    assert [step for _, step in _events_with(trace, 3)] == [4, 6]
    assert [step for _, step in _events_with(trace, 4)] == [1, 5]


def test_default_flow_reads_plain_string_strategies():
    class Args:
        logging_strategy, eval_strategy, save_strategy = "steps", "steps", "steps"
        logging_first_step, eval_delay = False, 0

    state = ours.TrainerState(global_step=4, max_steps=10, logging_steps=2, eval_steps=4, save_steps=4)
    control = ours.DefaultFlowCallback().on_step_end(Args(), state, ours.TrainerControl())
    assert (control.should_log, control.should_evaluate, control.should_save) == (True, True, True)
    assert not control.should_training_stop


# --------------------------------------------------------------------------------------------------------------
# CallbackHandler


class RecorderA(ours.TrainerCallback):
    pass


class RecorderB(ours.TrainerCallback):
    pass


class RefRecorderA(ref.TrainerCallback):
    pass


class RefRecorderB(ref.TrainerCallback):
    pass


def _apply(lib, a_cls, b_cls, operations):
    """Apply add/pop/remove operations; return the class-name list and results after each."""
    handler = lib.CallbackHandler([lib.DefaultFlowCallback, a_cls], "model", "tok", None, None)
    instances = {"a": handler.callbacks[1]}
    outcome = []
    for op, target in operations:
        if target == "A":
            arg = a_cls
        elif target == "B":
            arg = b_cls
        elif target == "new_b":
            arg = instances.setdefault("b", b_cls())
        elif target == "stranger":
            arg = b_cls()
        else:
            arg = instances[target]
        try:
            result = getattr(handler, f"{op}_callback")(arg)
            shown = type(result).__name__.replace("Ref", "") if result is not None else None
        except ValueError:
            shown = "ValueError"
        names = [type(cb).__name__.replace("Ref", "") for cb in handler.callbacks]
        outcome.append((op, target, shown, names))
    return outcome


def test_handler_add_pop_remove_match_reference():
    operations = [
        ("add", "A"),  # duplicate class: warns, still appended
        ("add", "new_b"),
        ("pop", "A"),  # class: first instance
        ("pop", "stranger"),  # an instance not registered: None
        ("pop", "B"),
        ("pop", "B"),  # none left: None
        ("add", "B"),
        ("add", "new_b"),
        ("remove", "new_b"),  # that exact instance
        ("remove", "A"),
        ("remove", "A"),  # class absent: no-op
        ("remove", "stranger"),  # instance absent: ValueError
        ("pop", "a"),  # already removed instance: None
    ]
    mine = _apply(ours, RecorderA, RecorderB, operations)
    theirs = _apply(ref, RefRecorderA, RefRecorderB, operations)
    assert mine == theirs
    assert ("remove", "stranger", "ValueError") in [row[:3] for row in mine]


def test_handler_warns_on_duplicate_and_missing_flow(caplog):
    with caplog.at_level(logging.WARNING, logger="hf_lightning.callbacks.base"):
        handler = ours.CallbackHandler([RecorderA], None, None, None, None)
    assert "DefaultFlowCallback" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hf_lightning.callbacks.base"):
        handler.add_callback(RecorderA())
    assert "there is already one" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hf_lightning.callbacks.base"):
        ours.CallbackHandler([ref.DefaultFlowCallback], None, None, None, None)
    assert caplog.text == ""


def test_handler_refuses_objects_without_events():
    handler = ours.CallbackHandler([ours.DefaultFlowCallback], None, None, None, None)
    with pytest.raises(TypeError, match="event methods"):
        handler.add_callback(object())


class TransformersRecorder(transformers.TrainerCallback):
    """A user's callback written against transformers."""

    def __init__(self):
        self.calls = []

    def _record(self, event, args, state, control, kwargs):
        self.calls.append((event, type(args).__name__, type(state), type(control), sorted(kwargs)))


for _event in ours.EVENTS:
    setattr(
        TransformersRecorder,
        _event,
        (lambda name: lambda self, args, state, control, **kw: self._record(name, args, state, control, kw))(
            _event
        ),
    )


def test_transformers_callback_receives_our_objects_and_kwargs(make_args):
    args = make_args()
    handler = ours.CallbackHandler(
        [ours.DefaultFlowCallback, TransformersRecorder], "m", "tok", "opt", "sched"
    )
    recorder = handler.callbacks[1]
    state, control = ours.TrainerState(), ours.TrainerControl()
    for event in ours.EVENTS:
        extra = {"on_log": {"logs": {}}, "on_evaluate": {"metrics": {}}, "on_predict": {"metrics": {}}}
        returned = getattr(handler, event)(args, state, control, **extra.get(event, {}))
        assert returned is control
    assert [call[0] for call in recorder.calls] == list(ours.EVENTS)
    for event, args_name, state_type, control_type, kwargs in recorder.calls:
        assert (args_name, state_type, control_type) == (
            "TrainingArguments",
            ours.TrainerState,
            ours.TrainerControl,
        )
        expected = {"on_log": ["logs"], "on_evaluate": ["metrics"], "on_predict": ["metrics"]}.get(event, [])
        assert kwargs == sorted(SIX_COMMON_KWARGS + expected), event

    # The same kwargs as the reference's handler passes.
    ref_handler = ref.CallbackHandler(
        [ref.DefaultFlowCallback, TransformersRecorder], "m", "tok", "opt", "sched"
    )
    for event in ours.EVENTS:
        extra = {"on_log": {"logs": {}}, "on_evaluate": {"metrics": {}}, "on_predict": {"metrics": {}}}
        getattr(ref_handler, event)(args, ref.TrainerState(), ref.TrainerControl(), **extra.get(event, {}))
    assert [c[4] for c in ref_handler.callbacks[1].calls] == [c[4] for c in recorder.calls]


def test_returned_control_replaces_it_for_later_callbacks():
    replacement = ours.TrainerControl(should_save=True)
    seen = []

    class Replacer(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            return replacement

    class Watcher(ours.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(control)

    class DuckTyped:
        def on_step_end(self, args, state, control, **kwargs):
            seen.append("duck")

    handler = ours.CallbackHandler([Replacer, Watcher, DuckTyped()], *[None] * 4)
    result = handler.on_step_end(None, ours.TrainerState(max_steps=10), ours.TrainerControl())
    assert result is replacement and seen == [replacement, "duck"]
    # The duck-typed object lacks other events: they skip it.
    handler.on_log(None, ours.TrainerState(), ours.TrainerControl(), logs={})


def test_transformers_flow_and_early_stopping_run_on_our_state(make_args):
    args = make_args(eval_strategy="steps", eval_steps=2, metric_for_best_model="loss")
    handler = ours.CallbackHandler(
        [transformers.DefaultFlowCallback, transformers.EarlyStoppingCallback(early_stopping_patience=1)],
        *[None] * 4,
    )
    state = ours.TrainerState(global_step=2, max_steps=10, best_metric=0.5)
    state.compute_steps(args, 10)
    control = handler.on_step_end(args, state, ours.TrainerControl())
    assert control.should_evaluate
    control = handler.on_evaluate(args, state, control, metrics={"eval_loss": 0.7})
    assert control.should_training_stop and not control.should_evaluate


# --------------------------------------------------------------------------------------------------------------
# Printing


class Rank:
    def __init__(self, local, world):
        self.state = ours.TrainerState(is_local_process_zero=local, is_world_process_zero=world)


def _sample_logs():
    return {
        "loss": 0.123456789,
        "learning_rate": 5e-05,
        "epoch": 1.0,
        "step": 3,
        "total_flos": 1e9,
        "note": "x",
    }


def test_printer_prints_one_dict_per_log_like_reference(capsys):
    printed = []
    for printer, state_cls in (
        (ours.PrinterCallback(), ours.TrainerState),
        (ref.PrinterCallback(), ref.TrainerState),
    ):
        shared = [_sample_logs(), {"eval_loss": 2.0, "total_flos": 3.0}]
        for logs in shared:
            printer.on_log(None, state_cls(), None, logs=logs)
        assert all("total_flos" not in logs for logs in shared)  # popped from the shared dict
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1]
    lines = printed[0].splitlines()
    assert len(lines) == 2
    assert lines[0] == "{'loss': '0.1235', 'learning_rate': '5e-05', 'epoch': '1', 'step': 3, 'note': 'x'}"


def test_printer_pops_but_stays_silent_off_local_zero(capsys):
    logs = _sample_logs()
    ours.PrinterCallback().on_log(None, Rank(False, True).state, None, logs=logs)
    assert capsys.readouterr().out == "" and "total_flos" not in logs


def test_progress_callback_output_matches_reference(capsys):
    class Loader:
        def __len__(self):
            return 3

    outputs = []
    for lib in (ours, ref):
        progress = lib.ProgressCallback(max_str_len=10)
        state = lib.TrainerState(max_steps=4)
        progress.on_train_begin(None, state, None)
        for step in (1, 2):
            state.global_step = step
            progress.on_step_end(None, state, None)
        logs = dict(_sample_logs(), note="a" * 11)
        progress.on_log(None, state, None, logs=logs)
        assert "total_flos" in logs  # the progress bar writes a copy
        for _ in range(3):
            progress.on_prediction_step(None, state, None, eval_dataloader=Loader())
        assert progress.prediction_bar.n == 3 and progress.prediction_bar.total == 3
        progress.on_evaluate(None, state, None, metrics={})
        assert progress.prediction_bar is None
        bar = progress.training_bar
        assert (bar.n, bar.total) == (2, 4)
        progress.on_train_end(None, state, None)
        assert progress.training_bar is None
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    assert "String too long to display, length: 11 > 10" in outputs[0]
    assert "'loss': '0.1235'" in outputs[0] and "total_flos" not in outputs[0]


def test_progress_callback_is_silent_off_world_zero(capsys):
    progress = ours.ProgressCallback()
    state = Rank(True, False).state
    state.max_steps = 3
    progress.on_train_begin(None, state, None)
    progress.on_step_end(None, state, None)
    progress.on_log(None, state, None, logs=_sample_logs())
    progress.on_prediction_step(None, state, None, eval_dataloader=[1, 2])
    progress.on_train_end(None, state, None)
    captured = capsys.readouterr()
    assert progress.training_bar is None and progress.prediction_bar is None
    assert captured.out == "" and captured.err == ""


# --------------------------------------------------------------------------------------------------------------
# EarlyStoppingCallback


def run_early_stopping(lib, args, metrics, patience, threshold):
    """Evaluate the sequence; the trainer updates best_metric after on_evaluate, as the reference does."""
    callback = lib.EarlyStoppingCallback(patience, threshold)
    state, control = lib.TrainerState(), lib.TrainerControl()
    callback.on_train_begin(args, state, control)
    history = []
    for step, value in enumerate(metrics, start=1):
        callback.on_evaluate(args, state, control, metrics={"eval_accuracy": value})
        history.append((step, callback.early_stopping_patience_counter, control.should_training_stop))
        best = state.best_metric
        if best is None or (value > best if args.greater_is_better else value < best):
            state.best_metric = value
        if control.should_training_stop:
            break
    return history, callback.state()


SEQUENCES = [
    ([0.5, 0.6, 0.6, 0.55, 0.7, 0.8], 2, 0.0),
    ([0.5, 0.55, 0.58, 0.9, 0.95], 2, 0.1),
    ([0.9, 0.8, 0.85, 0.7, 0.6, 0.5], 3, 0.0),
    ([0.3, 0.2, 0.1, 0.05, 0.04, 0.02], 1, 0.015),
    ([0.1, 0.2, 0.3, 0.2, 0.3, 0.4], 1, 0.0),
]


@pytest.mark.parametrize("greater_is_better", [True, False])
@pytest.mark.parametrize("metrics,patience,threshold", SEQUENCES)
def test_early_stopping_matches_reference(make_args, metrics, patience, threshold, greater_is_better):
    args = make_args(
        eval_strategy="steps",
        metric_for_best_model="accuracy",
        greater_is_better=greater_is_better,
    )
    mine = run_early_stopping(ours, args, metrics, patience, threshold)
    theirs = run_early_stopping(ref, args, metrics, patience, threshold)
    assert mine == theirs


def test_early_stopping_spec_examples(make_args):
    args = make_args(
        eval_strategy="steps", metric_for_best_model="accuracy", greater_is_better=True
    )
    history, _ = run_early_stopping(ours, args, [0.5, 0.6, 0.6, 0.55, 0.7], 2, 0.0)
    assert history[-1] == (4, 2, True)
    history, exported = run_early_stopping(ours, args, [0.5, 0.55, 0.58, 0.9], 2, 0.1)
    assert history[-1] == (3, 2, True)
    assert exported == {
        "args": {"early_stopping_patience": 2, "early_stopping_threshold": 0.1},
        "attributes": {"early_stopping_patience_counter": 2},
    }


def test_early_stopping_refuses_incomplete_configuration(make_args, caplog):
    callback = ours.EarlyStoppingCallback()
    with pytest.raises(ValueError, match="metric_for_best_model"):
        callback.on_train_begin(make_args(eval_strategy="steps"), ours.TrainerState(), None)
    no_eval = make_args(metric_for_best_model="loss")
    with pytest.raises(
        AssertionError, match="eval_strategy"
    ):  # the reference asserts: still catchable as such
        callback.on_train_begin(no_eval, ours.TrainerState(), None)
    with caplog.at_level(logging.WARNING, logger="hf_lightning.callbacks.early_stopping"):
        control = ours.TrainerControl()
        callback.on_evaluate(no_eval, ours.TrainerState(), control, metrics={"eval_other": 1.0})
    assert "did not find eval_loss" in caplog.text
    assert callback.early_stopping_patience_counter == 0 and not control.should_training_stop
