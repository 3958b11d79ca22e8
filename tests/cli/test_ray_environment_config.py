"""Ray's RayLightningEnvironment named in a run config (`trainer: plugins: - class_path: ...`) is held to the rule a
built one is: accepted where it describes the run's processes (world size, global, local and node rank equal to
the launcher's), refused before training naming each mismatch otherwise; Ray's Lightning callback named there is
refused naming the supported recipe. Ray's context is stood in for (no Ray Train worker runs here)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray.train
import torch
from ray.train.lightning import RayLightningEnvironment

from hf_lightning.cli.lightning_cli import CLIConfigError, run
from tests.cli.test_lightning_cli import run_config, write_yaml

ENVIRONMENT = {"class_path": "ray.train.lightning.RayLightningEnvironment"}
LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK")


def _ray_context(monkeypatch, world_size: int, rank: int, local_rank: int, node_rank: int) -> None:
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    context = SimpleNamespace(
        get_world_size=lambda: world_size,
        get_world_rank=lambda: rank,
        get_local_rank=lambda: local_rank,
        get_node_rank=lambda: node_rank,
    )
    monkeypatch.setattr(ray.train, "get_context", lambda: context)


def _fit(tmp_path, name: str, trainer_section: dict | None) -> object:
    config = run_config(tmp_path / name, max_steps=2, save_strategy="no", logging_steps=1)
    if trainer_section is not None:
        config["trainer"] = trainer_section
    return run(["fit", "--config", write_yaml(tmp_path / f"{name}.yaml", config)])


def test_a_config_named_environment_describing_the_process_trains_as_without_it(tmp_path, monkeypatch):
    _ray_context(monkeypatch, 1, 0, 0, 0)
    named = _fit(tmp_path, "named", {"plugins": [ENVIRONMENT]})
    without = _fit(tmp_path, "without", None)
    environment = named.trainer.lightning_trainer._accelerator_connector.cluster_environment
    assert isinstance(environment, RayLightningEnvironment)
    assert named.trainer.state.global_step == without.trainer.state.global_step == 2
    ours, theirs = named.trainer.model.state_dict(), without.trainer.model.state_dict()
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key


def test_a_config_named_environment_describing_other_processes_is_refused_before_training(tmp_path, monkeypatch):
    _ray_context(monkeypatch, 2, 1, 1, 0)
    mismatch = r"world size 2 \(the run's arguments: 1\); global rank 1 \(the run's arguments: 0\); local rank 1"
    with pytest.raises(ValueError, match=rf"RayLightningEnvironment, which describes other processes.*{mismatch}"):
        _fit(tmp_path, "other", {"plugins": [ENVIRONMENT]})
    assert not list((tmp_path / "other").glob("checkpoint-*"))


def test_rays_lightning_callback_named_in_a_config_is_refused_naming_the_recipe(tmp_path, monkeypatch):
    _ray_context(monkeypatch, 1, 0, 0, 0)
    callback = {"class_path": "ray.train.lightning.RayTrainReportCallback"}
    with pytest.raises(CLIConfigError, match=r"'callbacks' got RayTrainReportCallback from Ray's Lightning recipe.*"
                       r"prepare_trainer"):  # fmt: skip
        _fit(tmp_path, "callback", {"callbacks": [callback]})
