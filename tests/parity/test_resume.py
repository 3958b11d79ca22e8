"""train(resume_from_checkpoint=...): exactness against the uninterrupted run, checkpoint choice, interchange.

CKPT-3.13 to CKPT-3.16 and R2.10. Run A trains straight; run B has the same arguments, is stopped by a
callback at a checkpointed step, then a fresh trainer with a differently initialised model resumes. On CPU in fp32
hf_lightning's B must end bit-identical to its A (torch.equal), with the same log history, and follow the
reference's trajectory. Checkpoints move both ways between transformers.Trainer and hf_lightning.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import transformers
from torch import nn

from hf_lightning import TrainingArguments
from hf_lightning.checkpoint.resume import Resumer
from hf_lightning.core.checkpoint_files import COMPLETE_MARKER_NAME, OPTIMIZER_NAME
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.checkpoint.chosen_checkpoints import record_chosen_checkpoints
from tests.models import (
    DropoutMLP,
    LinearRegressor,
    ListDataset,
    classification_data,
    make_tiny_bert_classifier,
    regression_data,
)

RUNTIME_SUFFIXES = ("_runtime", "_per_second")


class StopAt(transformers.TrainerCallback):
    """Stops training after update `step` (the save at that step happens first)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def tiny_bert_with_dropout(seed: int) -> nn.Module:
    model = make_tiny_bert_classifier(seed)
    model.config.hidden_dropout_prob = 0.1
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.1
    return model


@dataclass
class Run:
    trainer: Any
    output: Any
    weights: dict[str, torch.Tensor]

    @property
    def log_history(self) -> list[dict]:
        return self.trainer.state.log_history


def train(
    library: str,
    output_dir,
    dataset,
    *,
    stop_at: int | None = None,
    resume: Any = None,
    model_seed: int = 0,
    make_model=tiny_bert_with_dropout,
    mixin: type | None = None,
    **settings,
) -> Run:
    """One run under `library` ("ours" / "reference"); B runs use another `model_seed` to prove the weights load.
    `mixin`'s methods override the library's Trainer, as a subclass's would."""
    args_cls = TrainingArguments if library == "ours" else transformers.TrainingArguments
    trainer_cls = HFLightningTrainer if library == "ours" else transformers.Trainer
    if mixin is not None:
        trainer_cls = type(f"{mixin.__name__}{trainer_cls.__name__}", (mixin, trainer_cls), {})
    defaults = dict(
        use_cpu=True, report_to="none", disable_tqdm=True, per_device_train_batch_size=2, seed=123
    )
    defaults.update(learning_rate=1e-3, logging_steps=1)
    args = args_cls(output_dir=str(output_dir), **{**defaults, **settings})
    trainer = trainer_cls(
        model=make_model(model_seed),
        args=args,
        train_dataset=dataset,
        callbacks=[StopAt(stop_at)] if stop_at is not None else [],
    )
    output = trainer.train(resume_from_checkpoint=resume)
    weights = {name: tensor.detach().clone() for name, tensor in trainer.model.state_dict().items()}
    return Run(trainer, output, weights)


def comparable(log_history: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if not k.endswith(RUNTIME_SUFFIXES)} for entry in log_history]


def step_logs(log_history: list[dict]) -> list[dict]:
    """The per-step entries: the final train summary covers only the steps of its own train() call."""
    return [entry for entry in comparable(log_history) if "train_loss" not in entry]


def assert_logs_close(got: list[dict], expected: list[dict]) -> None:
    assert [entry.keys() for entry in got] == [entry.keys() for entry in expected]
    for got_entry, expected_entry in zip(got, expected):
        assert got_entry == pytest.approx(expected_entry, rel=1e-5, abs=1e-7)


def assert_bit_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, f"weights differ: {different}"


def max_difference(a: dict, b: dict) -> float:
    return max((a[name].double() - b[name].double()).abs().max().item() for name in a)


# ---- exactness: A (straight) vs B (stopped, then resumed) ---------------------------------------------------------

