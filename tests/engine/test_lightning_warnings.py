"""A train() shows no Lightning warning about the engine's own step flavour, and a user's warning still shows."""

from __future__ import annotations

import warnings

import hf_lightning.engine.module  # noqa: F401  (imported first, as by any earlier run in the process)
from hf_lightning import Trainer, TrainerCallback, TrainingArguments
from tests.models import make_regression_mlp, regression_data


class _WarnsAtStepEnd(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        warnings.warn("a warning of the user's own", UserWarning, stacklevel=1)


def test_train_hides_only_the_dataloader_iter_flavour_warnings(tmp_path):
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        max_steps=2,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=make_regression_mlp(),
        args=args,
        train_dataset=regression_data(8),
        callbacks=[_WarnsAtStepEnd()],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "dataloader_iter" in m or "LeafSpec" in m], messages
    assert messages.count("a warning of the user's own") == 2
