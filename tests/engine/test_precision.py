"""Precision translation: Lightning keeps only the fp16 scaler; the forward is autocast by us (R7.6)."""

from __future__ import annotations

import contextlib
import warnings

import torch

from hf_lightning import TrainingArguments
from hf_lightning.core.autocast import planned_autocast_dtype
from hf_lightning.engine.precision import forward_autocast, lightning_precision_kwargs
from hf_lightning.translation.translate import translate


def forward_autocast_dtype(args: TrainingArguments) -> torch.dtype | None:
    """The forward's autocast dtype the plan of `args` gives (translated here: no trainer in these tests)."""
    return planned_autocast_dtype(translate(args, raise_on_refusal=False).module)


def test_lightning_gets_no_step_wide_autocast():
    assert lightning_precision_kwargs("bf16-mixed") == {"precision": "32-true"}
    assert lightning_precision_kwargs("32-true") == {"precision": "32-true"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "GradScaler is enabled, but CUDA is not available" on this machine
        plugin = lightning_precision_kwargs("16-mixed")["plugins"][0]
    assert plugin.precision == "16-mixed"
    assert isinstance(plugin.forward_context(), contextlib.nullcontext)


def test_forward_autocast_dtype_follows_the_reference(tmp_path):
    assert forward_autocast_dtype(TrainingArguments(output_dir=str(tmp_path), use_cpu=True)) is None
    assert forward_autocast_dtype(TrainingArguments(output_dir=str(tmp_path), use_cpu=True, bf16=True)) is torch.bfloat16
    # accelerate turns fp16 autocast off on CPU: the reference trains in float32 there.
    assert forward_autocast_dtype(TrainingArguments(output_dir=str(tmp_path), use_cpu=True, fp16=True)) is None


def test_forward_autocast_casts_outputs_back_to_float32(tmp_path):
    model = torch.nn.Linear(4, 4)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, bf16=True)
    inner_dtypes = []
    model.register_forward_hook(lambda module, inputs, output: inner_dtypes.append(output.dtype))
    with forward_autocast(model, args, translate(args, raise_on_refusal=False).module):
        output = model(torch.randn(2, 4))
    assert inner_dtypes == [torch.bfloat16]
    assert output.dtype == torch.float32
    assert model(torch.randn(2, 4)).dtype == torch.float32  # hooks removed after the context


def test_evaluation_autocasts_as_the_reference_prepares_the_model(tmp_path, monkeypatch):
    """evaluate / predict autocast the forward for fp16 / bf16, except where accelerate prepares the model
    without autocast: DeepSpeed, and a model FSDP2 sharded in training (its mixed precision is the sharding
    policy). An FSDP run's model not sharded yet (evaluate before train) keeps the autocast."""
    import dataclasses
    import types

    import hf_lightning.strategies.for_evaluation as evaluation
    from hf_lightning.trainer.trainer import HFLightningTrainer
    from hf_lightning.translation.translate import translate

    sharded = torch.nn.Linear(2, 2)

    def eval_dtype(model=None, deepspeed_plan: bool = False, **fields) -> torch.dtype | None:
        args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, bf16=True, **fields)
        plan = translate(args, raise_on_refusal=False)
        if deepspeed_plan:  # the plan of a DeepSpeed run (its strategy section; DeepSpeed itself needs CUDA)
            plan = dataclasses.replace(plan, strategy=types.SimpleNamespace(name="deepspeed"))
        facade = types.SimpleNamespace(args=args, plan=plan, model=model or torch.nn.Linear(2, 2))
        return HFLightningTrainer._mixed_precision_dtype(facade)

    assert eval_dtype() == torch.bfloat16
    assert eval_dtype(deepspeed_plan=True) is None
    assert eval_dtype(fsdp=True) == torch.bfloat16  # not sharded yet
    monkeypatch.setattr(evaluation, "is_fsdp2_model", lambda model: model is sharded)
    assert eval_dtype(sharded, fsdp=True) is None
