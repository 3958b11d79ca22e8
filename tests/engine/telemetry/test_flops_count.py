"""How the telemetry counts FLOPs: from a transformers model's config with attention included, without running the
user's code; Lightning's `measure_flops` on a meta copy only when asked (`Telemetry(flops="measure")`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from hf_lightning import Telemetry, Trainer, TrainingArguments
from tests.models import ListDataset, make_tiny_gpt2, make_tiny_llama, regression_data

FORWARD_CALLS = []  # a global the model's forward appends to: a side effect a copy of the model cannot hide


class CountingMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 1)

    def forward(self, x, labels=None):
        FORWARD_CALLS.append(x.shape[0])
        prediction = self.layer(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(prediction, labels), "logits": prediction}


def _train(tmp_path, model, data, telemetry, **fields):
    args = TrainingArguments(
        output_dir=str(tmp_path), report_to="none", disable_tqdm=True, save_strategy="no", use_cpu=True,
        per_device_train_batch_size=2, logging_steps=2, **fields,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=data, telemetry=telemetry)
    trainer.train()
    return trainer


@pytest.mark.parametrize(
    ("telemetry", "extra_calls", "source"),
    [(True, 0, None), (False, 0, None), (Telemetry(flops="measure"), 1, "measure_flops on the meta device")],
)
def test_the_users_forward_runs_as_in_the_reference_unless_measuring_is_asked(tmp_path, telemetry, extra_calls, source):
    import transformers

    FORWARD_CALLS.clear()
    reference_args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "reference"), report_to="none", disable_tqdm=True, save_strategy="no",
        use_cpu=True, per_device_train_batch_size=2, logging_steps=2, max_steps=4,
    )  # fmt: skip
    transformers.Trainer(model=CountingMLP(), args=reference_args, train_dataset=regression_data(8)).train()
    reference_calls = len(FORWARD_CALLS)
    FORWARD_CALLS.clear()
    trainer = _train(tmp_path / "ours", CountingMLP(), regression_data(8), telemetry, max_steps=4)
    assert len(FORWARD_CALLS) == reference_calls + extra_calls == 4 + extra_calls
    summary = trainer._telemetry.last_summary if trainer._telemetry is not None else None
    if telemetry is True:  # a plain module with no count of its own: no FLOPs, said in the summary
        assert summary["flops_source"] is None
    elif source is not None:
        assert summary["flops_source"] == source


def _nanogpt_flops_per_token(model, sequence_length: int) -> float:
    """nanoGPT's `estimate_mfu` count: 6 N + 12 L H Q T, N every parameter but the position table and the input
    embedding (counted once more where the head is tied to it, as nanoGPT counts its tied head)."""
    config = model.config
    embeddings = [module.weight for module in model.modules() if isinstance(module, nn.Embedding)]
    head = model.get_output_embeddings().weight
    n = sum(p.numel() for p in model.parameters()) - sum(w.numel() for w in embeddings)
    n += head.numel() if any(head is w for w in embeddings) else 0
    return 6 * n + 12 * config.num_hidden_layers * config.hidden_size * sequence_length


@pytest.mark.parametrize("make_model", [make_tiny_gpt2, make_tiny_llama])
def test_a_language_models_flops_include_attention_and_the_head_without_running_it(tmp_path, make_model):
    sequence_length, steps = 12, 4
    generator = torch.Generator().manual_seed(0)
    data = ListDataset(
        [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 60, (8, sequence_length), generator=generator)]
    )
    model = make_model()
    trainer = _train(tmp_path, model, data, Telemetry(peak_flops=np.float32(1e12)), max_steps=steps)
    summary = trainer._telemetry.last_summary
    expected = _nanogpt_flops_per_token(model, sequence_length) * 2 * sequence_length * steps
    assert summary["flops"] == pytest.approx(expected, rel=1e-9)
    assert "attention" in summary["flops_source"] and summary["peak_flops_per_device"] == pytest.approx(1e12, rel=1e-6)
    assert summary["flops"] > trainer.state.total_flos  # the reference's 6 N tokens misses attention (and a tied head)
    assert "mfu" in summary["whole_run"]


def test_numpy_numbers_are_accepted_as_peak_flops_and_bad_modes_refused():
    assert Telemetry(peak_flops=np.int64(5)).telemetry_settings.peak_flops == 5.0
    assert isinstance(Telemetry(peak_flops=np.float64(2.5e14)).telemetry_settings.peak_flops, float)
    with pytest.raises(ValueError, match="flops='fast'"):
        Telemetry(flops="fast")
    with pytest.raises(ValueError, match="positive number"):
        Telemetry(peak_flops=np.float32(-1))