# id, items (batch 2), gradient accumulation, max_steps, stop (and checkpoint) step
SCENARIOS = [
    ("ga2-mid-epoch-across-boundary", 10, 2, 8, 4),  # 5 micro-batches, windows 2+2+1; resumes 1 window in
    ("ga1-mid-epoch", 24, 1, 8, 4),  # 12 micro-batches per epoch, skip 4
    ("ga2-mid-epoch", 20, 2, 8, 4),  # 10 micro-batches per epoch, skip 8
    ("crosses-epoch-boundary", 12, 1, 12, 4),  # 6 per epoch: resumed run crosses into epoch 1
    ("at-epoch-boundary", 12, 1, 12, 6),  # resumes exactly at the start of epoch 1
]


@pytest.mark.parametrize(
    "items, ga, max_steps, stop", [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS]
)
def test_resumed_run_is_bit_identical_to_the_uninterrupted_one(tmp_path, items, ga, max_steps, stop):
    dataset = classification_data(items)
    settings = dict(gradient_accumulation_steps=ga, max_steps=max_steps, save_steps=stop)
    straight = train("ours", tmp_path / "a", dataset, **settings)
    train("ours", tmp_path / "b", dataset, stop_at=stop, **settings)
    resumed = train("ours", tmp_path / "b", dataset, resume=True, model_seed=7, **settings)

    assert resumed.output.global_step == straight.output.global_step == max_steps
    assert_bit_identical(resumed.weights, straight.weights)
    assert step_logs(resumed.log_history) == step_logs(straight.log_history)
    # ... and the reference's trajectory: its uninterrupted run, to the parity tolerance.
    reference = train("reference", tmp_path / "r", dataset, **settings)
    assert max_difference(straight.weights, reference.weights) <= 1e-6
    assert [e["step"] for e in step_logs(reference.log_history)] == [
        e["step"] for e in step_logs(straight.log_history)
    ]


def test_resumed_log_history_and_summary_equal_the_reference(tmp_path):
    """The whole resumed log history, train summary included (train_loss covers the resumed steps only)."""
    dataset = classification_data(10)
    settings = dict(gradient_accumulation_steps=2, max_steps=8, save_steps=4)
    runs = {}
    for library in ("reference", "ours"):
        train(library, tmp_path / library, dataset, stop_at=4, **settings)
        runs[library] = train(library, tmp_path / library, dataset, resume=True, model_seed=7, **settings)
    assert_logs_close(comparable(runs["ours"].log_history), comparable(runs["reference"].log_history))
    assert runs["ours"].output.training_loss == pytest.approx(
        runs["reference"].output.training_loss, rel=1e-5
    )
    assert max_difference(runs["ours"].weights, runs["reference"].weights) <= 1e-6


def test_rng_restore_point_matters(tmp_path, monkeypatch):
    """Mutation check: without the reference's RNG restore after the first window, dropout draws differ."""
    dataset = classification_data(10)
    settings = dict(gradient_accumulation_steps=2, max_steps=8, save_steps=4)
    straight = train("ours", tmp_path / "a", dataset, **settings)
    train("ours", tmp_path / "b", dataset, stop_at=4, **settings)
    monkeypatch.setattr(Resumer, "sync_rng_after_first_window", lambda connector: None)
    unsynced = train("ours", tmp_path / "b", dataset, resume=True, model_seed=7, **settings)
    assert max_difference(unsynced.weights, straight.weights) > 0


# ---- data order (R2.10) and ignore_data_skip ------------------------------------------------------------------------


