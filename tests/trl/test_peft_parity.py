"""TRL with LoRA (a `peft_config`), the most common way TRL is used, from hf_lightning.trl against stock TRL.

Each TRL trainer reads `args.deepspeed_plugin` when it wraps the model with PEFT; the reference's arguments set it
(None without DeepSpeed). SFT and DPO train the same adapters as stock TRL (log history, weights, checkpoint files),
and a run resumed from its adapter-only checkpoint ends where the uninterrupted stock run ends.
"""

from __future__ import annotations

import pytest

from tests.trl import harness, tiny

peft = pytest.importorskip("peft")


def _lora():
    return peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def _adapter_files(run: harness.Run) -> dict[str, list[str]]:
    return {name: [f for f in files if f.startswith("adapter_")] for name, files in run.checkpoints.items()}


@pytest.fixture(scope="module")
def sft_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("sft_lora")
    return base, {
        side: harness.run(side, base / side, tiny.conversational_dataset(), trainer_kwargs={"peft_config": _lora()})
        for side in ("stock", "ours")
    }


def test_sft_with_lora_matches_stock_trl(sft_runs):
    _, runs = sft_runs
    harness.assert_parity(runs["ours"], runs["stock"])
    assert _adapter_files(runs["ours"])["checkpoint-2"] == ["adapter_config.json", "adapter_model.safetensors"]
    assert "model.safetensors" not in runs["ours"].checkpoints["checkpoint-2"]
    assert any("lora_A" in name for name in runs["ours"].weights)


def test_sft_with_lora_resumes_from_its_adapter_checkpoint(sft_runs, tmp_path):
    """Ours resumed from our adapter-only checkpoint: the stock run resumed from its own (log history, whose saved
    entries come back from JSON with sorted keys) and the stock uninterrupted run's weights."""
    base, runs = sft_runs
    resumed = {
        side: harness.run(
            side, tmp_path / side, tiny.conversational_dataset(), trainer_kwargs={"peft_config": _lora()},
            resume_from_checkpoint=str(base / side / "checkpoint-2"),
        )
        for side in ("stock", "ours")
    }  # fmt: skip
    harness.assert_same_history(resumed["ours"].log_history, resumed["stock"].log_history)
    harness.assert_same_weights(resumed["ours"].weights, runs["stock"].weights)
    harness.assert_same_weights(resumed["stock"].weights, runs["stock"].weights)


def test_dpo_with_lora_matches_stock_trl(tmp_path):
    model_dir = tiny.saved_model_dir(tmp_path / "model")
    runs = {
        side: harness.run(
            side, tmp_path / side, tiny.preference_dataset(), trainer="DPOTrainer", config="DPOConfig",
            model=tiny.load_model(model_dir), trainer_kwargs={"peft_config": _lora()},
        )
        for side in ("stock", "ours")
    }  # fmt: skip
    harness.assert_parity(runs["ours"], runs["stock"])
    # With PEFT, DPO's reference model is the base with the adapters switched off: no second model.
    assert runs["ours"].trainer.ref_model is None
    assert runs["stock"].log_history[1]["rewards/margins"] != 0.0
