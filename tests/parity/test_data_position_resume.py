"""Resuming into an iterable dataset's epoch from the data position a checkpoint keeps (data/position_files.py).

A dataset with `state_dict()` / `load_state_dict()` (HF datasets' IterableDataset, or a user's) is put back where
the checkpoint left it instead of being replayed: the resumed run is bit-identical to the uninterrupted one and to
the replayed resume, matches transformers.Trainer's resume (which replays) in the first pass, and draws none of the
skipped examples. In a later pass the recorded position is right where the reference's replay is not. A shuffle
buffer or a plain iterable is put back by drawing its examples again, uncollated, and the run says so; a damaged
record is refused before training.
"""

from __future__ import annotations

import json
import os

import datasets
import pytest
import torch

from hf_lightning.data.position_files import DATA_POSITION_NAME, read_data_state
from tests.models import DropoutMLP, regression_data
from tests.parity.test_resume import assert_bit_identical, max_difference, step_logs, train

SETTINGS = dict(max_steps=8, save_steps=3, gradient_accumulation_steps=2)
STATE_NAME = "hf_lightning_data_state.safetensors"


def saved_position(checkpoint) -> tuple[dict, dict]:
    """A checkpoint's data position (JSON) and the train loader's state (safetensors)."""
    position = json.loads((checkpoint / DATA_POSITION_NAME).read_text())
    return position, read_data_state(str(checkpoint / STATE_NAME))


class PositionedStream(torch.utils.data.IterableDataset):
    """Items in order, with torch's Stateful protocol; counts the examples it yields."""

    def __init__(self, items):
        self.items = items
        self.next_index = 0
        self.start = 0
        self.drawn = 0

    def __iter__(self):
        start, self.start = self.start, 0  # a loaded position applies to the next iteration only
        for index in range(start, len(self.items)):
            self.next_index = index + 1
            self.drawn += 1
            yield self.items[index]

    def state_dict(self):
        return {"next_index": self.next_index}

    def load_state_dict(self, state):
        self.start = state["next_index"]


def _hf_stream(count: int) -> datasets.IterableDataset:
    items = regression_data(count).items
    table = {"x": [item["x"].tolist() for item in items], "labels": [item["labels"].item() for item in items]}
    return datasets.Dataset.from_dict(table).to_iterable_dataset(num_shards=1).with_format("torch")


def _interrupted_then_resumed(tmp_path, make_dataset, **settings):
    """An uninterrupted run, and one stopped at step 3 (its checkpoint) then resumed on a fresh dataset."""
    settings = {**SETTINGS, **settings}
    straight = train("ours", tmp_path / "a", make_dataset(), make_model=DropoutMLP, **settings)
    train("ours", tmp_path / "b", make_dataset(), stop_at=3, make_model=DropoutMLP, **settings)
    checkpoint = tmp_path / "b" / "checkpoint-3"
    resumed_dataset = make_dataset()
    resumed = train(
        "ours", tmp_path / "b", resumed_dataset, resume=str(checkpoint), make_model=DropoutMLP, model_seed=7, **settings
    )
    return straight, resumed, resumed_dataset, checkpoint


def _resumed_with_then_without_record(tmp_path, checkpoint, items, **settings):
    """Two resumes from `checkpoint`: first with its dataset-position record, then with the record deleted."""
    runs = []
    for keep_record in (True, False):
        if not keep_record:
            (checkpoint / DATA_POSITION_NAME).unlink()
        runs.append(
            train("ours", tmp_path / "b", PositionedStream(items), resume=str(checkpoint), make_model=DropoutMLP,
                  model_seed=7, **settings)
        )
    return runs


