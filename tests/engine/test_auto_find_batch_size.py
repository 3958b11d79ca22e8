"""`auto_find_batch_size`: on an out-of-memory error the whole run is retried at `int(0.9 * batch)`, as the
reference's (accelerate's `find_executable_batch_size`); run side by side with transformers.Trainer."""

from __future__ import annotations

import glob

import pytest
import torch
import transformers

from hf_lightning import Trainer, TrainingArguments
from tests.models import RegressionMLP, regression_data

LARGEST_BATCH_THAT_FITS = 6


class RunsOutOfMemory(RegressionMLP):
    """Raises the error a CUDA allocation failure raises when a batch is larger than the memory "holds"."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_sizes: list[int] = []

    def forward(self, x, labels=None):
        self.batch_sizes.append(len(x))
        if len(x) > LARGEST_BATCH_THAT_FITS:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().forward(x, labels)


def _run(tmp_path, side: str, trainer_class: type, args_class: type, report_to):
    torch.manual_seed(0)
    model = RunsOutOfMemory()
    args = args_class(
        output_dir=str(tmp_path / side),
        use_cpu=True,
        auto_find_batch_size=True,
        per_device_train_batch_size=8,
        num_train_epochs=1,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        report_to=report_to,
    )
    trainer = trainer_class(model=model, args=args, train_dataset=regression_data(24))
    output = trainer.train()
    return trainer, model, output


def test_retries_at_the_references_batch_sizes_with_the_same_run(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ours, our_model, our_output = _run(tmp_path, "ours", Trainer, TrainingArguments, ["tensorboard"])
    reference, reference_model, reference_output = _run(
        tmp_path, "reference", transformers.Trainer, transformers.TrainingArguments, "none"
    )
    # 8 fails, int(8 * 0.9) = 7 fails, int(7 * 0.9) = 6 trains: 24 samples in 4 steps.
    assert our_model.batch_sizes[:2] == reference_model.batch_sizes[:2] == [8, 7]
    assert set(our_model.batch_sizes[2:]) == set(reference_model.batch_sizes[2:]) == {6}
    assert ours._train_batch_size == reference._train_batch_size == 6
    assert our_output.global_step == reference_output.global_step == 4
    our_losses = [entry["loss"] for entry in ours.state.log_history if "loss" in entry]
    reference_losses = [entry["loss"] for entry in reference.state.log_history if "loss" in entry]
    assert our_losses == pytest.approx(reference_losses, rel=1e-5)
    # The failed attempts and the good one write to one TensorBoard run.
    (run_dir,) = glob.glob(str(tmp_path / "ours" / "runs" / "*"))
    accumulator = EventAccumulator(run_dir)
    accumulator.Reload()
    assert [event.step for event in accumulator.Scalars("train/loss")] == [1, 2, 3, 4]
