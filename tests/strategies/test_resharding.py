"""Checkpoints outlive their layout (CPU, gloo): a checkpoint written by one process, DDP, FSDP1 / FSDP2 (full or
sharded, on 2 processes or 1) or tensor parallelism resumes on every other of them and continues the uninterrupted
run; `save_model()` after a sharded run and `consolidate` write folders `from_pretrained` loads bit for bit.

Each configuration runs its uninterrupted source once (tests/distributed/reshard_script.py, checkpoint at step 4
of 8), then resumes from every source's checkpoint; the launches are shared by the whole module. The global batch
is the same everywhere, so all configurations compute the same run; the tolerance is what two uninterrupted runs
on different configurations agree to (their float reductions differ).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.distributed.launching import free_port
from tests.distributed.reshard_script import CONFIGS, DROPOUT_SOURCE, MAX_STEPS, SAVE_STEPS

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "reshard_script.py"
# Two uninterrupted runs on different configurations agree to this (test_uninterrupted_runs_agree pins it).
TOLERANCE = dict(rel=1e-6, abs=1e-6)
KEYS = ("loss", "grad_norm", "learning_rate")
# How each configuration is launched: plain python, or torchrun with this many processes.
LAUNCHES = {"python": ["single"], 1: ["fsdp2_sharded_1"], 2: [c for c, (n, _) in CONFIGS.items() if n == 2]}


def _launch(processes: object, phase: str, configs: list[str], out_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    command = [sys.executable]
    if processes != "python":
        command += ["-m", "torch.distributed.run", f"--nproc_per_node={processes}", f"--master_port={free_port()}"]
    command += [str(SCRIPT), phase, ",".join(configs), str(out_dir)]
    completed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, (phase, configs, completed.stdout[-3000:], completed.stderr[-5000:])
    (out_dir / f"{phase}-{processes}.log").write_text(completed.stdout + completed.stderr)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> tuple[Path, dict, dict]:
    """(out_dir, sources by config, resumes by target then source)."""
    out_dir = tmp_path_factory.mktemp("reshard")
    for phase in ("source", "resume"):
        for processes, configs in LAUNCHES.items():
            _launch(processes, phase, configs, out_dir)
    read = lambda phase, config: json.loads((out_dir / f"{phase}-{config}.json").read_text())  # noqa: E731
    return out_dir, {c: read("source", c) for c in CONFIGS}, {c: read("resume", c) for c in CONFIGS}


def _entries(run: dict, first_step: int = 1) -> dict[int, dict]:
    return {e["step"]: e for e in run["log_history"] if "loss" in e and e["step"] >= first_step}


def _assert_same(run: dict, expected: dict, first_step: int, name: object) -> None:
    ours, theirs = _entries(run, first_step), _entries(expected, first_step)
    assert sorted(ours) == list(range(first_step, MAX_STEPS + 1)) == sorted(theirs), name
    for step, entry in theirs.items():
        for key in KEYS:
            assert ours[step][key] == pytest.approx(entry[key], **TOLERANCE), (name, step, key)
    assert set(run["weights"]) == set(expected["weights"]), name
    for key, values in expected["weights"].items():
        assert run["weights"][key] == pytest.approx(values, **TOLERANCE), (name, key)


@pytest.mark.slow
@pytest.mark.parametrize("config", [c for c in CONFIGS if c != "single"])
def test_uninterrupted_runs_agree(matrix, config):
    """The tolerance of this module: every configuration's uninterrupted run equals the one-process run."""
    _, sources, _ = matrix
    _assert_same(sources[config]["run"], sources["single"]["run"], 1, config)


@pytest.mark.slow
@pytest.mark.parametrize("target", list(CONFIGS))
@pytest.mark.parametrize("source", list(CONFIGS))
def test_a_checkpoint_resumes_exactly_on_every_layout(matrix, source, target):
    """Steps 5-8 (loss, grad norm, learning rate) and the final weights of the resumed run, which started from
    other initial weights, equal the target configuration's uninterrupted run."""
    _, sources, resumes = matrix
    resumed = resumes[target][source]
    _assert_same(resumed, sources[target]["run"], SAVE_STEPS + 1, (source, target))
    # Only the resumed steps ran: the first entries came back from the checkpoint's trainer_state.json.
    assert resumed["log_history"][-1]["train_loss"] == pytest.approx(
        sum(e["loss"] for s, e in _entries(resumed, SAVE_STEPS + 1).items()) / (MAX_STEPS - SAVE_STEPS), rel=1e-4
    )