def test_a_stateful_dataset_continues_from_its_position_without_drawing_the_skipped_examples(tmp_path):
    items = regression_data(40).items
    straight, resumed, dataset, checkpoint = _interrupted_then_resumed(tmp_path, lambda: PositionedStream(items))
    position, state = saved_position(checkpoint)
    assert (position["epoch"], position["batch"], position["restore"]) == (0, 6, "dataset_state")  # 3 updates x 2 x 2
    assert state["dataset_state"] == {"dataset": {"next_index": 12}}
    assert_bit_identical(resumed.weights, straight.weights)
    assert step_logs(resumed.log_history) == step_logs(straight.log_history)
    # 5 more updates of 2 batches of 2 from example 12, plus the one batch drawn ahead: nothing before 12.
    assert dataset.drawn == 5 * 2 * 2 + 2


def test_the_position_resume_equals_the_replay_and_the_reference(tmp_path):
    items = regression_data(40).items
    _, by_position, _, checkpoint = _interrupted_then_resumed(tmp_path, lambda: PositionedStream(items))
    (checkpoint / DATA_POSITION_NAME).unlink()  # without the record the batches are replayed
    replayed_dataset = PositionedStream(items)
    replayed = train(
        "ours", tmp_path / "b", replayed_dataset, resume=str(checkpoint), make_model=DropoutMLP, model_seed=7,
        **SETTINGS,
    )
    assert replayed_dataset.drawn > 12  # the replay drew the trained examples again
    assert_bit_identical(by_position.weights, replayed.weights)
    reference_dir = tmp_path / "r"
    train("reference", reference_dir, PositionedStream(items), stop_at=3, make_model=DropoutMLP, **SETTINGS)
    reference = train(
        "reference", reference_dir, PositionedStream(items), resume=str(reference_dir / "checkpoint-3"),
        make_model=DropoutMLP, model_seed=7, **SETTINGS,
    )
    assert max_difference(by_position.weights, reference.weights) <= 1e-6
    assert [entry["loss"] for entry in step_logs(by_position.log_history) if "loss" in entry] == pytest.approx(
        [entry["loss"] for entry in step_logs(reference.log_history) if "loss" in entry], rel=1e-5
    )


def test_an_hf_datasets_stream_resumes_from_its_state(tmp_path):
    straight, resumed, _, checkpoint = _interrupted_then_resumed(tmp_path, lambda: _hf_stream(40))
    assert (checkpoint / DATA_POSITION_NAME).is_file()
    assert_bit_identical(resumed.weights, straight.weights)
    assert step_logs(resumed.log_history) == step_logs(straight.log_history)


def test_a_record_from_a_later_pass_continues_there_where_the_reference_restarts_the_pass(tmp_path):
    # 20 examples: 5 updates (2 batches of 2) per pass. The reference places step 7 of a lengthless dataset at
    # batch 14 of epoch 0 and, the pass having 10 batches, starts the next pass from its first batch (transformers
    # #26413); the record (pass 1, batch 4) is where the data stood, and the resume is the uninterrupted run.
    items = regression_data(20).items
    settings = dict(max_steps=9, save_steps=7, gradient_accumulation_steps=2)
    straight = train("ours", tmp_path / "a", PositionedStream(items), make_model=DropoutMLP, **settings)
    train("ours", tmp_path / "b", PositionedStream(items), stop_at=7, make_model=DropoutMLP, **settings)
    checkpoint = tmp_path / "b" / "checkpoint-7"
    position, _ = saved_position(checkpoint)
    assert (position["epoch"], position["batch"]) == (1, 4)
    with_record, replayed = _resumed_with_then_without_record(tmp_path, checkpoint, items, **settings)
    assert_bit_identical(with_record.weights, straight.weights)
    assert step_logs(with_record.log_history) == step_logs(straight.log_history)
    assert max_difference(replayed.weights, straight.weights) > 1e-4  # the reference's place: another pass start
    reference_dir = tmp_path / "r"
    reference_straight = train("reference", tmp_path / "ra", PositionedStream(items), make_model=DropoutMLP, **settings)
    train("reference", reference_dir, PositionedStream(items), stop_at=7, make_model=DropoutMLP, **settings)
    reference = train("reference", reference_dir, PositionedStream(items), resume=str(reference_dir / "checkpoint-7"),
                      make_model=DropoutMLP, model_seed=7, **settings)  # fmt: skip
    assert max_difference(reference.weights, reference_straight.weights) > 1e-4  # the reference's resume is not exact
    assert max_difference(with_record.weights, reference_straight.weights) <= 1e-6  # ours is its uninterrupted run


