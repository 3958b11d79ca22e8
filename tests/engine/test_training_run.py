"""One `TrainingRun` per `train()`: it owns the per-run state, the facade only points at it while training, and the
facade's overridable step-boundary methods are still the ones called."""

from __future__ import annotations

from hf_lightning import TrainerCallback, TrainingArguments
from hf_lightning.engine.training_run import TrainingRun
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import make_regression_mlp, regression_data

# What a train() may add to the facade's `__dict__`, and why each belongs to the facade rather than to the run.
ADDED_BY_TRAIN = {
    "current_gradient_accumulation_steps",  # the reference's public attribute (a loss override reads it)
    "_model_is_prepared",  # across runs: an evaluate() after training reports no model preparation time
    "_lightning_trainer_overrides",  # the `lightning_trainer_overrides` property's store, made at first read
    # evaluation_loop's pointer to the pass running now (evaluation/loop.py owns the pass's state), None after it;
    # read by the gathers and trainer.accelerator.gradient_state
    "_current_evaluation",
    "_gather_drops_padding",  # Seq2SeqTrainer's one-shot choice of gather, reset by each evaluation_loop
}


def _args(tmp_path, **overrides) -> TrainingArguments:
    options = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        per_device_train_batch_size=2,
        num_train_epochs=2,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=2,
        save_steps=3,
        report_to="none",
        disable_tqdm=True,
        seed=3,
    )
    options.update(overrides)
    return TrainingArguments(**options)


class RunProbe(TrainerCallback):
    """Records, at every step end, the facade's attribute names and its current run."""

    def __init__(self):
        self.trainer: HFLightningTrainer | None = None
        self.names_during: list[set[str]] = []
        self.runs: list[TrainingRun] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.names_during.append(set(vars(self.trainer)))
        self.runs.append(self.trainer._training_run)


def _probed_trainer(tmp_path, trainer_cls=HFLightningTrainer, **overrides):
    probe = RunProbe()
    trainer = trainer_cls(
        model=make_regression_mlp(),
        args=_args(tmp_path, **overrides),
        train_dataset=regression_data(8),
        eval_dataset=regression_data(4),
        callbacks=[probe],
    )
    probe.trainer = trainer
    return trainer, probe


def test_train_leaves_no_per_run_attribute_on_the_facade(tmp_path):
    trainer, probe = _probed_trainer(tmp_path)
    before = set(vars(trainer))
    assert trainer._training_run is None
    trainer.train()
    assert set(vars(trainer)) - before <= ADDED_BY_TRAIN
    assert before <= set(vars(trainer))
    assert probe.names_during and all(names - before <= ADDED_BY_TRAIN for names in probe.names_during)
    assert trainer._training_run is None


def test_each_train_gets_its_own_run_with_fresh_state(tmp_path):
    trainer, probe = _probed_trainer(tmp_path, max_steps=4)
    trainer.train()
    first = probe.runs[-1]
    assert isinstance(first, TrainingRun) and all(run is first for run in probe.runs)
    # The finished run keeps its own totals; the next one starts from none of them.
    assert first.logging.globalstep_last_logged == 4 and first.logging.total_loss_scalar > 0
    probe.runs.clear()
    trainer.train()
    second = probe.runs[0]
    assert second is not first and all(run is second for run in probe.runs)
    assert second.logging is not first.logging and second.resume is not first.resume
    assert second.initial_global_step == 0 and second.resume.files is None
    assert first.logging.globalstep_last_logged == 4  # untouched by the second run


class BoundaryRecordingTrainer(HFLightningTrainer):
    """A subclass in the wild: overrides the step boundary and the save, recording the step of each call."""

    def __init__(self, *args, **kwargs):
        self.boundaries: list[int] = []
        self.saves: list[int] = []
        super().__init__(*args, **kwargs)

    def _maybe_log_save_evaluate(self, grad_norm, epoch, learning_rate=None):
        self.boundaries.append(self.state.global_step)
        super()._maybe_log_save_evaluate(grad_norm, epoch, learning_rate=learning_rate)

    def _save_checkpoint(self, model, trial):
        self.saves.append(self.state.global_step)
        super()._save_checkpoint(model, trial)


def test_overridden_boundary_and_save_are_called_at_the_same_points(tmp_path):
    trainer, _ = _probed_trainer(tmp_path, trainer_cls=BoundaryRecordingTrainer)
    trainer.train()
    # 8 items, batch 2: 4 updates per epoch, 2 epochs. A boundary after each update and at each epoch end.
    assert trainer.boundaries == [1, 2, 3, 4, 4, 5, 6, 7, 8, 8]
    assert trainer.saves == [3, 6, 8]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6", "checkpoint-8"]
    steps_logged = [entry["step"] for entry in trainer.state.log_history if "loss" in entry]
    assert steps_logged == [1, 2, 3, 4, 5, 6, 7, 8]


class NoSaveTrainer(HFLightningTrainer):
    """An override that changes the decision before the default boundary runs: no checkpoint at all."""

    def _maybe_log_save_evaluate(self, grad_norm, epoch, learning_rate=None):
        self.control.should_save = False
        super()._maybe_log_save_evaluate(grad_norm, epoch, learning_rate=learning_rate)


def test_an_override_of_the_boundary_decides_what_the_run_does(tmp_path):
    trainer, _ = _probed_trainer(tmp_path, trainer_cls=NoSaveTrainer)
    trainer.train()
    assert list(tmp_path.glob("checkpoint-*")) == []
    assert any("eval_loss" in entry for entry in trainer.state.log_history)
