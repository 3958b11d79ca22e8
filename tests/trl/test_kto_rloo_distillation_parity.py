"""KTOTrainer (its implicit reference model), RLOOTrainer and DistillationTrainer (generating with model.generate,
no vLLM) from hf_lightning.trl against stock TRL."""

from __future__ import annotations

from tests.trl import harness, tiny
from tests.trl.test_grpo_parity import reward_length


def test_kto_matches_stock_trl(tmp_path):
    model_dir = tiny.saved_model_dir(tmp_path / "model")
    runs = {
        side: harness.run(
            side, tmp_path / side, tiny.preference_dataset(), trainer="KTOTrainer", config="KTOConfig",
            model=tiny.load_model(model_dir),
        )
        for side in ("stock", "ours")
    }
    harness.assert_parity(runs["ours"], runs["stock"])
    history = runs["stock"].log_history[:-1]
    keys = set().union(*history)
    assert {"loss", "grad_norm", "learning_rate", "kl", "rewards/chosen", "logps/chosen", "rewards/rejected",
            "logps/rejected", "logits/chosen"} <= keys
    # The KL estimate against the implicit reference model moved, so the reference model took part.
    assert any(entry["kl"] != 0.0 for entry in history)
    assert runs["ours"].trainer.ref_model is not None


def test_rloo_matches_stock_trl(tmp_path):
    from datasets import Dataset

    # RLOO's KL term (beta > 0 by default) needs a reference model, loaded from the policy's path.
    model_dir = tiny.saved_model_dir(tmp_path / "model")
    runs = {
        side: harness.run(
            side, tmp_path / side, Dataset.from_dict({"prompt": [q for q, _ in tiny._QA]}), trainer="RLOOTrainer",
            config="RLOOConfig", model=tiny.load_model(model_dir), trainer_kwargs={"reward_funcs": reward_length}, max_steps=2, num_generations=2,
            max_completion_length=8, save_steps=2,
        )
        for side in ("stock", "ours")
    }
    harness.assert_parity(runs["ours"], runs["stock"])
    first = runs["stock"].log_history[0]
    assert {"reward", "reward_std", "rewards/reward_length/mean", "completions/mean_length", "kl", "entropy",
            "clip_ratio/region_mean"} <= set(first)
    assert runs["stock"].log_history[1]["kl"] != 0.0


def test_distillation_matches_stock_trl(tmp_path):
    from datasets import Dataset

    runs = {
        side: harness.run(
            side, tmp_path / side, Dataset.from_dict({"prompt": [q for q, _ in tiny._QA]}),
            trainer="DistillationTrainer", config="DistillationConfig",
            trainer_kwargs={"teacher_model": tiny.make_model(seed=1)}, max_steps=2, max_completion_length=8,
            save_steps=2,
        )
        for side in ("stock", "ours")
    }
    harness.assert_parity(runs["ours"], runs["stock"])
    first = runs["stock"].log_history[0]
    assert {"loss", "grad_norm", "learning_rate", "completions/mean_length", "entropy"} <= set(first)
    # The loss is the student's divergence from the (differently seeded) teacher.
    assert first["loss"] > 0.0
