"""Ray Train with the transformers-on-Ray recipe (`TorchTrainer` + `prepare_trainer` + `RayTrainReportCallback`),
unchanged, on 2 CPU workers of one local Ray cluster for the module: ours against `transformers.Trainer`, and a
worker lost mid-run under `FailureConfig(max_failures=1)`."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray is not installed: `pip install -e \".[ray]\"` runs these tests")
import ray.train  # noqa: E402, F811
from ray.train import FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

from tests.integrations.ray_cluster import local_ray_cluster  # noqa: E402
from tests.models import DropoutMLP, regression_data  # noqa: E402

RUN_SECONDS = 300
MAX_STEPS, SAVE_STEPS, KILL_STEP = 8, 4, 6
POLL_SECONDS = 0.5


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    """One local Ray cluster for the module; its workers import this checkout's `tests` package."""
    # Ray's controller gathers the workers' reports (and registers their checkpoints) when it polls them.
    with local_ray_cluster(RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=str(POLL_SECONDS)):
        yield


@pytest.fixture(autouse=True)
def bounded():
    def expire(signum, frame):
        raise TimeoutError(f"a Ray Train run ran over {RUN_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(RUN_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def train_func(config: dict) -> None:
    """The documented recipe, as a user writes it: build the trainer, `prepare_trainer`, `train()`."""
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    if config["side"] == "reference":
        from transformers import Trainer, TrainerCallback, TrainingArguments
    else:
        from hf_lightning import Trainer, TrainingArguments
        from hf_lightning.callbacks import TrainerCallback

    out, kill = config["out"], config.get("kill", False)

    class LoseRankOne(TrainerCallback):
        """Records the steps of each attempt; rank 1 dies at KILL_STEP of the first attempt (a marker file), once
        Ray's controller has polled the step-4 report (a report Ray has not gathered is lost with its worker)."""

        marker = os.path.join(out, "killed")

        def on_train_begin(self, args, state, control, **kwargs):
            self.attempt = 2 if os.path.exists(self.marker) else 1

        def on_step_end(self, args, state, control, **kwargs):
            if args.process_index == 0:
                with open(os.path.join(out, "steps.txt"), "a") as f:
                    f.write(f"{self.attempt}:{state.global_step}\n")
            if kill and self.attempt == 1 and args.process_index == 1 and state.global_step == KILL_STEP:
                Path(self.marker).write_text("rank 1")
                time.sleep(6 * POLL_SECONDS)
                os._exit(1)

    args = TrainingArguments(
        output_dir=os.path.join(out, "output"), max_steps=MAX_STEPS, save_steps=SAVE_STEPS, logging_steps=1,
        per_device_train_batch_size=2, learning_rate=0.05, seed=3, report_to="none", use_cpu=True, disable_tqdm=True,
    )
    trainer = Trainer(
        model=DropoutMLP(seed=0), args=args, train_dataset=regression_data(32),
        callbacks=[RayTrainReportCallback(), LoseRankOne()],
    )
    trainer = prepare_trainer(trainer)
    trainer.train()
    if ray.train.get_context().get_world_rank() == 0:
        torch.save(trainer.model.state_dict(), os.path.join(out, "final.pt"))


def _fit(out: Path, side: str, kill: bool = False) -> ray.train.Result:
    out.mkdir()
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"side": side, "out": str(out), "kill": kill},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=out.name, storage_path=str(out.parent / "ray"), failure_config=FailureConfig(max_failures=1)
        ),
    )
    return trainer.fit()


def _reports_are_complete_folders_of_their_step(result) -> list[int]:
    steps = []
    for checkpoint, metrics in result.best_checkpoints:
        folder = Path(checkpoint.path, "checkpoint")
        assert json.loads((folder / "trainer_state.json").read_text())["global_step"] == metrics["step"]
        steps.append(metrics["step"])
    return steps


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray_train")
    return {
        "reference": _fit(root / "reference", "reference"),
        "ours": _fit(root / "ours", "ours"),
        "killed": _fit(root / "killed", "ours", kill=True),
        "root": root,
    }


def _weights(root: Path, name: str) -> dict[str, torch.Tensor]:
    return torch.load(root / name / "final.pt", weights_only=True)


@pytest.mark.slow
def test_the_recipe_runs_unchanged_and_reports_the_folder_of_its_step(runs):
    """Every report carries the complete folder of the step its metrics name; the weights are the reference's."""
    assert _reports_are_complete_folders_of_their_step(runs["ours"]) == [4, 8]
    assert _reports_are_complete_folders_of_their_step(runs["reference"]) == [4, 8]
    for checkpoint, _ in runs["ours"].best_checkpoints:
        assert (Path(checkpoint.path, "checkpoint") / "hf_lightning_complete.json").is_file()
    assert runs["ours"].metrics["loss"] == pytest.approx(runs["reference"].metrics["loss"], rel=1e-5)
    ours, reference = _weights(runs["root"], "ours"), _weights(runs["root"], "reference")
    assert ours.keys() == reference.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], reference[name], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_lost_worker_is_restarted_and_continues_from_the_last_report(runs):
    """Rank 1 dies at step 6; Ray restarts the group; `train()` (no resume argument) continues from Ray's step-4
    checkpoint and ends bit-exact with the uninterrupted run."""
    root = runs["root"]
    assert (root / "killed" / "killed").read_text() == "rank 1"
    attempts = (root / "killed" / "steps.txt").read_text().split()
    second = [int(line.split(":")[1]) for line in attempts if line.startswith("2:")]
    assert second == list(range(SAVE_STEPS + 1, MAX_STEPS + 1)), attempts
    assert _reports_are_complete_folders_of_their_step(runs["killed"]) == [4, 8]
    killed, uninterrupted = _weights(root, "killed"), _weights(root, "ours")
    for name in uninterrupted:
        assert torch.equal(killed[name], uninterrupted[name]), name


def test_rays_lightning_recipe_is_refused_naming_the_supported_one(tmp_path):
    """RayDDPStrategy / RayLightningEnvironment / Lightning's RayTrainReportCallback would replace the strategy,
    environment and checkpoints the engine builds (docs/design.md, "Ray"): refused before training, naming
    `prepare_trainer` and transformers' `RayTrainReportCallback`."""
    from ray.train import lightning as ray_lightning

    from hf_lightning import Trainer, TrainingArguments

    def built(cls):
        return cls.__new__(cls)  # constructed outside a Ray Train worker: the type is what is checked

    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to="none", use_cpu=True)
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=regression_data(4))
    supported = r"ray\.train\.huggingface\.transformers\.prepare_trainer\(trainer\).*RayTrainReportCallback\(\)"
    for key, value, name in (
        ("strategy", built(ray_lightning.RayDDPStrategy), "RayDDPStrategy"),
        ("strategy", built(ray_lightning.RayFSDPStrategy), "RayFSDPStrategy"),
        ("plugins", [built(ray_lightning.RayLightningEnvironment)], "RayLightningEnvironment"),
        ("callbacks", [built(ray_lightning.RayTrainReportCallback)], "RayTrainReportCallback"),
    ):
        with pytest.raises(ValueError, match=rf"override '{key}' got {name} from Ray's Lightning recipe.*{supported}"):
            trainer.lightning_trainer_overrides = {key: value}
    with pytest.raises(ValueError, match=rf"callbacks= got RayTrainReportCallback.*{supported}"):
        Trainer(
            model=DropoutMLP(), args=args, train_dataset=regression_data(4),
            callbacks=[built(ray_lightning.RayTrainReportCallback)],
        )
