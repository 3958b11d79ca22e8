"""torchmetrics objects as compute_metrics under `torchrun --nproc_per_node=2` (gloo, CPU): the values equal a
single process's exactly, the samples the distributed sampler repeats in the last round update no metric, and
two evaluate() calls give the same values. The single-process values equal the reference Trainer's with numpy.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from tests.distributed.eval_script import EVAL_BATCH_SIZE, NUM_SAMPLES, TaggingData, make_model, pad_collate
from tests.distributed.launching import free_port
from tests.distributed.metrics_eval_script import run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "metrics_eval_script.py"
WORLD_SIZE = 2
# A 2-process torchrun launch (about a minute on a loaded machine).
pytestmark = pytest.mark.slow
VALUE_KEYS = ("eval_token_accuracy", "eval_token_f1", "eval_sequences")


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    output_dir = tmp_path_factory.mktemp("distributed_metric_objects")
    env = {
        k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")
    }
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD_SIZE}",
        f"--master_port={free_port()}", str(SCRIPT), str(output_dir),
    ]  # fmt: skip
    process = subprocess.run(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300
    )
    assert process.returncode == 0, f"launch failed:\n{process.stdout[-6000:]}"
    return [pickle.loads((output_dir / f"rank{rank}.pkl").read_bytes()) for rank in range(WORLD_SIZE)]


@pytest.fixture(scope="module")
def single_process(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run(str(tmp_path_factory.mktemp("single_process_metric_objects")))


def _values(metrics: dict, prefix: str = "eval") -> dict:
    return {key.replace("eval", prefix, 1): metrics[key.replace("eval", prefix, 1)] for key in VALUE_KEYS}


def test_two_processes_give_the_single_process_values_exactly(launch, single_process):
    expected = _values(single_process["eval_metrics"][0])
    assert expected["eval_sequences"] == NUM_SAMPLES
    for rank, result in enumerate(launch):
        assert result["world_size"] == WORLD_SIZE, rank
        first, second = result["eval_metrics"]
        # Exactly, and every sample once: 37 sequences, not the 40 the sampler read.
        assert _values(first) == expected, rank
        assert _values(second) == expected, rank
        assert _values(result["test_metrics"], "test") == _values(single_process["test_metrics"], "test")
        assert _values(result["seq2seq_eval_metrics"]) == expected, rank
        # predict() still returns every prediction, once.
        assert result["predictions"].shape == single_process["predictions"].shape == (NUM_SAMPLES, 9)
    # eval_loss keeps the reference's distributed weighting of the padded last round (tests/evaluation/
    # test_distributed_eval.py); it is the same on every rank.
    assert launch[0]["eval_metrics"][0]["eval_loss"] == launch[1]["eval_metrics"][0]["eval_loss"]


def test_single_process_values_equal_the_reference_with_numpy(single_process, tmp_path):
    def numpy_metrics(eval_prediction):
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        real = labels != -100
        f1s = []
        for cls in range(3):
            tp = np.sum((predictions[real] == cls) & (labels[real] == cls))
            fp = np.sum((predictions[real] == cls) & (labels[real] != cls))
            fn = np.sum((predictions[real] != cls) & (labels[real] == cls))
            f1s.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
        return {
            "token_accuracy": float((predictions[real] == labels[real]).mean()),
            "token_f1": float(np.mean(f1s)),
            "sequences": float(len(labels)),
        }

    reference = transformers.Trainer(
        model=make_model(),
        args=transformers.TrainingArguments(
            output_dir=str(tmp_path),
            use_cpu=True,
            per_device_eval_batch_size=EVAL_BATCH_SIZE,
            report_to="none",
        ),
        data_collator=pad_collate,
        compute_metrics=numpy_metrics,
        preprocess_logits_for_metrics=lambda logits, labels: torch.argmax(logits, -1),
    )
    expected = _values(reference.evaluate(TaggingData()))
    ours = _values(single_process["eval_metrics"][0])
    assert ours.keys() == expected.keys()
    for key, value in expected.items():
        assert abs(ours[key] - value) < 1e-6, (key, ours[key], value)
