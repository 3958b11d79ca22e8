"""Run one scenario under `transformers.Trainer` and `HFLightningTrainer` and compare the results.

The model is built once and deep-copied for each side; both sides get the same arguments (the
reference's own `TrainingArguments` for transformers, ours for hf_lightning), data and seed.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

SPEED_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_tokens_per_second")


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


def _run_side(trainer_cls, args, model, train_dataset, trainer_kwargs) -> SideResult:
    trainer = trainer_cls(model=model, args=args, train_dataset=train_dataset, **trainer_kwargs)
    output = trainer.train()
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
    **args_kwargs,
) -> ParityResult:
    """Train deep copies of `model` with both trainers; `our_seed` lets a mutation test desynchronise us."""
    import transformers

    from hf_lightning import TrainingArguments
    from hf_lightning.trainer import HFLightningTrainer

    defaults = {"use_cpu": True, "report_to": "none", "save_strategy": "no", "disable_tqdm": True}
    merged = {**defaults, **args_kwargs}
    reference_args = transformers.TrainingArguments(output_dir=str(tmp_path / "reference"), **merged)
    our_merged = dict(merged)
    if our_seed is not None:
        our_merged["seed"] = our_seed
    our_args = TrainingArguments(output_dir=str(tmp_path / "ours"), **our_merged)
    common = dict(trainer_kwargs or {})
    reference = _run_side(
        reference_trainer_cls or transformers.Trainer,
        reference_args,
        copy.deepcopy(model),
        train_dataset,
        {**common, **(reference_trainer_kwargs or {})},
    )
    ours = _run_side(
        our_trainer_cls or HFLightningTrainer,
        our_args,
        copy.deepcopy(model),
        train_dataset,
        {**common, **(our_trainer_kwargs or {})},
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
        torch.testing.assert_close(ours[name], ref[name], rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def assert_parity(result: ParityResult, **tolerances) -> None:
    """The issue's parity bar: global_step, log history and final weights."""
    assert result.ours.output.global_step == result.reference.output.global_step
    assert result.ours.trainer.state.global_step == result.reference.trainer.state.global_step
    assert_log_history_matches(result, **tolerances)
    assert_weights_close(result)
