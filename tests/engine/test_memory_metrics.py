"""Memory metrics (`skip_memory_metrics=False`) against transformers.Trainer: same keys, in the same order,
at the same places (EVAL-2.13, R6.6). Values depend on the machine: only their types are checked.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from hf_lightning import TrainingArguments
from hf_lightning.engine.memory import TrainerMemoryTracker
from hf_lightning.trainer.trainer import HFLightningTrainer
from tests.models import make_regression_mlp, regression_data

MEMORY_KEY_PARTS = ("_mem_cpu_", "_mem_gpu_", "before_init_mem_")


def _memory_keys(metrics: dict) -> list[str]:
    return [key for key in metrics if any(part in key for part in MEMORY_KEY_PARTS)]


def _both(tmp_path, **kwargs):
    """A reference trainer and ours on copies of one model, with the same arguments."""
    common = {
        "use_cpu": True,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "skip_memory_metrics": False,
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4,
        "num_train_epochs": 1,
        **kwargs,
    }
    model, train, evaluation = make_regression_mlp(), regression_data(12), regression_data(6, seed=1)
    reference = transformers.Trainer(
        model=copy.deepcopy(model),
        args=transformers.TrainingArguments(output_dir=str(tmp_path / "reference"), **common),
        train_dataset=train,
        eval_dataset=evaluation,
    )
    ours = HFLightningTrainer(
        model=copy.deepcopy(model),
        args=TrainingArguments(output_dir=str(tmp_path / "ours"), **common),
        train_dataset=train,
        eval_dataset=evaluation,
    )
    return reference, ours


def _assert_memory_values(metrics: dict) -> None:
    keys = _memory_keys(metrics)
    assert keys, "no memory keys"
    for key in keys:
        assert type(metrics[key]) is int, (key, metrics[key])
        if key.endswith("_peaked_delta") or key.startswith("before_init_"):
            assert metrics[key] >= 0, key


def _run(trainer, calls: list[str]) -> dict[str, dict]:
    results = {}
    for call in calls:
        if call == "train":
            results[call] = trainer.train().metrics
            results["train_log"] = trainer.state.log_history[-1]
        elif call == "evaluate":
            results[call] = trainer.evaluate()
        else:
            results[call] = trainer.predict(trainer.eval_dataset).metrics
    return results


@pytest.mark.parametrize(
    "calls",
    [["train", "evaluate", "predict"], ["evaluate", "train", "predict"], ["predict", "evaluate"]],
    ids=["train-first", "evaluate-first", "predict-first"],
)
def test_metric_keys_equal_the_reference(tmp_path, calls):
    reference, ours = _both(tmp_path)
    reference_results, our_results = _run(reference, calls), _run(ours, calls)
    for name, reference_metrics in reference_results.items():
        assert list(our_results[name]) == list(reference_metrics), name
        _assert_memory_values(our_results[name])
    # The `init` keys go to whichever stage reports first, once.
    first = calls[0]
    assert "before_init_mem_cpu" in our_results[first] and "init_mem_cpu_alloc_delta" in our_results[first]
    for name in calls[1:]:
        assert "before_init_mem_cpu" not in our_results[name]
    stage = {"train": "train", "evaluate": "eval", "predict": "test"}
    for name in calls:
        assert f"{stage[name]}_mem_cpu_peaked_delta" in our_results[name]
    if not torch.cuda.is_available():
        assert not any("_gpu" in key for name in calls for key in our_results[name])


def test_evaluation_inside_train_is_not_tracked_separately(tmp_path):
    reference, ours = _both(tmp_path, eval_strategy="steps", eval_steps=1)
    reference.train()
    ours.train()
    our_logs, reference_logs = ours.state.log_history, reference.state.log_history
    assert [list(entry) for entry in our_logs] == [list(entry) for entry in reference_logs]
    evaluations = [entry for entry in our_logs if "eval_loss" in entry]
    assert len(evaluations) == 3 and not any(_memory_keys(entry) for entry in evaluations)
    assert "train_mem_cpu_alloc_delta" in our_logs[-1]


def test_memory_keys_absent_by_default(tmp_path):
    _, ours = _both(tmp_path, skip_memory_metrics=True)
    assert not _memory_keys(ours.train().metrics) and not _memory_keys(ours.evaluate())


def test_tracker_measures_an_allocation_and_derives_stages():
    tracker = TrainerMemoryTracker(skip_memory_metrics=False)

    def __init__():  # noqa: N807 - the reference derives the stage from the calling method's name
        tracker.start()
        tracker.stop_and_update_metrics()

    def evaluate():
        tracker.start()
        block = torch.ones(64 * 1024 * 1024, dtype=torch.uint8)  # 64 MiB, touched
        metrics: dict = {}
        tracker.stop_and_update_metrics(metrics)
        del block
        return metrics

    __init__()
    metrics = evaluate()
    devices = ["cpu", "gpu"] if torch.cuda.is_available() else ["cpu"]
    expected = [
        f"{stage}_mem_{device}_{kind}_delta"
        for stage in ("init", "eval")
        for kind in ("alloc", "peaked")
        for device in devices
    ] + [f"before_init_mem_{device}" for device in devices]
    assert list(metrics) == expected
    # The block is alive at the end of the stage: it shows as allocated, not as peaked.
    assert metrics["eval_mem_cpu_alloc_delta"] >= 48 * 1024 * 1024

    def helper():
        tracker.start()

    with pytest.raises(ValueError, match="was called from helper"):
        helper()


def test_translation_honours_memory_metrics():
    from hf_lightning.translation.translate import translate

    plan = translate(TrainingArguments(output_dir="unused", use_cpu=True, skip_memory_metrics=False))
    note = plan.notes["skip_memory_metrics"]
    assert note.status == "honoured" and "memory.py" in note.how
