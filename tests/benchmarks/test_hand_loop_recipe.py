"""The hand-written baseline loop optimizes what the reference optimizes: the same two parameter groups.

transformers.Trainer splits the parameters into a weight-decay group and a no-decay group (biases, norms) even
with `weight_decay=0.0`, so every step updates two groups; a one-group hand loop would time less work than the
trainers it is the baseline of.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.train_runners import reference_optimizer, reference_parameter_groups  # noqa: E402
from benchmarks.workloads import build_workload  # noqa: E402


@pytest.mark.parametrize("workload", ["tiny", "cls", "clm"])
def test_hand_loop_groups_match_the_reference_optimizer(workload, tmp_path):
    from transformers import Trainer, TrainingArguments

    model = build_workload(workload, "smoke").seeded_model()
    reference = Trainer(
        model=model, args=TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    ).create_optimizer()
    hand = reference_optimizer(model, learning_rate=1e-3)
    assert [[id(p) for p in g["params"]] for g in hand.param_groups] == [
        [id(p) for p in g["params"]] for g in reference.param_groups
    ]
    assert [g["weight_decay"] for g in hand.param_groups] == [g["weight_decay"] for g in reference.param_groups]
    assert all(g["params"] for g in reference_parameter_groups(model))  # both groups are stepped
    assert type(hand) is type(reference) and hand.defaults["fused"] == reference.defaults["fused"]