def test_a_shuffle_buffer_is_put_back_by_drawing_its_examples_and_the_run_says_so(tmp_path, caplog):
    def shuffled():
        return _hf_stream(40).shuffle(seed=3, buffer_size=8)

    with caplog.at_level("WARNING", logger="hf_lightning.checkpoint.data_resume"):
        straight, resumed, _, checkpoint = _interrupted_then_resumed(tmp_path, shuffled)
    position, state = saved_position(checkpoint)
    assert position["restore"] == "examples_drawn" and state["dataset_state"]["examples"] == 12
    assert_bit_identical(resumed.weights, straight.weights)
    said = [record.getMessage() for record in caplog.records if "cannot be put back" in record.getMessage()]
    assert len(said) == 1 and "IterableDataset" in said[0] and "shuffle buffer" in said[0]
    assert "12 examples" in said[0]


def test_a_damaged_record_is_refused_before_training_naming_the_file(tmp_path):
    items = regression_data(40).items
    train("ours", tmp_path / "b", PositionedStream(items), stop_at=3, make_model=DropoutMLP, **SETTINGS)
    checkpoint = tmp_path / "b" / "checkpoint-3"
    path = checkpoint / DATA_POSITION_NAME
    path.write_text('{"epoch": "zero"}')
    weights_before = os.path.getmtime(checkpoint / "model.safetensors")
    with pytest.raises(ValueError, match=rf"{DATA_POSITION_NAME}.*damaged.*Delete the file"):
        train("ours", tmp_path / "b", PositionedStream(items), resume=str(checkpoint), make_model=DropoutMLP, **SETTINGS)
    assert os.path.getmtime(checkpoint / "model.safetensors") == weights_before


def test_a_plain_iterable_dataset_is_put_back_by_drawing_its_examples_and_the_run_says_so_once(tmp_path, caplog):
    from tests.parity.test_resume import StreamOfItems

    items = regression_data(40).items
    straight = train("ours", tmp_path / "a", StreamOfItems(items), make_model=DropoutMLP, **SETTINGS)
    train("ours", tmp_path / "b", StreamOfItems(items), stop_at=3, make_model=DropoutMLP, **SETTINGS)
    position, state = saved_position(tmp_path / "b" / "checkpoint-3")
    assert position["restore"] == "examples_drawn" and state["dataset_state"] == {"examples": 12}
    with caplog.at_level("WARNING"):
        resumed = train("ours", tmp_path / "b", StreamOfItems(items), resume=True, make_model=DropoutMLP, model_seed=7,
                        **SETTINGS)  # fmt: skip
    assert_bit_identical(resumed.weights, straight.weights)
    said = [record.getMessage() for record in caplog.records if "StreamOfItems" in record.getMessage()]
    assert len(said) == 1 and "no state_dict()" in said[0] and "without collating" in said[0], said


