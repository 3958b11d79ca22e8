"""One TRL run, stock (trl's classes on transformers) or ours (hf_lightning.trl), and what parity compares."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tests.trl.tiny import make_model, make_tokenizer

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

# Wall-clock values differ between any two runs.
_TIMING_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "step_time")
# Ours holds one more file per checkpoint, the completion marker of the atomic save (docs/divergences.md).
_OUR_MARKER = "hf_lightning_complete.json"
# And, with a collator that may draw random numbers (TRL's), where the train data stood (data/position_files.py).
_OUR_DATA = "hf_lightning_data_"

BASE_FIELDS: dict[str, Any] = dict(
    use_cpu=True, report_to="none", max_steps=4, logging_steps=1, per_device_train_batch_size=4, save_steps=2,
    learning_rate=1e-3, seed=0, max_length=32, bf16=False, gradient_checkpointing=False, disable_tqdm=True,
)


@dataclass
class Run:
    """What a run leaves: its log history (timings removed), final weights, checkpoint folders and trainer."""

    log_history: list[dict]
    weights: dict[str, torch.Tensor]
    checkpoints: dict[str, list[str]]
    trainer: Any


def classes(side: str, trainer: str, config: str) -> tuple[type, type]:
    """The trainer and config classes of `side` ("stock": trl's; "ours": hf_lightning.trl's)."""
    module = importlib.import_module("trl" if side == "stock" else "hf_lightning.trl")
    return getattr(module, trainer), getattr(module, config)


def config_class(side: str, config: str) -> type:
    """The config class of `side`, or transformers' `TrainingArguments` for side "transformers"."""
    if side == "transformers":
        import transformers

        return transformers.TrainingArguments
    return classes(side, "SFTTrainer", config)[1]


def checkpoint_files(out_dir: Path) -> dict[str, list[str]]:
    """checkpoint-N -> its sorted file names (our completion marker and data-position files left out)."""
    return {
        folder.name: sorted(p.name for p in folder.iterdir() if p.name != _OUR_MARKER and not p.name.startswith(_OUR_DATA))
        for folder in sorted(out_dir.glob("checkpoint-*"))
    }


def run(
    side: str, out_dir: Path, train_dataset, *, trainer: str = "SFTTrainer", config: str = "SFTConfig",
    model=None, resume_from_checkpoint: str | None = None, trainer_kwargs: dict | None = None,
    config_side: str | None = None, **fields,
) -> Run:
    """Train a fresh tiny model with `side`'s classes; `fields` override BASE_FIELDS. The config is built from
    `config_side`'s class (`side`'s unless given; "transformers": a plain `TrainingArguments`)."""
    trainer_cls, _ = classes(side, trainer, config)
    config_cls = config_class(config_side or side, config)
    # A base field the config does not have (GRPOConfig has no max_length) is left out.
    base = {k: v for k, v in BASE_FIELDS.items() if k in config_cls.__dataclass_fields__}
    args = config_cls(output_dir=str(out_dir), **{**base, **fields})
    model = make_model() if model is None else model
    instance = trainer_cls(
        model=model, args=args, train_dataset=train_dataset, processing_class=make_tokenizer(),
        **(trainer_kwargs or {}),
    )
    instance.train(resume_from_checkpoint=resume_from_checkpoint)
    history = [{k: v for k, v in entry.items() if k not in _TIMING_KEYS} for entry in instance.state.log_history]
    weights = {name: tensor.detach().clone() for name, tensor in instance.model.state_dict().items()}
    return Run(history, weights, checkpoint_files(out_dir), instance)


def assert_same_history(ours: list[dict], stock: list[dict]) -> None:
    """Same entries with the same keys in the same order, numbers equal to float32 noise."""
    assert [list(entry) for entry in ours] == [list(entry) for entry in stock]
    for our_entry, stock_entry in zip(ours, stock):
        for key, value in stock_entry.items():
            if isinstance(value, float):
                assert our_entry[key] == _approx(value), (stock_entry["step"], key)
            else:
                assert our_entry[key] == value, (stock_entry["step"], key)


def assert_same_weights(ours: dict[str, torch.Tensor], stock: dict[str, torch.Tensor]) -> None:
    """The same parameter names, values equal to float32 noise."""
    assert list(ours) == list(stock)
    for name, tensor in stock.items():
        torch.testing.assert_close(ours[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def assert_parity(ours: Run, stock: Run) -> None:
    """Log history, final weights and checkpoint files equal to the stock run's."""
    assert_same_history(ours.log_history, stock.log_history)
    assert_same_weights(ours.weights, stock.weights)
    assert ours.checkpoints == stock.checkpoints
    assert ours.checkpoints, "no checkpoint was written"


def _approx(value: float):
    import pytest

    return pytest.approx(value, rel=1e-5, abs=1e-7)
