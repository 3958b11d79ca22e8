"""GRPOTrainer from hf_lightning.trl, generating with model.generate (no vLLM), against stock TRL."""

from __future__ import annotations

from tests.trl import harness, tiny


def reward_length(completions, **kwargs):
    """Completions near 10 characters score best."""
    return [float(-abs(len(completion) - 10)) for completion in completions]


def test_grpo_matches_stock_trl(tmp_path):
    from datasets import Dataset

    runs = {
        side: harness.run(
            side, tmp_path / side, Dataset.from_dict({"prompt": [q for q, _ in tiny._QA]}), trainer="GRPOTrainer",
            config="GRPOConfig", trainer_kwargs={"reward_funcs": reward_length}, max_steps=2, num_generations=2,
            max_completion_length=8, save_steps=2,
        )
        for side in ("stock", "ours")
    }
    harness.assert_parity(runs["ours"], runs["stock"])
    assert {"reward", "reward_std", "completions/mean_length", "entropy"} <= set(runs["stock"].log_history[0])
