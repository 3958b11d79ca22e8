"""What TRL's code needs beyond its plain methods, against stock TRL: `super()` inside decorated methods (GRPO's and
RLOO's `@profiling_decorator` `_calculate_rewards` calls `super()._prepare_inputs` for a reward model), and
`sync_ref_model=True`, whose `SyncRefModelCallback` asks accelerate's global `AcceleratorState()` (answered by
hf_lightning/adapted/accelerate_state.py, no accelerate state is made)."""

from __future__ import annotations

import pytest
import torch

from tests.trl import harness, tiny


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["GRPOTrainer", "RLOOTrainer"])
def test_a_reward_model_goes_through_the_decorated_super_call(tmp_path, trainer):
    from datasets import Dataset

    model_dir = tiny.saved_model_dir(tmp_path / "model")
    runs = {
        side: harness.run(
            side, tmp_path / side, Dataset.from_dict({"prompt": [q for q, _ in tiny._QA]}), trainer=trainer,
            config=trainer.replace("Trainer", "Config"), model=tiny.load_model(model_dir),
            trainer_kwargs={"reward_funcs": [tiny.make_reward_model(seed=3)],
                            "reward_processing_classes": [tiny.make_tokenizer()]},
            max_steps=2, num_generations=2, max_completion_length=8, save_steps=2,
        )
        for side in ("stock", "ours")
    }
    harness.assert_parity(runs["ours"], runs["stock"])
    rewards = [key for key in runs["stock"].log_history[0] if key.startswith("rewards/") and key.endswith("/mean")]
    assert rewards, "no reward model score was logged"


@pytest.mark.slow
def test_dpo_sync_ref_model_matches_stock_trl(tmp_path):
    from accelerate.state import AcceleratorState

    # Ours first, with no accelerate state in the process (a stock run, here or in an earlier test, leaves one).
    AcceleratorState._reset_state(reset_partial_state=True)
    model_dir = tiny.saved_model_dir(tmp_path / "model")
    runs = {
        side: harness.run(
            side, tmp_path / side, tiny.preference_dataset(), trainer="DPOTrainer", config="DPOConfig",
            model=tiny.load_model(model_dir), sync_ref_model=True, ref_model_sync_steps=1, ref_model_mixup_alpha=0.5,
        )
        for side in ("ours", "stock")
    }
    harness.assert_parity(runs["ours"], runs["stock"])
    ours = runs["ours"].trainer
    assert any(type(cb).__name__ == "SyncRefModelCallback" for cb in ours.callback_handler.callbacks)
    # The reference model moved half-way towards the policy at every step: it equals stock's and left its start.
    stock_ref = dict(runs["stock"].trainer.ref_model.named_parameters())
    start = tiny.load_model(model_dir)
    moved = False
    for name, parameter in ours.ref_model.named_parameters():
        torch.testing.assert_close(parameter, stock_ref[name], rtol=1e-5, atol=1e-6)
        moved = moved or not torch.equal(parameter, dict(start.named_parameters())[name])
    assert moved


def test_accelerate_state_stand_in_answers_what_trl_asks():
    from hf_lightning.adapted.accelerate_state import AcceleratorState

    state = AcceleratorState()
    assert state.deepspeed_plugin is None and state.process_index == 0 and state.num_processes == 1
    with pytest.raises(AttributeError, match="trainer.accelerator.state"):
        _ = state.mixed_precision
