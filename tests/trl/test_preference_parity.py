"""RewardTrainer and DPOTrainer (its implicit reference model) from hf_lightning.trl against stock TRL."""

from __future__ import annotations

import pytest

from tests.trl import harness, tiny


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny model saved once; DPO loads its implicit reference model from the policy's path."""
    return tiny.saved_model_dir(tmp_path_factory.mktemp("dpo_model"))


def test_reward_modelling_matches_stock_trl(tmp_path):
    runs = {
        side: harness.run(
            side, tmp_path / side, tiny.preference_dataset(), trainer="RewardTrainer", config="RewardConfig",
            model=tiny.make_reward_model(),
        )
        for side in ("stock", "ours")
    }
    harness.assert_parity(runs["ours"], runs["stock"])
    assert {"loss", "grad_norm", "num_tokens", "mean_reward", "accuracy", "margin"} <= set(runs["stock"].log_history[0])


def test_dpo_matches_stock_trl(tmp_path, model_dir):
    runs = {
        side: harness.run(
            side, tmp_path / side, tiny.preference_dataset(), trainer="DPOTrainer", config="DPOConfig",
            model=tiny.load_model(model_dir),
        )
        for side in ("stock", "ours")
    }
    harness.assert_parity(runs["ours"], runs["stock"])
    keys = set(runs["stock"].log_history[1])
    assert {"rewards/chosen", "rewards/margins", "logps/chosen", "logps/rejected", "logits/chosen"} <= keys
    # The implicit reference model was loaded from the policy's path and kept frozen.
    assert runs["ours"].trainer.ref_model is not None
    assert runs["stock"].log_history[1]["rewards/margins"] != 0.0
