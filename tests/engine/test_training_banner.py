"""With transformers loaded, `log_level="info"` logs the reference's "***** Running training *****" banner, line
for line, on transformers' logger (where transformers' own tests capture it), and a resume with other arguments
warns there as the reference does, naming each field and both values."""

from __future__ import annotations

import contextlib
import io
import logging

import transformers

import hf_lightning
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import make_regression_mlp, regression_data

SIDES = {
    "reference": (transformers.Trainer, transformers.TrainingArguments),
    "ours": (HFLightningTrainer, hf_lightning.TrainingArguments),
}


@contextlib.contextmanager
def transformers_log():
    """What reaches transformers' library logger (transformers' CaptureLogger does the same)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    library = logging.getLogger("transformers")
    library.addHandler(handler)
    try:
        yield stream
    finally:
        library.removeHandler(handler)


def _train(side: str, output_dir, resume=None, **kwargs) -> str:
    trainer_class, arguments_class = SIDES[side]
    settings = {"use_cpu": True, "report_to": "none", "disable_tqdm": True, "log_level": "info", **kwargs}
    trainer = trainer_class(
        model=make_regression_mlp(),
        args=arguments_class(output_dir=str(output_dir), **settings),
        train_dataset=regression_data(n=10),
    )
    with transformers_log() as stream:
        trainer.train(resume_from_checkpoint=resume)
    return stream.getvalue()


def _banner(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("***** Running training *****")
    end = start + 1
    while end < len(lines) and lines[end].startswith("  "):
        end += 1
    return lines[start:end]


def test_the_banner_is_the_references_line_for_line(tmp_path):
    run = {"num_train_epochs": 2, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2,
           "save_strategy": "no"}  # fmt: skip
    banners = {side: _banner(_train(side, tmp_path / side, **run)) for side in SIDES}
    assert banners["ours"] == banners["reference"]
    assert [line.split(" = ")[0].strip() for line in banners["ours"][1:]] == [
        "Num examples", "Num Epochs", "Num update steps per epoch", "Instantaneous batch size per device",
        "Total train batch size (w. parallel, distributed & accumulation)", "Gradient Accumulation steps",
        "Total optimization steps", "Number of trainable parameters",
    ]  # fmt: skip
    assert "  Number of trainable parameters = 57" in banners["ours"]


def test_a_resume_with_other_arguments_warns_and_says_where_it_continues(tmp_path):
    first = {"max_steps": 4, "save_steps": 2, "logging_steps": 1, "eval_steps": 2, "per_device_train_batch_size": 2}
    # Values no other test resumes with: the warning is logged once per process, in both libraries.
    second = {"max_steps": 6, "save_steps": 7, "logging_steps": 3, "eval_steps": 11, "per_device_train_batch_size": 4}
    logged = {}
    for side in SIDES:
        _train(side, tmp_path / side, **first)
        logged[side] = _train(side, tmp_path / side, resume=str(tmp_path / side / "checkpoint-4"), **second)
    for field, ours, theirs in (
        ("logging_steps", 3, 1), ("eval_steps", 11, 2), ("save_steps", 7, 2), ("per_device_train_batch_size", 4, 2),
    ):  # fmt: skip
        line = f"\t{field}: {ours} (from args) != {theirs} (from trainer_state.json)"
        assert line in logged["reference"] and line in logged["ours"], (field, logged["ours"])
    assert _banner(logged["ours"]) == _banner(logged["reference"])
    assert _banner(logged["ours"])[-2:] == [
        "  Resuming training from checkpoint with epoch 1 and global step 4",
        "  Fast-forwarding the dataloader past 1 epochs and 1 batches to resume from the exact training state.",
    ]
