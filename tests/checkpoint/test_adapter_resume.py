"""A PEFT (adapter-only) checkpoint resumes, ours and the reference's, into the uninterrupted reference run.

A LoRA run saves `adapter_model.safetensors` and no whole-model weights. Every such checkpoint must resume on
every strategy's checkpoint I/O that accepts a plain checkpoint, with `modules_to_save` (the classifier head
trained in full beside the adapters) included, and end with the reference's weights.
"""

from __future__ import annotations

import os

import pytest
import torch
import transformers

from hf_lightning import Trainer, TrainingArguments
from hf_lightning.core.checkpoint_files import ADAPTER_SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_NAME
from tests.models import classification_data, make_tiny_bert_classifier

peft = pytest.importorskip("peft")

MAX_STEPS = 6
SAVE_STEPS = 3


def _lora_model(scrambled: bool = False):
    """LoRA on the tiny BERT's attention, its classifier trained in full. `scrambled`: the trainable weights (adapters
    and head) moved away from their initial values, so only a checkpoint can bring back the saved ones (the frozen
    base stays the same: an adapter checkpoint does not hold it)."""
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["query", "value"], modules_to_save=["classifier"], task_type="SEQ_CLS"
    )
    model = peft.get_peft_model(make_tiny_bert_classifier(seed=0), config)
    if scrambled:
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.requires_grad:
                    parameter.add_(torch.randn(parameter.shape, generator=generator))
    return model


def _run(side: str, output_dir, resume: str | bool | None = None, scrambled: bool = False):
    kwargs = dict(
        output_dir=str(output_dir), use_cpu=True, report_to="none", disable_tqdm=True, seed=7,
        per_device_train_batch_size=2, max_steps=MAX_STEPS, save_steps=SAVE_STEPS, logging_steps=1,
        learning_rate=5e-3,
    )  # fmt: skip
    if side == "reference":
        args, trainer_class = transformers.TrainingArguments(**kwargs), transformers.Trainer
    else:
        args, trainer_class = TrainingArguments(**kwargs), Trainer
    trainer = trainer_class(model=_lora_model(scrambled), args=args, train_dataset=classification_data(16))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _trainable(trainer) -> dict[str, torch.Tensor]:
    return {
        name: parameter.detach().clone() for name, parameter in trainer.model.named_parameters() if parameter.requires_grad
    }


def _losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory):
    """The reference's uninterrupted LoRA run (its checkpoints are adapter-only) and its losses and weights."""
    folder = tmp_path_factory.mktemp("adapter_reference")
    trainer = _run("reference", folder)
    return folder, _trainable(trainer), _losses(trainer)


def test_the_reference_and_our_lora_checkpoints_hold_only_adapter_weights(reference_runs, tmp_path):
    folder, _, _ = reference_runs
    ours = _run("ours", tmp_path / "ours")
    for checkpoint in (folder / f"checkpoint-{SAVE_STEPS}", tmp_path / "ours" / f"checkpoint-{SAVE_STEPS}"):
        names = set(os.listdir(checkpoint))
        assert ADAPTER_SAFE_WEIGHTS_NAME in names and SAFE_WEIGHTS_NAME not in names, sorted(names)
    assert _losses(ours) == pytest.approx(reference_runs[2], rel=1e-6)


@pytest.mark.parametrize("saved_by", ["reference", "ours"])
def test_an_adapter_only_checkpoint_resumes_into_the_uninterrupted_reference_run(reference_runs, tmp_path, saved_by):
    folder, expected_weights, expected_losses = reference_runs
    if saved_by == "ours":
        _run("ours", tmp_path / "saved")
        checkpoint = tmp_path / "saved" / f"checkpoint-{SAVE_STEPS}"
    else:
        checkpoint = folder / f"checkpoint-{SAVE_STEPS}"
    resumed = _run("ours", tmp_path / "resumed", resume=str(checkpoint), scrambled=True)
    assert resumed.state.global_step == MAX_STEPS
    assert _losses(resumed) == pytest.approx(expected_losses, rel=1e-5)  # the saved steps, then the resumed ones
    weights = _trainable(resumed)
    assert weights.keys() == expected_weights.keys()
    assert any("modules_to_save" in name for name in weights)
    for name, value in expected_weights.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_resume_from_checkpoint_true_finds_an_adapter_only_checkpoint(reference_runs, tmp_path):
    _, expected_weights, _ = reference_runs
    _run("ours", tmp_path / "run")  # leaves checkpoint-3 and checkpoint-6
    os.rename(tmp_path / "run" / f"checkpoint-{MAX_STEPS}", tmp_path / "moved-away")
    resumed = _run("ours", tmp_path / "run", resume=True, scrambled=True)
    assert resumed.state.global_step == MAX_STEPS
    for name, value in expected_weights.items():
        torch.testing.assert_close(_trainable(resumed)[name], value, rtol=1e-5, atol=1e-6, msg=name)