@pytest.mark.slow
def test_dropout_resumes_exactly_on_as_many_processes_and_by_the_documented_rule_on_fewer(matrix):
    """The RNG rule: on as many processes (DDP 2 -> FSDP2 2) each process restores its own RNG file, so the
    dropout run continues exactly; on one process it restores the saving run's process 0 (warned), so the
    continuation differs from both uninterrupted runs only in the random draws."""
    out_dir, sources, resumes = matrix
    uninterrupted = sources[DROPOUT_SOURCE]["dropout"]
    _assert_same(resumes["fsdp2_full_2"]["dropout"], uninterrupted, SAVE_STEPS + 1, "dropout 2 -> 2")
    # Dropout really draws: the dropout run is not the run without it.
    assert _entries(uninterrupted)[1]["loss"] != pytest.approx(_entries(sources[DROPOUT_SOURCE]["run"])[1]["loss"])
    single = _entries(resumes["single"]["dropout"], SAVE_STEPS + 1)
    assert single[SAVE_STEPS + 1]["loss"] != pytest.approx(_entries(uninterrupted)[SAVE_STEPS + 1]["loss"], rel=1e-6)
    log = (out_dir / "resume-python.log").read_text()
    assert "was saved by 2 process(es) and this run has 1" in log


def _loaded_weights(folder: Path) -> dict[str, list[float]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    return {key: value.to(torch.float64).flatten().tolist() for key, value in model.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize("config", list(CONFIGS))
def test_save_model_writes_weights_from_pretrained_loads_bit_for_bit(matrix, config):
    """After every run, sharded FSDP included, `save_model()` writes model.safetensors and config.json."""
    out_dir, sources, _ = matrix
    final = out_dir / "source" / config / "final"
    assert (final / "model.safetensors").is_file() and (final / "config.json").is_file(), sorted(os.listdir(final))
    assert _loaded_weights(final) == sources[config]["run"]["weights"]


@pytest.mark.slow
@pytest.mark.parametrize("config", list(CONFIGS))
def test_consolidate_writes_a_folder_from_pretrained_loads_bit_for_bit(matrix, config):
    """`hf-lightning consolidate CHECKPOINT OUT` of the step-8 checkpoint: the run's final weights, exactly."""
    out_dir, sources, _ = matrix
    checkpoint = out_dir / "source" / config / f"checkpoint-{MAX_STEPS}"
    target = out_dir / "consolidated" / config
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    completed = subprocess.run(
        [sys.executable, "-m", "hf_lightning.cli.main", "consolidate", str(checkpoint), str(target)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert not any(name.startswith(("optimizer", "rng_state", "trainer_state")) for name in os.listdir(target))
    assert _loaded_weights(target) == sources[config]["run"]["weights"]


@pytest.mark.slow
def test_checkpoints_keep_accelerates_layout(matrix):
    """The reference's file names per layout; a sharded checkpoint adds only the model's config beside its shards."""
    out_dir, _, _ = matrix
    listing = {config: set(os.listdir(out_dir / "source" / config / f"checkpoint-{SAVE_STEPS}")) for config in CONFIGS}
    for config in ("fsdp1_sharded_2", "fsdp2_sharded_2", "fsdp2_sharded_1"):
        assert {"pytorch_model_fsdp_0", "optimizer_0", "config.json"} <= listing[config], config
        assert not listing[config] & {"model.safetensors", "optimizer.pt", "optimizer.bin"}, config
    for config in ("fsdp1_full_2", "fsdp2_full_2"):
        assert {"pytorch_model_fsdp.bin", "optimizer.bin", "model.safetensors"} <= listing[config], config
    for config in ("single", "ddp_2", "tp_2"):
        assert {"model.safetensors", "optimizer.pt"} <= listing[config], config
