"""The telemetry in TRL's online trainers: GRPO / RLOO's generation is a share of its own in the run's time."""

from __future__ import annotations

import time

from tests.trl import harness, tiny
from tests.trl.test_grpo_parity import reward_length


def test_grpo_generation_is_its_own_share(tmp_path):
    from datasets import Dataset

    model = tiny.make_model()
    generate = model.generate
    calls = []

    def slow_generate(*args, **kwargs):
        calls.append(None)
        time.sleep(0.1)
        return generate(*args, **kwargs)

    model.generate = slow_generate
    run = harness.run(
        "ours", tmp_path, Dataset.from_dict({"prompt": [q for q, _ in tiny._QA]}), trainer="GRPOTrainer",
        config="GRPOConfig", model=model, trainer_kwargs={"reward_funcs": reward_length}, max_steps=2,
        num_generations=2, max_completion_length=8, save_strategy="no",
    )
    content = run.trainer._telemetry.last_summary
    generation = content["time_breakdown"]["generation"]
    assert calls and generation["seconds"] >= 0.1 * len(calls)
    assert generation["share"] > 0.1
    assert "generation_share" in content["whole_run"]


def test_rloo_generation_is_timed_too():
    import trl

    from hf_lightning.trl import GRPOTrainer, RLOOTrainer

    for ours, stock in ((GRPOTrainer, trl.GRPOTrainer), (RLOOTrainer, trl.RLOOTrainer)):
        assert ours._generate._times_generation and ours._generate.__wrapped__.__code__ is stock._generate.__code__
        assert not getattr(stock._generate, "_times_generation", False)  # TRL's own class is left alone
