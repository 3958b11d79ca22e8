"""The loaders `get_train_dataloader()` / `get_eval_dataloader()` return read like accelerate's prepared loader,
which the reference returns: the attributes scripts and the reference's own tests read, before and after an
iteration, against the reference on the same data."""

from __future__ import annotations

import pytest
import transformers

import hf_lightning
from tests.models import make_regression_mlp, regression_data

SURFACE = ("total_batch_size", "total_dataset_length", "end_of_dataloader", "remainder")


def _loaders(side, tmp_path, **fields):
    module = transformers if side == "reference" else hf_lightning
    args = module.TrainingArguments(
        output_dir=str(tmp_path / side), use_cpu=True, report_to="none", per_device_train_batch_size=4,
        per_device_eval_batch_size=3, **fields,
    )  # fmt: skip
    trainer = module.Trainer(
        model=make_regression_mlp(), args=args, train_dataset=regression_data(10), eval_dataset=regression_data(7)
    )
    return {"train": trainer.get_train_dataloader(), "eval": trainer.get_eval_dataloader()}


def _read(loader) -> dict:
    return {name: getattr(loader, name) for name in SURFACE}


@pytest.mark.parametrize("drop_last", [False, True])
def test_the_prepared_loader_surface_reads_as_the_references(tmp_path, drop_last):
    sides = {side: _loaders(side, tmp_path, dataloader_drop_last=drop_last) for side in ("reference", "ours")}
    for kind in ("train", "eval"):
        reference, ours = sides["reference"][kind], sides["ours"][kind]
        assert _read(ours) == _read(reference), (kind, "before")
        assert len(list(ours)) == len(list(reference))
        assert _read(ours) == _read(reference), (kind, "after")
        for loader in (reference, ours):
            loader.set_epoch(1)  # callable as on accelerate's loader
            assert loader.batch_sampler is not None and loader.sampler is not None
    # The values themselves: 10 train samples in batches of 4 leave 2 (unless dropped), 7 eval samples in 3s leave 1.
    assert sides["ours"]["train"].total_batch_size == 4 and sides["ours"]["train"].total_dataset_length == 10
    assert sides["ours"]["train"].remainder == (-1 if drop_last else 2)
