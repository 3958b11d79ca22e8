"""Callback event parity: a `transformers.TrainerCallback` subclass records every event, with the state
and control values it sees, under transformers.Trainer and under HFLightningTrainer (CB-4.6, CB-4.12)."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import transformers

from hf_lightning.callbacks.base import EVENTS
from tests.models import make_regression_mlp, regression_data
from tests.parity.harness import run_parity

CONTROL_FLAGS = ("should_training_stop", "should_epoch_stop", "should_save", "should_evaluate", "should_log")
EVENT_KWARGS = (
    "model",
    "processing_class",
    "optimizer",
    "lr_scheduler",
    "train_dataloader",
    "eval_dataloader",
    "metrics",
    "logs",
)


class EventRecorder(transformers.TrainerCallback):
    """Records (event, global_step, epoch, control flags, keyword names) at every event."""

    def __init__(self):
        self.events: list[tuple] = []

    def _record(self, name, args, state, control, **kwargs):
        flags = tuple(getattr(control, flag) for flag in CONTROL_FLAGS)
        present = tuple(sorted(key for key in EVENT_KWARGS if kwargs.get(key) is not None))
        self.events.append((name, state.global_step, state.epoch, flags, present))


def _make_event(name):
    def handler(self, args, state, control, **kwargs):
        self._record(name, args, state, control, **kwargs)

    return handler


for _event in EVENTS:
    setattr(EventRecorder, _event, _make_event(_event))


class StopAtStep(transformers.TrainerCallback):
    """Asks the trainer to stop after update 3."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 3:
            control.should_training_stop = True