def test_an_asynchronous_save_keeps_the_position_of_its_step(tmp_path):
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    from hf_lightning import TrainingArguments
    from hf_lightning.trainer.trainer import HFLightningTrainer
    from tests.parity.test_resume import StopAt

    items = regression_data(40).items
    records = []
    for asynchronous in (False, True):
        run_dir = tmp_path / ("async" if asynchronous else "sync")
        args = dict(use_cpu=True, report_to="none", disable_tqdm=True, per_device_train_batch_size=2, seed=123)
        trainer = HFLightningTrainer(
            model=DropoutMLP(0),
            args=TrainingArguments(output_dir=str(run_dir), **args, **SETTINGS),
            train_dataset=PositionedStream(items),
            callbacks=[StopAt(6)],
        )
        if asynchronous:
            trainer.lightning_trainer_overrides = {"plugins": [AsyncCheckpointIO()]}
        trainer.train()
        records.append([saved_position(run_dir / f"checkpoint-{step}") for step in (3, 6)])
    assert records[1] == records[0]
    assert [(position["batch"], state["dataset_state"]) for position, state in records[0]] == [
        (6, {"dataset": {"next_index": 12}}),
        (12, {"dataset": {"next_index": 24}}),
    ]


def test_a_resume_at_another_batch_size_replays_instead_of_loading_the_position(tmp_path):
    # The record's batch indices count batches of the size it was written at: batch 6 of 2 examples is example 12,
    # while the replay the reference does at the resumed size of 4 draws 24 examples.
    items = regression_data(60).items
    train("ours", tmp_path / "b", PositionedStream(items), stop_at=3, make_model=DropoutMLP, **SETTINGS)
    checkpoint = tmp_path / "b" / "checkpoint-3"
    with_record, replayed = _resumed_with_then_without_record(
        tmp_path, checkpoint, items, **{**SETTINGS, "per_device_train_batch_size": 4}
    )
    assert_bit_identical(with_record.weights, replayed.weights)


def test_each_recorded_position_is_the_dataset_state_before_that_batch(tmp_path):
    # A dataset's state_dict() before its iterator has started says nothing about the coming iteration (HF datasets
    # returns the previous iteration's state; this stream, a fresh one's): the entry for the batch a resume
    # continued from must be the loaded position, and no entry may be a state read before the iteration began.
    items = regression_data(40).items
    settings = dict(max_steps=8, save_steps=1, gradient_accumulation_steps=1)
    train("ours", tmp_path / "b", PositionedStream(items), stop_at=3, make_model=DropoutMLP, **settings)
    train("ours", tmp_path / "b", PositionedStream(items), resume=str(tmp_path / "b" / "checkpoint-3"),
          stop_at=4, make_model=DropoutMLP, model_seed=7, **settings)
    for step in (1, 4):
        position, state = saved_position(tmp_path / "b" / f"checkpoint-{step}")
        assert position["batch"] == step, step
        assert state["dataset_state"] == {"dataset": {"next_index": 2 * step}}, (step, state)


def test_a_damaged_record_makes_the_checkpoint_invalid_for_resume_true(tmp_path):
    from hf_lightning.checkpoint.files import checkpoint_problem

    items = regression_data(40).items
    train("ours", tmp_path / "b", PositionedStream(items), stop_at=6, make_model=DropoutMLP, **SETTINGS)
    path = tmp_path / "b" / "checkpoint-6" / DATA_POSITION_NAME
    path.write_text("{")
    problem = checkpoint_problem(str(tmp_path / "b" / "checkpoint-6"))
    assert problem is not None and DATA_POSITION_NAME in problem
    assert checkpoint_problem(str(tmp_path / "b" / "checkpoint-3")) is None
    resumed = train("ours", tmp_path / "b", PositionedStream(items), resume=True, stop_at=5, make_model=DropoutMLP,
                    model_seed=7, **SETTINGS)
    # Resumed from checkpoint-3 (from checkpoint-6 the run would be past step 5); checkpoint-6 is left as it was.
    assert resumed.trainer.state.global_step == 5
    assert path.read_text() == "{"



