"""train() parity: the same scenario under transformers.Trainer and HFLightningTrainer (issue: core).

Bar: equal global_step; equal log_history keys, steps and epochs; learning_rate within 1e-6
relative; loss within 1e-4 relative at every logged step; final weights within 1e-4 relative.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.models import (
    classification_data,
    make_regression_mlp,
    make_tiny_bert_classifier,
    make_tiny_gpt2,
    padded_lm_data,
    regression_data,
)
from tests.parity.harness import assert_log_history_matches, assert_parity, run_parity

MLP_ARGS = dict(per_device_train_batch_size=3, learning_rate=1e-2, logging_steps=1, num_train_epochs=2)


def test_default_adamw_linear(tmp_path):
    result = run_parity(make_regression_mlp(), regression_data(10), tmp_path, **MLP_ARGS)
    assert_parity(result)
    assert result.ours.log_history[0]["learning_rate"] == pytest.approx(1e-2)


@pytest.mark.parametrize("ga", [1, 4])
def test_gradient_accumulation_with_short_last_window(tmp_path, ga):
    # 10 samples, batch 3 -> 4 micro-batches per epoch; GA 4 -> one full window; GA 1 -> four.
    # With 11 samples GA 4 has windows of 4 then... use 14 samples (5 micro-batches): last window of 1.
    result = run_parity(
        make_regression_mlp(),
        regression_data(14),
        tmp_path,
        **{**MLP_ARGS, "gradient_accumulation_steps": ga},
    )
    assert_parity(result)
    if ga == 4:
        assert [e["step"] for e in result.ours.log_history[:-1]] == [1, 2, 3, 4]


def test_fractional_epochs_and_epoch_logging(tmp_path):
    result = run_parity(
        make_regression_mlp(),
        regression_data(8),
        tmp_path,
        per_device_train_batch_size=2,
        num_train_epochs=2.5,
        logging_strategy="epoch",
        learning_rate=1e-2,
    )
    assert_parity(result)
    assert [e["epoch"] for e in result.ours.log_history[:-1]] == [1.0, 2.0, 2.5]


def test_max_steps_overrides_epochs(tmp_path):
    result = run_parity(
        make_regression_mlp(),
        regression_data(10),
        tmp_path,
        **{**MLP_ARGS, "max_steps": 7, "logging_steps": 2, "logging_first_step": True},
    )
    assert_parity(result)
    assert result.ours.output.global_step == 7


SCHEDULERS = [
    ("linear", None),
    ("cosine", None),
    ("cosine_with_restarts", {"num_cycles": 2}),
    ("polynomial", {"lr_end": 1e-4, "power": 2.0}),
    ("constant", None),
    ("constant_with_warmup", None),
    ("inverse_sqrt", None),
    ("cosine_with_min_lr", {"min_lr_rate": 0.1}),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1}),
    ("warmup_stable_decay", {"num_decay_steps": 3}),
]


@pytest.mark.parametrize("name,kwargs", SCHEDULERS, ids=[s[0] for s in SCHEDULERS])
def test_every_scheduler(tmp_path, name, kwargs):
    result = run_parity(
        make_regression_mlp(),
        regression_data(12),
        tmp_path,
        **{**MLP_ARGS, "num_train_epochs": 3, "lr_scheduler_type": name, "lr_scheduler_kwargs": kwargs, "warmup_steps": 2},
    )
    assert_parity(result)


OPTIMIZERS = [
    ("adamw_torch", None),
    ("adamw_torch_fused", None),
    ("adafactor", None),
    ("sgd", "momentum=0.9,nesterov=true"),
    ("adagrad", "lr_decay=0.01"),
    ("rmsprop", "momentum=0.5,centered=true"),
]


@pytest.mark.parametrize("optim,optim_args", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_every_supported_optimizer(tmp_path, optim, optim_args):
    result = run_parity(
        make_regression_mlp(),
        regression_data(12),
        tmp_path,
        **{**MLP_ARGS, "optim": optim, "optim_args": optim_args, "weight_decay": 0.1},
    )
    assert_parity(result)


# Tiny transformers, one run each: (model, data, the run's arguments). BERT's forward takes **kwargs, so its loss is
# not divided by GA (the reference's documented quirk, the `tiny_bert_loss_counts_as_scaled_quirk` run).
TRANSFORMER_RUNS = [
    pytest.param(
        make_tiny_bert_classifier,
        lambda: classification_data(12),
        dict(
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            learning_rate=1e-3,
            label_smoothing_factor=0.1,
            logging_steps=1,
            num_train_epochs=2,
        ),
        id="tiny_bert_classifier_with_label_smoothing_and_accumulation",
    ),
    pytest.param(
        make_tiny_bert_classifier,
        lambda: classification_data(8),
        dict(
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            learning_rate=1e-3,
            logging_steps=1,
            num_train_epochs=1,
        ),
        id="tiny_bert_loss_counts_as_scaled_quirk",
    ),
    pytest.param(
        make_tiny_gpt2,
        lambda: padded_lm_data(12),
        dict(
            per_device_train_batch_size=3,
            gradient_accumulation_steps=2,
            learning_rate=1e-3,
            logging_steps=1,
            num_train_epochs=2,
        ),
        id="tiny_gpt2_causal_lm_padded",
    ),
]


@pytest.mark.parametrize("make_model,make_data,arguments", TRANSFORMER_RUNS)
def test_tiny_transformer(tmp_path, make_model, make_data, arguments):
    result = run_parity(make_model(), make_data(), tmp_path, **arguments)
    assert_parity(result)


def _weighted_loss_trainer(base):
    """The weighted-loss `CustomTrainer` of the reference's documentation, on either base class."""

    class CustomTrainer(base):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs.pop("labels")
            outputs = model(**inputs)
            logits = outputs.get("logits")
            loss_fct = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 3.0], device=model.device))
            loss = loss_fct(logits.view(-1, self.model.config.num_labels), labels.view(-1))
            return (loss, outputs) if return_outputs else loss

    return CustomTrainer


def test_compute_loss_override(tmp_path):
    import transformers

    from hf_lightning.trainer.trainer import HFLightningTrainer

    data = classification_data(12)
    for item in data.items:
        item["labels"] = item["labels"] + (item["input_ids"][0] % 2)
    model = make_tiny_bert_classifier(num_labels=3)
    result = run_parity(
        model,
        data,
        tmp_path,
        reference_trainer_cls=_weighted_loss_trainer(transformers.Trainer),
        our_trainer_cls=_weighted_loss_trainer(HFLightningTrainer),
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        num_train_epochs=2,
        train_sampling_strategy="sequential",
    )
    assert_parity(result)
    # The override is what ran: the first logged loss is the weighted CE of items 0..3 under the initial model.
    first = {key: torch.stack([data[i][key] for i in range(4)]) for key in ("input_ids", "attention_mask", "labels")}
    with torch.no_grad():
        logits = model(input_ids=first["input_ids"], attention_mask=first["attention_mask"]).logits
    weighted = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 3.0]))(logits, first["labels"])
    unweighted = nn.functional.cross_entropy(logits, first["labels"])
    assert result.ours.log_history[0]["loss"] == pytest.approx(weighted.item(), rel=1e-6)
    assert weighted.item() != pytest.approx(unweighted.item(), rel=1e-6)


def test_mutation_different_seed_breaks_parity(tmp_path):
    """The harness can fail: with another seed on our side (random order differs) parity does not hold."""
    result = run_parity(make_regression_mlp(), regression_data(10), tmp_path, our_seed=7, **MLP_ARGS)
    with pytest.raises(AssertionError):
        assert_log_history_matches(result)
