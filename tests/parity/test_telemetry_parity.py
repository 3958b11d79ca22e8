"""With the telemetry on (the default, here also given explicitly with every display on), log_history and the
checkpoints' trainer_state.json are the reference's: the figures go to the progress bar, the loggers and
run_performance.json only."""

from __future__ import annotations

import json
from pathlib import Path

from hf_lightning import Telemetry
from tests.models import make_tiny_gpt2, padded_lm_data
from tests.parity.harness import assert_parity, run_parity

TIMING_SUFFIXES = ("_runtime", "_per_second")


def _untimed_state(path: Path) -> dict:
    state = json.loads(path.read_text())
    state["log_history"] = [
        {key: value for key, value in entry.items() if not key.endswith(TIMING_SUFFIXES)} for entry in state["log_history"]
    ]
    return state


def test_log_history_and_trainer_state_are_the_references_with_the_telemetry_on(tmp_path):
    result = run_parity(
        make_tiny_gpt2(),
        padded_lm_data(12),
        tmp_path,
        trainer_kwargs={"eval_dataset": padded_lm_data(4, seed=1)},
        our_trainer_kwargs={"telemetry": Telemetry(peak_flops=1e12)},  # MFU computed too
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=3,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        include_num_input_tokens_seen="non_padding",
        learning_rate=1e-3,
    )
    assert_parity(result)
    assert result.ours.trainer._telemetry.last_summary["whole_run"]["mfu"] > 0
    for ours, reference in zip(result.ours.log_history, result.reference.log_history):
        assert list(ours) == list(reference)
    for checkpoint in ("checkpoint-2", "checkpoint-3"):
        ours = _untimed_state(Path(result.ours.trainer.args.output_dir) / checkpoint / "trainer_state.json")
        reference = _untimed_state(Path(result.reference.trainer.args.output_dir) / checkpoint / "trainer_state.json")
        assert list(ours) == list(reference)
        assert [list(entry) for entry in ours["log_history"]] == [list(entry) for entry in reference["log_history"]]
        for key in ("global_step", "num_input_tokens_seen", "total_flos", "logging_steps", "eval_steps"):
            assert ours[key] == reference[key], key
