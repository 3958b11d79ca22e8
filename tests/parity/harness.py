"""Run one scenario under `transformers.Trainer` and `HFLightningTrainer` and compare the results.

The model is built once and deep-copied for each side; both sides get the same arguments (the
reference's own `TrainingArguments` for transformers, ours for hf_lightning), data and seed.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

SPEED_KEYS = (
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "train_tokens_per_second",
)


@dataclass
class SideResult:
    trainer: Any
    output: Any
    log_history: list[dict]
    state_dict: dict[str, torch.Tensor]


@dataclass
class ParityResult:
    reference: SideResult
    ours: SideResult


def _train(trainer) -> Any:
    return trainer.train()


def _run_side(trainer_cls, args, model, train_dataset, trainer_kwargs, run=_train) -> SideResult:
    trainer = trainer_cls(model=model, args=args, train_dataset=train_dataset, **trainer_kwargs)
    output = run(trainer)
    state = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    return SideResult(trainer, output, list(trainer.state.log_history), state)


def run_parity(
    model: nn.Module,
    train_dataset,
    tmp_path,
    *,
    reference_trainer_cls=None,
    our_trainer_cls=None,
    our_seed: int | None = None,
    trainer_kwargs: dict | None = None,
    reference_trainer_kwargs: dict | None = None,
    our_trainer_kwargs: dict | None = None,
    reference_args_cls=None,
    our_args_cls=None,
    run: Callable[[Any], Any] = _train,
    **args_kwargs,
) -> ParityResult:
    """Train deep copies of `model` with both trainers; `our_seed` lets a mutation test desynchronise us.

    `run(trainer)` replaces `trainer.train()` (its return value becomes `SideResult.output`), e.g. to evaluate
    before and after training; `*_args_cls` select the arguments classes (Seq2Seq ones for Seq2Seq trainers).
    """
    import transformers

    from hf_lightning import TrainingArguments
    from hf_lightning.trainer.trainer import HFLightningTrainer

    defaults = {"use_cpu": True, "report_to": "none", "save_strategy": "no", "disable_tqdm": True}
    merged = {**defaults, **args_kwargs}
    # Each side gets its own copy: the reference writes into nested argument dicts (accelerator_config's
    # gradient_accumulation_kwargs) when its trainer is built.
    reference_args = (reference_args_cls or transformers.TrainingArguments)(
        output_dir=str(tmp_path / "reference"), **copy.deepcopy(merged)
    )
    our_merged = copy.deepcopy(merged)
    if our_seed is not None:
        our_merged["seed"] = our_seed
    our_args = (our_args_cls or TrainingArguments)(output_dir=str(tmp_path / "ours"), **our_merged)
    common = dict(trainer_kwargs or {})
    reference = _run_side(
        reference_trainer_cls or transformers.Trainer,
        reference_args,
        copy.deepcopy(model),
        train_dataset,
        {**common, **(reference_trainer_kwargs or {})},
        run,
    )
    ours = _run_side(
        our_trainer_cls or HFLightningTrainer,
        our_args,
        copy.deepcopy(model),
        train_dataset,
        {**common, **(our_trainer_kwargs or {})},
        run,
    )
    return ParityResult(reference, ours)


def _close(a: float, b: float, rtol: float, atol: float = 0.0) -> bool:
    return math.isclose(a, b, rel_tol=rtol, abs_tol=atol)


def assert_log_history_matches(
    result: ParityResult, *, loss_rtol: float = 1e-4, lr_rtol: float = 1e-6, grad_rtol: float = 1e-4
) -> None:
    """Same entries, keys (in order), steps and epochs; losses, LRs and grad norms within tolerance."""
    ref, ours = result.reference.log_history, result.ours.log_history
    assert [e.get("step") for e in ours] == [e.get("step") for e in ref], (ref, ours)
    for ref_entry, our_entry in zip(ref, ours):
        assert list(our_entry) == list(ref_entry), (ref_entry, our_entry)
        assert our_entry["epoch"] == ref_entry["epoch"], (ref_entry, our_entry)
        for key, ref_value in ref_entry.items():
            our_value = our_entry[key]
            if key in SPEED_KEYS or key.endswith(("_runtime", "_per_second", "_model_preparation_time")):
                continue
            if key.endswith("loss"):
                assert _close(our_value, ref_value, loss_rtol, 1e-7), (key, ref_value, our_value)
            elif key == "learning_rate":
                assert _close(our_value, ref_value, lr_rtol, 1e-12), (key, ref_value, our_value)
            elif key == "grad_norm":
                assert _close(our_value, ref_value, grad_rtol, 1e-7), (key, ref_value, our_value)
            else:
                assert our_value == ref_value, (key, ref_value, our_value)


def assert_weights_close(result: ParityResult, rtol: float = 1e-4, atol: float = 1e-6) -> None:
    """Final weights equal within a relative tolerance, tensor by tensor."""
    ref, ours = result.reference.state_dict, result.ours.state_dict
    assert ref.keys() == ours.keys()
    for name in ref:
        torch.testing.assert_close(
            ours[name], ref[name], rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}"
        )


def assert_parity(result: ParityResult, **tolerances) -> None:
    """The issue's parity bar: global_step, log history and final weights."""
    assert result.ours.output.global_step == result.reference.output.global_step
    assert result.ours.trainer.state.global_step == result.reference.trainer.state.global_step
    assert_log_history_matches(result, **tolerances)
    assert_weights_close(result)