def test_only_the_train_loader_records_positions():
    # An eval loop never resumes into its dataset: reading state_dict() before each eval batch is pure overhead.
    from hf_lightning import TrainingArguments
    from tests.data.loader_builders import (
        build_eval_dataloader,
        build_train_dataloader,
        context_without_trainer,
    )

    args = TrainingArguments(output_dir="unused", use_cpu=True, report_to="none", per_device_train_batch_size=2)
    items = regression_data(8).items
    common = dict(args=args, data_collator=None, model=DropoutMLP(0))
    assert build_train_dataloader(PositionedStream(items), context_without_trainer(**common)).positions is not None
    assert build_eval_dataloader(PositionedStream(items), context_without_trainer(**common)).positions is None


def test_an_hf_datasets_stream_forgets_the_loaded_position_once_the_resumed_pass_started(tmp_path):
    # HF datasets would start every later pass of the same epoch at the loaded state (an evaluation on the same
    # object, a second train(), the user's own loop); the position applies to the resumed pass only.
    streams = []

    def make():
        streams.append(_hf_stream(40))
        return streams[-1]

    _interrupted_then_resumed(tmp_path, make)
    resumed = streams[-1]
    resumed.set_epoch(0)
    first = next(iter(resumed))
    assert torch.equal(first["x"], regression_data(40).items[0]["x"])


def _masking_collator(features):
    """Stacks the examples and masks inputs from torch's global generator, as an MLM collator does."""
    batch = {key: torch.stack([feature[key] for feature in features]) for key in features[0]}
    batch["x"] = batch["x"] * (torch.rand(batch["x"].shape) > 0.3)
    return batch


def _masked_run(library: str, output_dir, *, stop_at=None, resume=None, model_seed=0):
    import transformers

    from hf_lightning import TrainingArguments
    from hf_lightning.trainer.trainer import HFLightningTrainer
    from tests.parity.test_resume import StopAt

    args_cls, trainer_cls = (
        (TrainingArguments, HFLightningTrainer) if library == "ours" else (transformers.TrainingArguments, transformers.Trainer)
    )
    args = args_cls(output_dir=str(output_dir), use_cpu=True, report_to="none", disable_tqdm=True, seed=123,
                    per_device_train_batch_size=2, learning_rate=1e-2, logging_steps=1, max_steps=8, save_steps=3)  # fmt: skip
    trainer = trainer_cls(
        model=DropoutMLP(model_seed), args=args, train_dataset=regression_data(12), data_collator=_masking_collator,
        callbacks=[StopAt(stop_at)] if stop_at is not None else [],
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=resume)
    return {name: tensor.detach().clone() for name, tensor in trainer.model.state_dict().items()}


def test_a_masking_collator_resumes_exactly_where_the_reference_does_not(tmp_path):
    # The reference fetches the first batch after a resume before it restores the checkpoint's RNG state, so that
    # batch is masked with other random numbers than in the uninterrupted run; ours collates it from the state the
    # uninterrupted run collated it from (the loader's recorded random state), then restores the checkpoint's.
    weights = {}
    for library in ("ours", "reference"):
        weights[library, "straight"] = _masked_run(library, tmp_path / library / "a")
        _masked_run(library, tmp_path / library / "b", stop_at=3)
        weights[library, "resumed"] = _masked_run(library, tmp_path / library / "b", resume=True, model_seed=7)
    assert_bit_identical(weights["ours", "resumed"], weights["ours", "straight"])
    assert max_difference(weights["ours", "straight"], weights["reference", "straight"]) <= 1e-6
    assert max_difference(weights["reference", "resumed"], weights["reference", "straight"]) > 1e-4


def test_a_missing_loader_state_makes_the_checkpoint_invalid(tmp_path):
    from hf_lightning.checkpoint.files import checkpoint_problem

    items = regression_data(40).items
    train("ours", tmp_path / "b", PositionedStream(items), stop_at=3, make_model=DropoutMLP, **SETTINGS)
    checkpoint = tmp_path / "b" / "checkpoint-3"
    assert checkpoint_problem(str(checkpoint)) is None
    (checkpoint / STATE_NAME).unlink()
    problem = checkpoint_problem(str(checkpoint))
    assert problem is not None and DATA_POSITION_NAME in problem and f"{STATE_NAME}, is missing" in problem


