"""The order in which train() calls the overridable methods (API-1.4), against the reference.

A subclass of each trainer logs every overridden call; both logs must be identical. This also proves
that Lightning's loop goes through the facade's methods, so user overrides take effect.
"""

from __future__ import annotations

import re

import torch

from tests.models import classification_data, make_tiny_bert_classifier
from tests.parity.harness import run_parity


def _logging_subclass(base):
    class CallLogTrainer(base):
        calls: list[str]

        def _record(self, entry: str) -> None:
            self.__dict__.setdefault("calls", []).append(entry)

        def get_train_dataloader(self):
            self._record("get_train_dataloader")
            return super().get_train_dataloader()

        def create_optimizer(self, model=None):
            self._record("create_optimizer")
            return super().create_optimizer(model)

        def create_scheduler(self, num_training_steps, optimizer=None):
            self._record(f"create_scheduler({num_training_steps})")
            return super().create_scheduler(num_training_steps, optimizer)

        def get_batch_samples(self, epoch_iterator, num_batches, device):
            self._record(f"get_batch_samples({num_batches})")
            return super().get_batch_samples(epoch_iterator, num_batches, device)

        def training_step(self, model, inputs, num_items_in_batch=None):
            self._record(f"training_step(nib={_as_int(num_items_in_batch)})")
            return super().training_step(model, inputs, num_items_in_batch)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            self._record(f"compute_loss(ro={return_outputs})")
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

        def floating_point_ops(self, inputs):
            self._record("floating_point_ops")
            return super().floating_point_ops(inputs)

        def store_flos(self):
            self._record("store_flos")
            return super().store_flos()

        def log(self, logs, start_time=None):
            kind = "eval metrics" if any(k.startswith("eval_") for k in logs) else (
                "train summary" if "train_runtime" in logs else "train step log"
            )
            self._record(f"log({kind})")
            return super().log(logs, start_time)

        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
            self._record(f"evaluate({metric_key_prefix})")
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)

        def get_eval_dataloader(self, eval_dataset=None):
            self._record("get_eval_dataloader")
            return super().get_eval_dataloader(eval_dataset)

        def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"):
            self._record(f"evaluation_loop({description}, {prediction_loss_only})")
            return super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)

        def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
            self._record(f"prediction_step(plo={prediction_loss_only})")
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)

        def save_model(self, output_dir=None, _internal_call=False):
            name = None if output_dir is None else _final_checkpoint_name(output_dir.rsplit("/", 1)[-1])
            self._record(f"save_model({name}, _internal_call={_internal_call})")
            return super().save_model(output_dir, _internal_call)

    return CallLogTrainer


def _final_checkpoint_name(folder: str) -> str:
    """Our atomic save writes `.checkpoint-N.tmp-<pid>` and renames it `checkpoint-N` (docs/divergences.md)."""
    match = re.fullmatch(r"\.(checkpoint-\d+)\.tmp-\d+", folder)
    return match.group(1) if match else folder


def _as_int(value):
    return int(value.item()) if torch.is_tensor(value) else value


def test_train_call_order_matches_reference(tmp_path):
    import transformers

    from hf_lightning.trainer.trainer import HFLightningTrainer

    result = run_parity(
        make_tiny_bert_classifier(),
        classification_data(8),
        tmp_path,
        reference_trainer_cls=_logging_subclass(transformers.Trainer),
        our_trainer_cls=_logging_subclass(HFLightningTrainer),
        trainer_kwargs={"eval_dataset": classification_data(4, seed=1)},
        per_device_train_batch_size=1,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        logging_steps=2,
        learning_rate=1e-3,
    )
    reference_calls = result.reference.trainer.calls
    assert result.ours.trainer.calls == reference_calls
    # The sequence measured on the reference, as a sanity check on the harness itself.
    assert reference_calls[:3] == ["get_train_dataloader", "create_optimizer", "create_scheduler(2)"]
    assert "save_model(checkpoint-2, _internal_call=True)" in reference_calls