# ---- evaluation and prediction -------------------------------------------------------------------------------

TIMING_SUFFIXES = ("_runtime", "_per_second", "_model_preparation_time")


def assert_metrics_match(ours: dict, ref: dict, atol: float = 1e-6) -> None:
    """Same keys in the same order; timing keys only present (non-negative numbers); numbers to `atol`."""
    assert list(ours) == list(ref), (list(ref), list(ours))
    for key, ref_value in ref.items():
        value = ours[key]
        if key.endswith(TIMING_SUFFIXES):
            assert isinstance(value, (int, float)) and value >= 0, (key, value)
        elif isinstance(ref_value, float) and math.isnan(ref_value):
            assert isinstance(value, float) and math.isnan(value), (key, value)
        elif isinstance(ref_value, (int, float)) and not isinstance(ref_value, bool):
            assert type(value) is type(ref_value), (key, ref_value, value)
            assert _close(value, ref_value, 0.0, atol), (key, ref_value, value)
        else:
            assert value == ref_value, (key, ref_value, value)


def assert_arrays_equal(ours: Any, ref: Any) -> None:
    """Same nesting, dtypes, shapes and values, exactly (the -100 / pad-id padding included)."""
    assert type(ours) is type(ref), (type(ref), type(ours))
    if isinstance(ref, (list, tuple)):
        assert len(ours) == len(ref), (len(ref), len(ours))
        for our_item, ref_item in zip(ours, ref):
            assert_arrays_equal(our_item, ref_item)
    elif isinstance(ref, np.ndarray):
        assert (ours.dtype, ours.shape) == (ref.dtype, ref.shape), (
            ref.dtype,
            ref.shape,
            ours.dtype,
            ours.shape,
        )
        assert np.array_equal(ours, ref, equal_nan=ours.dtype.kind == "f"), (ref, ours)
    else:
        assert ours == ref, (ref, ours)


def assert_predictions_equal(ours: Any, ref: Any, atol: float = 1e-6) -> None:
    """Two `PredictionOutput`s: predictions and labels exactly equal, metrics as `assert_metrics_match`."""
    assert_arrays_equal(ours.predictions, ref.predictions)
    assert_arrays_equal(ours.label_ids, ref.label_ids)
    assert_metrics_match(ours.metrics, ref.metrics, atol=atol)