def test_out_of_order_workers_are_said_to_be_inexact_before_training(tmp_path, caplog):
    # With dataloader_in_order=False the workers' batches arrive as they are ready: no position names what was
    # trained on, so the resume replays as the reference does, and says that the order after it may differ.
    settings = dict(SETTINGS, dataloader_num_workers=2, dataloader_in_order=False)
    items = regression_data(40).items
    train("ours", tmp_path / "b", PositionedStream(items), stop_at=3, make_model=DropoutMLP, **settings)
    with caplog.at_level("WARNING", logger="hf_lightning.checkpoint.data_resume"):
        train("ours", tmp_path / "b", PositionedStream(items), resume=True, stop_at=4, make_model=DropoutMLP,
              **settings)  # fmt: skip
    said = [record.getMessage() for record in caplog.records if record.name == "hf_lightning.checkpoint.data_resume"]
    assert len(said) == 1 and "PositionedStream" in said[0] and "dataloader_in_order=False" in said[0], said
    assert "cannot be resumed exactly" in said[0]


def test_the_data_position_files_are_the_documented_plain_format(tmp_path):
    # docs/design.md "Resume anywhere": the run's position as JSON (a global sample position), each process's loader
    # state as JSON metadata plus tensors in safetensors; nothing pickled.
    from safetensors import safe_open

    from tests.parity.test_resume import StreamOfItems

    train("ours", tmp_path / "b", StreamOfItems(regression_data(40).items), stop_at=3, make_model=DropoutMLP,
          dataloader_num_workers=2, **SETTINGS)  # fmt: skip
    checkpoint = tmp_path / "b" / "checkpoint-3"
    position = json.loads((checkpoint / DATA_POSITION_NAME).read_text())
    assert position == {
        "format": 1, "global_step": 3, "epoch": 0, "batch": 6, "end_of_epoch": False, "batch_size": 2,
        "num_processes": 1, "samples_in_epoch": 12, "num_workers": 2, "kind": "iterable",
        "restore": "examples_drawn", "dataset": "StreamOfItems",
    }  # fmt: skip
    with safe_open(str(checkpoint / STATE_NAME), framework="pt") as handle:
        metadata = handle.metadata()
    assert metadata["format"] == "1"
    state = json.loads(metadata["state"])  # plain JSON: torchdata's state with each worker's
    worker_states = state["_snapshot"]["_worker_snapshots"]
    assert sorted(worker_states) == ["worker_0", "worker_1"]
    # Each worker draws the whole stream (it is not dealt across workers): 3 batches of 2 each.
    assert [worker_states[name]["dataset_state"]["examples"] for name in sorted(worker_states)] == [6, 6]
    assert not [path for path in checkpoint.iterdir() if path.suffix in (".pkl", ".pickle")]


def test_persistent_workers_resumed_at_a_pass_start_are_said_to_differ(tmp_path, caplog):
    # The uninterrupted run's persistent workers (and the loader's seed) carry over from the previous pass; a resume
    # at a pass start begins new ones, as the reference does: said before training, not resumed silently.
    settings = dict(max_steps=8, save_steps=6, dataloader_num_workers=2, dataloader_persistent_workers=True)
    train("ours", tmp_path / "b", regression_data(12), stop_at=6, make_model=DropoutMLP, **settings)
    with caplog.at_level("WARNING", logger="hf_lightning.checkpoint.data_resume"):
        train("ours", tmp_path / "b", regression_data(12), resume=True, stop_at=7, make_model=DropoutMLP, **settings)
    said = [record.getMessage() for record in caplog.records if record.name == "hf_lightning.checkpoint.data_resume"]
    assert len(said) == 1 and "start of pass 1" in said[0] and "ListDataset" in said[0], said
    assert "dataloader_persistent_workers=True" in said[0]
