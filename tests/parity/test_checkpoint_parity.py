"""End-to-end checkpoint parity with `transformers.Trainer`: folders left on disk, best-model tracking, final
weights, the last checkpoint's `trainer_state.json` and the `save_metrics` files, on the same runs."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tests.models import make_regression_mlp, regression_data
from tests.parity.harness import assert_weights_close, run_parity

# Wall-clock measurements differ between any two runs, so they are only checked for presence.
RUNTIME_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second")
RUNTIME_SUFFIXES = ("_runtime", "_per_second")


def _run(tmp_path, run=None, **kwargs):
    defaults = dict(
        max_steps=6,
        per_device_train_batch_size=2,
        learning_rate=0.1,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
    )
    extra = {} if run is None else {"run": run}
    return run_parity(
        make_regression_mlp(),
        regression_data(n=8),
        tmp_path,
        trainer_kwargs={"eval_dataset": regression_data(n=6, seed=3)},
        **extra,
        **{**defaults, **kwargs},
    )


def _folders(trainer) -> list[str]:
    return sorted(p.name for p in Path(trainer.args.output_dir).iterdir() if p.is_dir())


def _relative_best(trainer) -> str | None:
    best = trainer.state.best_model_checkpoint
    return None if best is None else os.path.relpath(best, trainer.args.output_dir)


# learning_rate 0.1: the best checkpoint is the last one; 0.5: eval_loss rises after step 2, so the best
# checkpoint is an earlier one that rotation must keep (and load at the end).
@pytest.mark.parametrize("learning_rate", [0.1, 0.5])
@pytest.mark.parametrize("save_total_limit", [1, 2])
def test_load_best_model_at_end_matches_reference(tmp_path, save_total_limit, learning_rate):
    result = _run(
        tmp_path,
        learning_rate=learning_rate,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        save_total_limit=save_total_limit,
    )
    ref, ours = result.reference.trainer, result.ours.trainer
    assert _folders(ref)  # the scenario does leave checkpoints
    assert _folders(ours) == _folders(ref)
    assert _relative_best(ours) == _relative_best(ref) is not None
    assert math.isclose(ours.state.best_metric, ref.state.best_metric, abs_tol=1e-6)
    assert ours.state.best_global_step == ref.state.best_global_step
    assert_weights_close(result, rtol=0.0, atol=1e-5)


def test_save_strategy_best_matches_reference(tmp_path):
    result = _run(tmp_path, save_strategy="best", metric_for_best_model="loss", eval_steps=1)
    ref, ours = result.reference.trainer, result.ours.trainer
    assert _folders(ref)
    assert _folders(ours) == _folders(ref)
    assert _relative_best(ours) == _relative_best(ref)


def test_final_step_save_when_save_steps_does_not_divide_max_steps(tmp_path):
    result = _run(tmp_path, max_steps=5, save_steps=2, eval_strategy="no")
    ref, ours = result.reference.trainer, result.ours.trainer
    assert "checkpoint-5" in _folders(ref)  # the reference saves at the last step too
    assert _folders(ours) == _folders(ref)


def _comparable(value):
    if isinstance(value, dict):
        return {
            k: _comparable(v)
            for k, v in value.items()
            if k not in RUNTIME_KEYS and not k.endswith(RUNTIME_SUFFIXES)
        }
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    if isinstance(value, float):
        return round(value, 5)  # losses / grad norms agree to ~1e-6 (float32 on two loops), not bit for bit
    return value


def test_last_checkpoint_trainer_state_matches_reference(tmp_path):
    result = _run(tmp_path, load_best_model_at_end=True, metric_for_best_model="eval_loss")
    states = []
    for side in (result.reference, result.ours):
        output_dir = Path(side.trainer.args.output_dir)
        last = max((p for p in output_dir.glob("checkpoint-*")), key=lambda p: int(p.name.split("-")[1]))
        state = json.loads((last / "trainer_state.json").read_text())
        # The best checkpoint's path is absolute under each run's own output_dir.
        state["best_model_checkpoint"] = os.path.relpath(state["best_model_checkpoint"], output_dir)
        states.append(state)
    ref, ours = states
    assert list(ours) == list(ref)
    assert _comparable(ours) == _comparable(ref)
    for ref_entry, our_entry in zip(ref["log_history"], ours["log_history"]):
        assert [k for k in our_entry] == [k for k in ref_entry]  # runtime keys present on both sides


def test_save_metrics_files_match_reference(tmp_path):
    def run(trainer):
        output = trainer.train()
        trainer.save_metrics("train", output.metrics)
        trainer.save_metrics("eval", trainer.evaluate())
        return output

    result = _run(tmp_path, run=run, eval_strategy="no", save_strategy="no", max_steps=2)
    names = []
    for side in (result.reference, result.ours):
        output_dir = Path(side.trainer.args.output_dir)
        names.append(sorted(p.name for p in output_dir.iterdir() if p.is_file()))
        all_results = json.loads((output_dir / "all_results.json").read_text())
        names.append(sorted(all_results))
    ref_files, ref_keys, our_files, our_keys = names
    assert {"train_results.json", "eval_results.json", "all_results.json"} <= set(ref_files)
    # The telemetry's summary is printed, not written, unless asked (docs/divergences.md, "run_performance.json").
    assert our_files == ref_files
    assert our_keys == ref_keys
