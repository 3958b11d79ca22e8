"""The engine is Lightning's, and transformers is optional at run time."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import lightning.pytorch as pl
import torch

from hf_lightning import TrainingArguments
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import make_regression_mlp, regression_data
from tests.no_transformers import BLOCK_TRANSFORMERS


class MicroBatchSpy(pl.Callback):
    """A plain Lightning callback: it sees every backward (micro-batch) and every optimizer update."""

    def __init__(self):
        self.backwards = 0
        self.updates = 0
        self.epochs = 0

    def on_before_backward(self, trainer, module, loss):
        self.backwards += 1

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.updates += 1

    def on_train_epoch_end(self, trainer, module):
        self.epochs += 1


def test_lightning_runs_every_micro_batch(tmp_path):
    # 14 samples, batch 3 -> 5 micro-batches per epoch; GA 2 -> 3 updates per epoch; 2 epochs.
    spy = MicroBatchSpy()
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        per_device_train_batch_size=3,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    trainer = HFLightningTrainer(
        model=make_regression_mlp(), args=args, train_dataset=regression_data(14), callbacks=[spy]
    )
    output = trainer.train()
    assert spy.backwards == 10
    assert spy.updates == output.global_step == 6
    assert spy.epochs == 2
    assert isinstance(trainer.lightning_trainer, pl.Trainer)
    assert trainer.lightning_trainer.global_step == trainer.state.global_step


def test_plain_module_trains_without_transformers(tmp_path):
    """With transformers and accelerate unimportable, a plain nn.Module trains end to end."""
    script = BLOCK_TRANSFORMERS + textwrap.dedent(
        f"""
        from hf_lightning import Trainer, TrainingArguments
        from tests.models import make_regression_mlp, regression_data

        args = TrainingArguments(output_dir={str(tmp_path)!r}, use_cpu=True, per_device_train_batch_size=2,
                                 logging_steps=1, num_train_epochs=1, save_strategy="no", disable_tqdm=True)
        out = Trainer(model=make_regression_mlp(), args=args, train_dataset=regression_data(6)).train()
        assert out.global_step == 3, out
        assert "transformers" not in sys.modules and "accelerate" not in sys.modules
        print("OK", out.training_loss)
        """
    )
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=str(_repo_root())
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "OK" in completed.stdout


def test_trainer_constructor_signature_matches_reference():
    import inspect

    import transformers

    ours = inspect.signature(HFLightningTrainer.__init__).parameters
    reference = inspect.signature(transformers.Trainer.__init__).parameters
    assert list(ours) == list(reference)
    assert [p.default for p in ours.values()] == [p.default for p in reference.values()]


def test_tokenizer_alias_warns_and_sets_processing_class(tmp_path):
    import pytest

    tokenizer = object()
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with pytest.warns(FutureWarning, match="processing_class"):
        trainer = HFLightningTrainer(model=make_regression_mlp(), args=args, tokenizer=tokenizer)
    assert trainer.processing_class is tokenizer
    with pytest.raises(TypeError, match="unexpected keyword argument 'tokenizr'"):
        HFLightningTrainer(model=make_regression_mlp(), args=args, tokenizr=tokenizer)


def test_accepts_transformers_training_arguments(tmp_path):
    import transformers

    reference_args = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, learning_rate=3e-3, report_to="none", save_strategy="no"
    )
    trainer = HFLightningTrainer(model=make_regression_mlp(), args=reference_args, train_dataset=regression_data(4))
    assert isinstance(trainer.args, TrainingArguments)
    assert trainer.args.learning_rate == 3e-3
    assert trainer.train().global_step == 3


def test_state_after_train(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no", max_steps=2)
    model = make_regression_mlp()
    trainer = HFLightningTrainer(model=model, args=args, train_dataset=regression_data(8))
    trainer.train()
    assert trainer.model is model
    assert trainer.is_in_train is False
    assert trainer.optimizer is trainer.callback_handler.optimizer
    assert trainer.lr_scheduler is trainer.callback_handler.lr_scheduler
    assert isinstance(trainer.optimizer, torch.optim.Optimizer)


def _repo_root():
    from pathlib import Path

    return Path(__file__).resolve().parents[2]