class IndexRecordingModel(nn.Module):
    """A regression model that records the dataset indices of every micro-batch it trains on."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(0.1), nn.Linear(8, 1))
        self.seen: list[list[int]] = []

    def forward(self, x, labels=None, idx=None):
        self.seen.append(idx.tolist())
        logits = self.net(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(logits, labels), "logits": logits}


def indexed_data(n: int) -> ListDataset:
    items = regression_data(n).items
    return ListDataset([{**item, "idx": torch.tensor(i)} for i, item in enumerate(items)])


R210 = dict(num_train_epochs=2, save_steps=3, seed=42)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("library", ["ours", "reference"])
def test_resume_sees_exactly_the_unseen_batches(tmp_path, library, workers):
    """R2.10: 8 items, batch 2, 2 epochs, resume from checkpoint-3: batches 4..8 of the uninterrupted run, also
    when worker processes load the data (torch's multi-worker iterator iterates the sampler twice)."""
    dataset = indexed_data(8)
    settings = dict(R210, dataloader_num_workers=workers)
    straight = train(library, tmp_path / "a", dataset, make_model=IndexRecordingModel, **settings)
    train(library, tmp_path / "b", dataset, stop_at=3, make_model=IndexRecordingModel, **settings)
    resumed = train(
        library,
        tmp_path / "b",
        dataset,
        resume=str(tmp_path / "b" / "checkpoint-3"),
        make_model=IndexRecordingModel,
        model_seed=7,
        **settings,
    )
    assert resumed.trainer.model.seen == straight.trainer.model.seen[3:]
    # The order measured on the reference for this fixture (seed 42).
    assert resumed.trainer.model.seen == [[4, 5], [4, 5], [7, 1], [3, 2], [6, 0]]
    assert_bit_identical(resumed.weights, straight.weights)


def test_ignore_data_skip_restarts_the_epoch_like_the_reference(tmp_path):
    dataset = indexed_data(12)
    settings = dict(max_steps=8, save_steps=4, ignore_data_skip=True)
    runs = {}
    for library in ("reference", "ours"):
        train(library, tmp_path / library, dataset, stop_at=4, make_model=IndexRecordingModel, **settings)
        runs[library] = train(
            library,
            tmp_path / library,
            dataset,
            resume=True,
            make_model=IndexRecordingModel,
            model_seed=7,
            **settings,
        )
    ours, reference = runs["ours"], runs["reference"]
    straight = train("ours", tmp_path / "a", dataset, make_model=IndexRecordingModel, **settings)
    # 6 batches per epoch, stopped 4 into epoch 0: the resumed epoch starts again from its first batch.
    assert ours.trainer.model.seen == straight.trainer.model.seen[:4]
    assert ours.trainer.model.seen == reference.trainer.model.seen
    assert ours.output.global_step == reference.output.global_step == 8
    assert_logs_close(step_logs(ours.log_history), step_logs(reference.log_history))
    assert max_difference(ours.weights, reference.weights) <= 1e-6
    assert max_difference(ours.weights, straight.weights) > 0


class CountingDataset(torch.utils.data.Dataset):
    def __init__(self, base):
        self.base = base
        self.loaded: list[int] = []

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        self.loaded.append(index)
        return self.base[index]


def test_skipped_batches_are_never_loaded(tmp_path):
    """Fast-forward costs no pass over the skipped data: skipped at the batch-index level. The reference (accelerate's
    `skip_first_batches` -> `SkipBatchSampler`) does the same for a map-style dataset: the same items are loaded."""
    settings = dict(max_steps=8, save_steps=4, seed=3)
    loaded = {}
    for library in ("reference", "ours"):
        train(
            library, tmp_path / library, regression_data(24), stop_at=4, make_model=linear_regressor, **settings
        )
        dataset = CountingDataset(regression_data(24))
        train(library, tmp_path / library, dataset, resume=True, make_model=linear_regressor, **settings)
        loaded[library] = dataset.loaded
    # Ours reads the first example once more, when the Trainer is built (engine/input_checks.py: can the default
    # collator batch it?); then exactly the reference's items.
    assert loaded["ours"][0] == 0
    assert len(loaded["ours"][1:]) == 4 * 2 + 2  # the 4 resumed steps' items, plus one batch fetched ahead
    assert loaded["ours"][1:] == loaded["reference"]


def linear_regressor(seed: int = 0) -> LinearRegressor:
    """A seeded one-layer regressor, the run's `make_model` (called with the model seed)."""
    return LinearRegressor(seed=seed)


class LoadsNothingOnResume:
    """A subclass that takes over the resume's weight loading (as sentence-transformers does) and loads nothing."""

    calls: list[tuple[str, Any]] = []

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        self.calls.append((os.path.basename(resume_from_checkpoint), model))


def test_an_overridden_load_from_checkpoint_is_what_a_resume_calls(tmp_path):
    """The resume calls the subclass's `_load_from_checkpoint` (once, with the folder alone) instead of loading the
    weights itself: the run trains on from the new model's own weights, in both libraries alike."""
    dataset = classification_data(10)
    settings = dict(gradient_accumulation_steps=2, max_steps=8, save_steps=4)
    straight = train("ours", tmp_path / "a", dataset, **settings)
    runs = {}
    for library in ("reference", "ours"):
        LoadsNothingOnResume.calls = []
        train(library, tmp_path / library, dataset, stop_at=4, **settings)
        runs[library] = train(
            library, tmp_path / library, dataset, resume=True, model_seed=7, mixin=LoadsNothingOnResume, **settings
        )
        assert LoadsNothingOnResume.calls == [("checkpoint-4", None)]
    assert max_difference(runs["ours"].weights, runs["reference"].weights) <= 1e-6
    assert max_difference(runs["ours"].weights, straight.weights) > 1e-3


class RecordsCheckpointLoads:
    """Records each of the reference's checkpoint-loading override points a resume calls, then runs the base's."""

    calls: list[tuple[str, str | None]] = []

    def _record(self, name: str, checkpoint: Any) -> None:
        self.calls.append((name, os.path.basename(checkpoint) if checkpoint is not None else None))

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        self._record("_load_from_checkpoint", resume_from_checkpoint)
        return super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_optimizer_and_scheduler(self, checkpoint):
        self._record("_load_optimizer_and_scheduler", checkpoint)
        return super()._load_optimizer_and_scheduler(checkpoint)

    def _load_scaler(self, checkpoint):
        self._record("_load_scaler", checkpoint)
        return super()._load_scaler(checkpoint)

    def _load_rng_state(self, checkpoint):
        self._record("_load_rng_state", checkpoint)
        return super()._load_rng_state(checkpoint)

    def _load_callback_state(self):
        self._record("_load_callback_state", None)
        return super()._load_callback_state()


@pytest.mark.parametrize("stop", [4, 5], ids=["mid-epoch", "epoch-boundary"])
def test_a_resume_calls_the_references_loading_override_points_in_its_order(tmp_path, stop):
    """Each loading method a subclass may override is called by the resume, once, in the reference's order and
    with the checkpoint folder; the resumed runs end equal."""
    dataset = classification_data(10)
    settings = dict(max_steps=8, save_steps=stop, restore_callback_states_from_checkpoint=True)
    runs, calls = {}, {}
    for library in ("reference", "ours"):
        RecordsCheckpointLoads.calls = []
        train(library, tmp_path / library, dataset, stop_at=stop, **settings)
        runs[library] = train(
            library, tmp_path / library, dataset, resume=True, model_seed=7, mixin=RecordsCheckpointLoads, **settings
        )
        calls[library] = RecordsCheckpointLoads.calls
    assert calls["ours"] == calls["reference"]
    assert {name for name, _ in calls["ours"]} == {
        "_load_from_checkpoint", "_load_optimizer_and_scheduler", "_load_scaler", "_load_rng_state",
        "_load_callback_state",
    }
    assert max_difference(runs["ours"].weights, runs["reference"].weights) <= 1e-6


# ---- choosing the checkpoint (3.13) --------------------------------------------------------------------------------


def test_resume_true_picks_the_newest_complete_checkpoint(tmp_path, monkeypatch):
    dataset = classification_data(10)
    settings = dict(gradient_accumulation_steps=2, max_steps=8, save_steps=2)
    straight = train("ours", tmp_path / "a", dataset, **settings)
    run_dir = tmp_path / "b"
    train("ours", run_dir, dataset, stop_at=6, **settings)
    # checkpoint-6 is damaged (no marker, no optimizer state), decoys are ignored, a killed save's scratch is tidied.
    os.remove(run_dir / "checkpoint-6" / COMPLETE_MARKER_NAME)
    os.remove(run_dir / "checkpoint-6" / OPTIMIZER_NAME)
    (run_dir / "checkpoint-50").write_text("not a folder")
    shutil.copytree(run_dir / "checkpoint-4", run_dir / "checkpoint-100x")
    shutil.copytree(run_dir / "checkpoint-2", run_dir / ".checkpoint-8.tmp-999")
    chosen = record_chosen_checkpoints(monkeypatch)
    resumed = train("ours", run_dir, dataset, resume=True, model_seed=7, **settings)
    assert chosen[-1] == str(run_dir / "checkpoint-4")
    assert not (run_dir / ".checkpoint-8.tmp-999").exists()
    assert_bit_identical(resumed.weights, straight.weights)


def test_reference_choice_of_checkpoint_with_decoys(tmp_path, monkeypatch):
    """3.13 Check: a decoy file `checkpoint-50` and a decoy dir `checkpoint-100x` next to `checkpoint-8`."""
    dataset = classification_data(10)
    settings = dict(gradient_accumulation_steps=2, max_steps=8, save_steps=8)
    train("ours", tmp_path, dataset, **settings)
    (tmp_path / "checkpoint-50").write_text("decoy")
    (tmp_path / "checkpoint-100x").mkdir()
    chosen = record_chosen_checkpoints(monkeypatch)
    ours = train("ours", tmp_path, dataset, resume=True, **settings)
    assert chosen[-1] == str(tmp_path / "checkpoint-8")
    assert transformers.trainer_utils.get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-8")
    # Already finished: no step, train_loss 0.0, as measured for the reference.
    assert ours.output.global_step == 8 and ours.output.training_loss == 0.0


def test_no_checkpoint_and_no_weights_errors_match_the_reference(tmp_path):
    dataset = classification_data(10)
    for library in ("ours", "reference"):
        with pytest.raises(ValueError, match=r"No valid checkpoint found in output directory"):
            train(library, tmp_path / library, dataset, resume=True, max_steps=2)
        empty = tmp_path / library / "checkpoint-3"
        empty.mkdir(parents=True)
        with pytest.raises(ValueError, match=r"Can't find a valid checkpoint at"):
            train(library, tmp_path / library, dataset, resume=str(empty), max_steps=2)


# ---- interchange with transformers.Trainer ---------------------------------------------------------------------------


@pytest.mark.parametrize("writer, reader", [("reference", "ours"), ("ours", "reference")])
def test_checkpoints_resume_across_libraries(tmp_path, writer, reader):
    dataset = classification_data(10)
    settings = dict(gradient_accumulation_steps=2, max_steps=8, save_steps=4)
    straight = {
        library: train(library, tmp_path / f"a-{library}", dataset, **settings)
        for library in (writer, reader)
    }
    train(writer, tmp_path / "b", dataset, stop_at=4, **settings)
    resumed = train(
        reader, tmp_path / "b", dataset, resume=str(tmp_path / "b" / "checkpoint-4"), model_seed=7, **settings
    )
    assert resumed.output.global_step == 8
    # Both libraries are bit-identical with themselves on this fixture and with each other (measured), so the
    # resumed run must end exactly where either uninterrupted run ends.
    assert_bit_identical(straight[writer].weights, straight[reader].weights)
    assert_bit_identical(resumed.weights, straight[reader].weights)
    resumed_steps = [e["step"] for e in step_logs(resumed.log_history)]
    assert resumed_steps == [e["step"] for e in step_logs(straight[reader].log_history)]
    assert_logs_close(step_logs(resumed.log_history), step_logs(straight[writer].log_history))


# ---- documented divergence ----------------------------------------------------------------------------------------


def test_resume_from_the_final_checkpoint_of_a_mid_epoch_max_steps_run(tmp_path):
    """docs/divergences.md: the reference fast-forwards into the unfinished epoch and trains one update past
    `max_steps` (5 -> 6); hf_lightning stops at `max_steps` and trains nothing, as for a run that ends on an epoch."""
    dataset = regression_data(8)  # 4 updates per epoch; max_steps 5 ends one update into epoch 1
    settings = dict(max_steps=5, save_steps=5)
    finals = {}
    for library in ("reference", "ours"):
        first = train(library, tmp_path / library, dataset, make_model=linear_regressor, **settings)
        finals[library] = train(
            library, tmp_path / library, dataset, resume=True, make_model=linear_regressor, **settings
        )
        if library == "ours":
            assert_bit_identical(finals[library].weights, first.weights)
    assert finals["reference"].output.global_step == 6
    assert finals["ours"].output.global_step == 5
    assert finals["ours"].output.training_loss == 0.0


# ---- what else is restored, and other data sources -------------------------------------------------------------------


class CountingCallback(transformers.TrainerCallback, transformers.trainer_callback.ExportableState):
    """A stateful callback (counts updates); the same class serves both libraries."""

    def __init__(self, start: int = 0):
        self.count = start

    def on_step_end(self, args, state, control, **kwargs):
        self.count += 1

    def state(self) -> dict:
        return {"args": {"start": 0}, "attributes": {"count": self.count}}


def callbacks_after_resume(library: str, run_dir, restore: bool) -> tuple[list[str], int, Any]:
    settings = dict(max_steps=8, save_steps=4, restore_callback_states_from_checkpoint=restore)
    args_cls = TrainingArguments if library == "ours" else transformers.TrainingArguments
    trainer_cls = HFLightningTrainer if library == "ours" else transformers.Trainer
    for resume in (None, True):
        user_callback = CountingCallback()
        trainer = trainer_cls(
            model=linear_regressor(),
            args=args_cls(
                output_dir=str(run_dir), use_cpu=True, report_to="none", disable_tqdm=True, **settings
            ),
            train_dataset=regression_data(16),
            callbacks=[user_callback, StopAt(4)] if resume is None else [user_callback],
        )
        trainer.train(resume_from_checkpoint=resume)
    names = [type(callback).__name__ for callback in trainer.callback_handler.callbacks]
    counting = [
        callback for callback in trainer.callback_handler.callbacks if isinstance(callback, CountingCallback)
    ]
    assert len(counting) == 1
    return names, counting[0].count, counting[0] is user_callback


@pytest.mark.parametrize("restore", [True, False])
def test_stateful_callbacks_restored_like_the_reference(tmp_path, restore):
    """3.14.3: with the flag a new instance carries the stored count and goes to the end of the list."""
    ours = callbacks_after_resume("ours", tmp_path / "ours", restore)
    reference = callbacks_after_resume("reference", tmp_path / "reference", restore)
    assert ours[1:] == reference[1:] == ((8, False) if restore else (4, True))
    # Same order of the shared callbacks (each library adds its own flow / printer callbacks around them).
    assert ours[0][-1] == reference[0][-1] == ("CountingCallback" if restore else "PrinterCallback")


def test_save_only_model_checkpoint_restarts_the_schedule_in_the_reference_and_is_refused_here(tmp_path):
    """3.3: the reference restores the weights and trainer state and starts the optimizer and schedule afresh,
    silently; ours refuses the checkpoint before training, naming save_only_model (docs/divergences.md)."""
    settings = dict(max_steps=6, save_steps=2, save_only_model=True, learning_rate=5e-5)
    for library in ("reference", "ours"):
        train(library, tmp_path / library, regression_data(16), stop_at=2, make_model=linear_regressor, **settings)
    resumed = train(
        "reference",
        tmp_path / "reference",
        regression_data(16),
        resume=str(tmp_path / "reference" / "checkpoint-2"),
        make_model=linear_regressor,
        **settings,
    )
    rates = [e["learning_rate"] for e in step_logs(resumed.log_history)[2:]]
    assert rates == pytest.approx([5e-05, 4.1667e-05, 3.3333e-05, 2.5e-05], rel=1e-3)  # the schedule restarted
    before = sorted(path.name for path in (tmp_path / "ours").iterdir())
    with pytest.raises(ValueError, match=r"checkpoint-2.*save_only_model=True") as refused:
        train(
            "ours",
            tmp_path / "ours",
            regression_data(16),
            resume=str(tmp_path / "ours" / "checkpoint-2"),
            make_model=linear_regressor,
            **settings,
        )
    assert "optimizer" in str(refused.value) and "load_state_dict" in str(refused.value)
    assert sorted(path.name for path in (tmp_path / "ours").iterdir()) == before  # nothing trained or saved


class StreamOfItems(torch.utils.data.IterableDataset):
    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


def test_iterable_dataset_resumes_exactly(tmp_path):
    """No indices to skip: the trained batches are read and discarded (as accelerate does), then the RNG restored."""
    dataset = StreamOfItems(regression_data(40).items)
    settings = dict(max_steps=8, save_steps=3, gradient_accumulation_steps=2)
    straight = train("ours", tmp_path / "a", dataset, make_model=DropoutMLP, **settings)
    train("ours", tmp_path / "b", dataset, stop_at=3, make_model=DropoutMLP, **settings)
    resumed = train(
        "ours", tmp_path / "b", dataset, resume=True, make_model=DropoutMLP, model_seed=7, **settings
    )
    reference = train("reference", tmp_path / "r", dataset, make_model=DropoutMLP, **settings)
    assert_bit_identical(resumed.weights, straight.weights)
    assert step_logs(resumed.log_history) == step_logs(straight.log_history)
    assert max_difference(straight.weights, reference.weights) <= 1e-6


class PlainLoaderTrainer(HFLightningTrainer):
    """A user override returning a torch DataLoader, which cannot skip by index: batches are replayed."""

    def get_train_dataloader(self):
        from hf_lightning.data.collate import default_data_collator

        return torch.utils.data.DataLoader(self.train_dataset, batch_size=2, collate_fn=default_data_collator)


def test_plain_dataloader_from_an_override_is_fast_forwarded_by_replay(tmp_path, caplog):
    settings = dict(max_steps=8, save_steps=4)
    args = dict(use_cpu=True, report_to="none", disable_tqdm=True, logging_steps=1, **settings)
    runs = []
    for run_dir, callbacks, resume, seed in (
        ("a", [], None, 0),
        ("b", [StopAt(4)], None, 0),
        ("b", [], True, 7),
    ):
        trainer = PlainLoaderTrainer(
            model=DropoutMLP(seed),
            args=TrainingArguments(output_dir=str(tmp_path / run_dir), **args),
            train_dataset=regression_data(12),
            callbacks=callbacks,
        )
        with caplog.at_level("WARNING", logger="hf_lightning.checkpoint.resume"):
            trainer.train(resume_from_checkpoint=resume)
        runs.append(trainer)
    assert "loaded and discarded" in caplog.text
    assert_bit_identical(runs[2].model.state_dict(), runs[0].model.state_dict())
    assert step_logs(runs[2].state.log_history) == step_logs(runs[0].state.log_history)


def test_auto_find_batch_size_reuses_the_saved_batch_size_like_the_reference(tmp_path):
    sizes = {}
    for library in ("reference", "ours"):
        settings = dict(max_steps=4, save_steps=2, auto_find_batch_size=True)
        train(
            library, tmp_path / library, regression_data(16), stop_at=2, make_model=linear_regressor, **settings
        )
        resumed = train(
            library,
            tmp_path / library,
            regression_data(16),
            resume=True,
            make_model=linear_regressor,
            per_device_train_batch_size=4,
            **settings,
        )
        sizes[library] = (resumed.trainer._train_batch_size, resumed.output.global_step)
    assert sizes["ours"] == sizes["reference"] == (2, 4)


def test_a_resume_path_that_is_no_folder_is_named_with_the_checkpoints_there_are(tmp_path):
    """The reference's words ("Can't find a valid checkpoint at"), then why and the checkpoint-N folders to pick from."""
    dataset = classification_data(10)
    train("ours", tmp_path, dataset, max_steps=2, save_steps=1)
    missing = tmp_path / "checkpoint-999"
    with pytest.raises(ValueError, match=r"Can't find a valid checkpoint at") as info:
        train("ours", tmp_path, dataset, resume=str(missing), max_steps=2)
    assert "no such folder" in str(info.value)
    assert str(tmp_path / "checkpoint-1") in str(info.value) and str(tmp_path / "checkpoint-2") in str(info.value)
    with pytest.raises(ValueError, match=r"Can't find a valid checkpoint at") as info:  # output_dir spelt "out/"
        train("ours", f"{tmp_path}{os.sep}", dataset, resume=str(missing), max_steps=2)
    assert str(info.value).count(str(tmp_path / "checkpoint-1")) == 1
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"Can't find a valid checkpoint at .*it is a file, not a checkpoint folder"):
        train("ours", tmp_path, dataset, resume=str(a_file), max_steps=2)
