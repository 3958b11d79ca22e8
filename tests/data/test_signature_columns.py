"""A subclass's `_set_signature_columns_if_needed` chooses the columns column removal keeps, as in the
reference (TRL keeps its `seq_lengths` column this way)."""

from __future__ import annotations

import pytest


def _trainer_keeping(base: type, extra: str) -> type:
    class KeepingTrainer(base):
        def _set_signature_columns_if_needed(self):
            if self._signature_columns is None:
                self._signature_columns = ["x", "labels", extra]

    return KeepingTrainer


@pytest.mark.parametrize("keep", [False, True])
def test_kept_columns_follow_the_override(make_args, keep):
    import transformers
    from datasets import Dataset

    from hf_lightning import Trainer, TrainingArguments
    from tests.models import make_regression_mlp

    data = Dataset.from_dict({"x": [[0.0] * 4] * 4, "labels": [0.0] * 4, "extra": [1] * 4, "other": [2] * 4})
    seen = {}
    for side, base, args_cls in (("ref", transformers.Trainer, transformers.TrainingArguments),
                                 ("ours", Trainer, TrainingArguments)):
        cls = _trainer_keeping(base, "extra") if keep else base
        trainer = cls(model=make_regression_mlp(), args=make_args(cls=args_cls), train_dataset=data,
                      data_collator=lambda features: sorted(features[0]))
        seen[side] = next(iter(trainer.get_train_dataloader()))
    assert seen["ours"] == seen["ref"]
    assert ("extra" in seen["ours"]) is keep and "other" not in seen["ours"]
