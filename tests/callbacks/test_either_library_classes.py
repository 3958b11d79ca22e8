"""A script silences or swaps the default callbacks by transformers' classes (`remove_callback(PrinterCallback)`
imported from transformers) or by ours: both work on our trainer, as transformers' own test_add_remove_callback
does them on the reference."""

from __future__ import annotations

import pytest
import transformers

import hf_lightning
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import make_regression_mlp, regression_data

LIBRARIES = {"transformers": transformers, "hf_lightning": hf_lightning}


def _trainers(tmp_path, **kwargs):
    """The reference and ours on the same tiny regression run."""
    common = {"use_cpu": True, "report_to": "none", "save_strategy": "no", "max_steps": 2, "logging_steps": 1}
    common.update(kwargs)
    reference = transformers.Trainer(
        model=make_regression_mlp(),
        args=transformers.TrainingArguments(output_dir=str(tmp_path / "reference"), **common),
        train_dataset=regression_data(),
    )
    ours = HFLightningTrainer(
        model=make_regression_mlp(),
        args=hf_lightning.TrainingArguments(output_dir=str(tmp_path / "ours"), **common),
        train_dataset=regression_data(),
    )
    return reference, ours


def _names(trainer) -> list[str]:
    return [type(callback).__name__ for callback in trainer.callback_handler.callbacks]


def _remove_pop_add(trainer, library) -> list[list[str]]:
    """Remove the printer, pop the flow callback, add both back, then remove / pop absent ones: the names after
    each step, and the popped callbacks' class names."""
    printer, flow = library.PrinterCallback, library.DefaultFlowCallback
    seen = [_names(trainer)]
    trainer.remove_callback(printer)
    seen.append(_names(trainer))
    seen.append([type(trainer.pop_callback(flow)).__name__])
    seen.append(_names(trainer))
    trainer.add_callback(flow)
    trainer.add_callback(printer)
    seen.append(_names(trainer))
    trainer.remove_callback(printer)
    seen.append([repr(trainer.pop_callback(printer))])  # absent now: None
    seen.append(_names(trainer))
    return seen


@pytest.mark.parametrize("library", list(LIBRARIES))
def test_remove_pop_and_add_by_either_librarys_class(tmp_path, library):
    reference, ours = _trainers(tmp_path, disable_tqdm=True)
    expected = _remove_pop_add(reference, transformers)
    assert expected[0] == ["DefaultFlowCallback", "PrinterCallback"] and expected[2] == ["DefaultFlowCallback"]
    assert _remove_pop_add(ours, LIBRARIES[library]) == expected


def test_progress_callback_of_transformers_pops_ours(tmp_path):
    reference, ours = _trainers(tmp_path, disable_tqdm=False)
    assert isinstance(ours.pop_callback(transformers.ProgressCallback), hf_lightning.ProgressCallback)
    assert isinstance(reference.pop_callback(transformers.ProgressCallback), transformers.ProgressCallback)
    assert _names(ours) == _names(reference) == ["DefaultFlowCallback"]


def test_adding_transformers_class_next_to_ours_warns_as_a_duplicate(tmp_path, caplog):
    _, ours = _trainers(tmp_path, disable_tqdm=True)
    with caplog.at_level("WARNING", logger="hf_lightning"):
        ours.add_callback(transformers.PrinterCallback)
    assert "there is already one" in caplog.text


def test_transformers_printer_added_in_place_of_ours_prints_the_logs(tmp_path, capsys):
    _, ours = _trainers(tmp_path, disable_tqdm=True)
    ours.remove_callback(transformers.PrinterCallback)
    ours.add_callback(transformers.PrinterCallback)
    ours.train()
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{'loss'")]
    assert len(printed) == 2, printed  # logging_steps=1, max_steps=2
