"""Every file we write gets the mode ordinary files get (0666 less the umask), also where safetensors writes 0600:
a consolidated model and the checkpoints' data-state files sit beside config.json and the tokenizer, which follow
the umask."""

from __future__ import annotations

import os
import stat

import torch
from safetensors.torch import load_file

from hf_lightning.checkpoint.consolidate import consolidate_checkpoint
from tests.models import make_regression_mlp, regression_data


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_consolidated_weights_and_data_state_files_follow_the_umask(tmp_path):
    from torch.utils.data import IterableDataset

    from hf_lightning import Trainer, TrainingArguments

    class Stream(IterableDataset):  # an iterable dataset: its checkpoints keep the loader's state in safetensors
        def __iter__(self):
            yield from regression_data(8)

    previous = os.umask(0o022)
    try:
        args = TrainingArguments(
            output_dir=str(tmp_path / "run"), use_cpu=True, report_to="none", disable_tqdm=True,
            per_device_train_batch_size=2, max_steps=2, save_steps=2,
        )  # fmt: skip
        Trainer(model=make_regression_mlp(), args=args, train_dataset=Stream()).train()
        checkpoint = tmp_path / "run" / "checkpoint-2"
        data_states = [name for name in os.listdir(checkpoint) if name.startswith("hf_lightning_data_state")]
        assert data_states
        written = consolidate_checkpoint(str(checkpoint))
    finally:
        os.umask(previous)
    for path in [checkpoint / name for name in data_states] + [checkpoint / "model.safetensors"]:
        assert _mode(path) == 0o644, path
    assert _mode(os.path.join(written, "model.safetensors")) == 0o644
    consolidated, saved = load_file(os.path.join(written, "model.safetensors")), load_file(str(checkpoint / "model.safetensors"))
    assert consolidated.keys() == saved.keys() and all(torch.equal(consolidated[k], saved[k]) for k in saved)