class EndEpochAtSecondStep(transformers.TrainerCallback):
    """Asks the trainer to end each epoch after its second update."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % 4 == 2:
            control.should_epoch_stop = True


CONFIGS = {
    "accumulation_2": dict(gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=1),
    "eval_per_epoch": dict(num_train_epochs=2, eval_strategy="epoch", logging_strategy="epoch"),
    "eval_per_steps_save_every_3": dict(
        max_steps=7, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=3, logging_steps=2
    ),
    "logging_first_step": dict(num_train_epochs=1, logging_first_step=True, logging_steps=3),
    "max_steps_mid_epoch": dict(max_steps=5, logging_steps=2, save_strategy="steps", save_steps=10),
    "callback_stops_training": dict(num_train_epochs=3, logging_steps=1, extra_callbacks=(StopAtStep,)),
    "callback_ends_epochs": dict(num_train_epochs=3, logging_steps=1, extra_callbacks=(EndEpochAtSecondStep,)),
    "early_stopping": dict(
        num_train_epochs=6,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="steps",
        save_steps=1,
        load_best_model_at_end=True,
        learning_rate=0.5,
        extra_callbacks=("early",),
    ),
}


def _callbacks(extra):
    callbacks = []
    for item in extra:
        if item == "early":
            callbacks.append(transformers.EarlyStoppingCallback(early_stopping_patience=1))
        else:
            callbacks.append(item())
    return callbacks


@pytest.mark.parametrize("name", list(CONFIGS))
def test_event_sequence_matches_reference(tmp_path, name):
    config = dict(CONFIGS[name])
    extra = config.pop("extra_callbacks", ())
    reference_recorder, our_recorder = EventRecorder(), EventRecorder()
    needs_eval = config.get("eval_strategy", "no") != "no"
    result = run_parity(
        make_regression_mlp(),
        regression_data(10),
        tmp_path,
        reference_trainer_kwargs={"callbacks": [reference_recorder, *_callbacks(extra)]},
        our_trainer_kwargs={"callbacks": [our_recorder, *_callbacks(extra)]},
        trainer_kwargs={"eval_dataset": regression_data(4, seed=2)} if needs_eval else None,
        per_device_train_batch_size=3,
        **{"learning_rate": 1e-2, "save_strategy": "no", **config},
    )
    names = {event[0] for event in reference_recorder.events}
    assert {"on_init_end", "on_train_begin", "on_step_end", "on_log", "on_train_end"} <= names
    assert ("on_evaluate" in names) is needs_eval
    assert ("on_save" in names) is (config.get("save_strategy", "no") != "no")
    assert len(our_recorder.events) == len(reference_recorder.events)
    for index, (ours, reference) in enumerate(zip(our_recorder.events, reference_recorder.events)):
        assert ours == reference, f"event {index}: {ours} != {reference}"
    assert result.ours.trainer.state.global_step == result.reference.trainer.state.global_step
    if name == "early_stopping":
        assert result.ours.trainer.state.best_global_step == result.reference.trainer.state.best_global_step
        assert result.ours.trainer.state.global_step < 6 * 4  # it did stop early


class LightningEvents(pl.Callback):
    def __init__(self):
        self.events: list[str] = []

    def on_train_start(self, trainer, module):
        self.events.append("on_train_start")

    def on_train_epoch_start(self, trainer, module):
        self.events.append("on_train_epoch_start")

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.events.append("on_train_batch_end")

    def on_train_epoch_end(self, trainer, module):
        self.events.append("on_train_epoch_end")

    def on_train_end(self, trainer, module):
        self.events.append("on_train_end")


def test_mixed_hf_and_lightning_callbacks(tmp_path):
    """One HF callback and one Lightning callback in `callbacks=`, each seeing its own events."""
    from hf_lightning import TrainingArguments
    from hf_lightning.trainer.trainer import HFLightningTrainer

    hf_recorder, lightning_recorder = EventRecorder(), LightningEvents()
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        per_device_train_batch_size=5,
        num_train_epochs=2,
    )
    trainer = HFLightningTrainer(
        model=make_regression_mlp(),
        args=args,
        train_dataset=regression_data(10),
        callbacks=[hf_recorder, lightning_recorder],
    )
    trainer.train()
    hf_names = [event[0] for event in hf_recorder.events]
    assert hf_names.count("on_step_end") == 4 and hf_names.count("on_epoch_begin") == 2
    assert lightning_recorder.events == [
        "on_train_start",
        "on_train_epoch_start",
        "on_train_batch_end",
        "on_train_batch_end",
        "on_train_epoch_end",
        "on_train_epoch_start",
        "on_train_batch_end",
        "on_train_batch_end",
        "on_train_epoch_end",
        "on_train_end",
    ]
    assert lightning_recorder not in trainer.callback_handler.callbacks
    assert lightning_recorder in trainer.lightning_trainer.callbacks


def test_spec_4_12_trace_with_tiny_bert(tmp_path):
    """The recorded configuration of CB-4.12: the whole event trace and the checkpoint folders match."""
    from tests.models import classification_data, make_tiny_bert_classifier

    reference_recorder, our_recorder = EventRecorder(), EventRecorder()
    result = run_parity(
        make_tiny_bert_classifier(),
        classification_data(16),
        tmp_path,
        reference_trainer_kwargs={"callbacks": [reference_recorder]},
        our_trainer_kwargs={"callbacks": [our_recorder]},
        trainer_kwargs={"eval_dataset": classification_data(8, seed=5)},
        per_device_train_batch_size=2,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        eval_strategy="epoch",
        save_strategy="steps",
        save_steps=3,
        logging_steps=2,
        train_sampling_strategy="sequential",
        learning_rate=1e-3,
    )
    assert our_recorder.events == reference_recorder.events
    assert sum(1 for e in our_recorder.events if e[0] == "on_prediction_step") == 4
    ours, reference = result.ours.trainer.state, result.reference.trainer.state
    for field in (
        "epoch", "global_step", "max_steps", "logging_steps", "eval_steps", "save_steps", "train_batch_size",
        "num_train_epochs", "num_input_tokens_seen", "total_flos", "best_metric", "best_global_step",
        "is_local_process_zero", "is_world_process_zero", "is_hyper_param_search", "trial_name", "trial_params",
    ):
        assert getattr(ours, field) == getattr(reference, field), field
    for side in ("reference", "ours"):
        folders = sorted(p.name for p in (tmp_path / side).glob("checkpoint-*"))
        assert folders == ["checkpoint-3", "checkpoint-6", "checkpoint-8"]
