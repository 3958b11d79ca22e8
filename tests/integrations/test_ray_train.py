"""Ray Train with the transformers-on-Ray recipe (`TorchTrainer` + `prepare_trainer` + `RayTrainReportCallback`),
unchanged, on 2 CPU workers of one local Ray cluster for the module: ours against `transformers.Trainer`, and a
worker lost mid-run under `FailureConfig(max_failures=1)`."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray is not installed: `pip install -e \".[ray]\"` runs these tests")
import ray.train  # noqa: E402, F811
from ray.train import FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

from hf_lightning.checkpoint.global_batch import KEEP_GLOBAL_BATCH_ENV  # noqa: E402
from tests.integrations.ray_cluster import local_ray_cluster  # noqa: E402
from tests.models import DropoutMLP, make_regression_mlp, regression_data  # noqa: E402

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
    if config.get("keep_global_batch"):
        os.environ[KEEP_GLOBAL_BATCH_ENV] = "1"

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
    model = make_regression_mlp(seed=0) if config.get("model") == "mlp" else DropoutMLP(seed=0)
    trainer = Trainer(
        model=model, args=args, train_dataset=regression_data(32), callbacks=[RayTrainReportCallback(), LoseRankOne()]
    )
    if config.get("environment"):
        from ray.train.lightning import RayLightningEnvironment

        trainer.lightning_trainer_overrides = {"plugins": [RayLightningEnvironment()]}
    trainer = prepare_trainer(trainer)
    with _said(os.path.join(out, f"said_{ray.train.get_context().get_world_rank()}.txt")):
        trainer.train()
    if ray.train.get_context().get_world_rank() == 0:
        torch.save(trainer.model.state_dict(), os.path.join(out, "final.pt"))


@contextmanager
def _said(path: str) -> Iterator[None]:
    """What the run says before and while training (stderr and hf_lightning's warnings), written to `path`."""
    records: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record.getMessage())
    hf_logger = logging.getLogger("hf_lightning")
    hf_logger.addHandler(handler)
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            yield
    finally:
        hf_logger.removeHandler(handler)
        Path(path).write_text(err.getvalue() + "\n".join(records))


def train_func_ray_data(config: dict) -> None:
    """Ray's documented Ray Data pattern: the worker's shard (`get_dataset_shard`) as `train_dataset`, read
    through `iter_torch_batches` by the dataloader `prepare_trainer` puts behind `get_train_dataloader`."""
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    if config["side"] == "reference":
        from transformers import Trainer, TrainingArguments
    else:
        from hf_lightning import Trainer, TrainingArguments

    out, rank, seen = config["out"], ray.train.get_context().get_world_rank(), []

    def collate(batch: dict) -> dict[str, torch.Tensor]:
        seen.append([int(i) for i in batch["id"]])
        x = torch.stack([torch.as_tensor(batch[f"x{j}"]) for j in range(4)], dim=-1)
        return {"x": x.float(), "labels": torch.as_tensor(batch["labels"]).float()}

    shard = ray.train.get_dataset_shard("train").iter_torch_batches(batch_size=2, collate_fn=collate)
    args = TrainingArguments(
        output_dir=os.path.join(out, "output"), max_steps=MAX_STEPS, save_steps=SAVE_STEPS, logging_steps=1,
        per_device_train_batch_size=2, learning_rate=0.05, seed=3, report_to="none", use_cpu=True, disable_tqdm=True,
    )
    trainer = Trainer(
        model=make_regression_mlp(seed=0), args=args, train_dataset=shard, callbacks=[RayTrainReportCallback()]
    )
    trainer = prepare_trainer(trainer)
    trainer.train()
    Path(out, f"seen_{rank}.json").write_text(json.dumps(seen))
    if rank == 0:
        torch.save(trainer.model.state_dict(), os.path.join(out, "final.pt"))
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        Path(out, "losses.json").write_text(json.dumps(losses))


def _fit(
    out: Path, side: str, kill: bool = False, workers: int = 2, failures: int = 1, name: str | None = None, **config
) -> ray.train.Result:
    out.mkdir()
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"side": side, "out": str(out), "kill": kill, **config},
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(
            name=name or out.name, storage_path=str(out.parent / "ray"),
            failure_config=FailureConfig(max_failures=failures),
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


@pytest.mark.slow
def test_rays_lightning_environment_describing_the_workers_trains_as_without_it(runs, tmp_path):
    """RayLightningEnvironment in `plugins` on the same 2 workers: accepted (it describes the processes the
    arguments read) and the run ends with the weights of the same run without it."""
    result = _fit(tmp_path / "environment", "ours", environment=True)
    assert result.error is None and result.metrics["step"] == MAX_STEPS
    with_environment, without = _weights(tmp_path, "environment"), _weights(runs["root"], "ours")
    for name in without:
        assert torch.equal(with_environment[name], without[name]), name


def test_a_ray_environment_describing_other_processes_is_refused_before_training(tmp_path, monkeypatch):
    """A RayLightningEnvironment whose Ray context says world size 2, rank 1 in a process launched as one: refused
    before training, naming each mismatch."""
    from types import SimpleNamespace

    from ray.train.lightning import RayLightningEnvironment

    from hf_lightning import Trainer, TrainingArguments

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    context = SimpleNamespace(
        get_world_size=lambda: 2, get_world_rank=lambda: 1, get_local_rank=lambda: 1, get_node_rank=lambda: 0
    )
    monkeypatch.setattr(ray.train, "get_context", lambda: context)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to="none", use_cpu=True)
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=regression_data(4))
    trainer.lightning_trainer_overrides = {"plugins": [RayLightningEnvironment()]}
    mismatch = r"world size 2 \(the run's arguments: 1\); global rank 1 \(the run's arguments: 0\); local rank 1"
    with pytest.raises(ValueError, match=rf"RayLightningEnvironment, which describes other processes.*{mismatch}"):
        trainer.train()
    assert trainer.state.global_step == 0


def _ray_data_fit(out: Path, side: str) -> ray.train.Result:
    rows = regression_data(4 * MAX_STEPS)
    items = [
        {"id": i, "labels": float(row["labels"])} | {f"x{j}": float(v) for j, v in enumerate(row["x"])}
        for i, row in enumerate(rows)
    ]
    out.mkdir()
    return TorchTrainer(
        train_func_ray_data, train_loop_config={"side": side, "out": str(out)},
        scaling_config=ScalingConfig(num_workers=2), datasets={"train": ray.data.from_items(items, override_num_blocks=2)},
        run_config=RunConfig(name=out.name, storage_path=str(out.parent / "ray")),
    ).fit()


def _reference_ray_data_fit(out: Path) -> ray.train.Result:
    """The reference's side of `_ray_data_fit`, tried once more when it lost the race of its own recipe on one disk:
    both workers write into one `output_dir`, and rank 1's `RayTrainReportCallback` copies the step's checkpoint
    folder while rank 0 may still hold a temporary file in it (`shutil.Error`, "No such file or directory" on a
    `.tmp` name). Our saves stage into a scratch folder and rename it, so only the reference's side is retried."""
    try:
        return _ray_data_fit(out, "reference")
    except ray.train.WorkerGroupError as error:
        if "No such file or directory" not in str(error) or "/.tmp" not in str(error):
            raise
    shutil.rmtree(out)
    return _ray_data_fit(out, "reference")


@pytest.mark.slow
def test_ray_data_shards_train_through_get_train_dataloader_as_the_reference(tmp_path):
    """Each worker trains on its Ray Data shard (`get_dataset_shard` -> `iter_torch_batches`, read through the
    dataloader `prepare_trainer` returns from `get_train_dataloader`): the shards are disjoint and cover the data, and
    the steps, losses and final weights are the reference's on the same recipe."""
    ours, reference = _ray_data_fit(tmp_path / "ours", "ours"), _reference_ray_data_fit(tmp_path / "reference")
    assert ours.error is None and ours.metrics["step"] == reference.metrics["step"] == MAX_STEPS
    for side in ("ours", "reference"):
        shards = [json.loads((tmp_path / side / f"seen_{rank}.json").read_text()) for rank in (0, 1)]
        ids = [i for shard in shards for batch in shard[:MAX_STEPS] for i in batch]
        assert [len(shard) >= MAX_STEPS for shard in shards] == [True, True], side
        assert sorted(ids) == list(range(4 * MAX_STEPS)), side  # disjoint shards covering the data
    ours_losses = json.loads((tmp_path / "ours" / "losses.json").read_text())
    reference_losses = json.loads((tmp_path / "reference" / "losses.json").read_text())
    assert len(ours_losses) == len(reference_losses) == MAX_STEPS
    assert ours_losses == pytest.approx(reference_losses, rel=1e-5)
    ours_weights, reference_weights = _weights(tmp_path, "ours"), _weights(tmp_path, "reference")
    for name in reference_weights:
        torch.testing.assert_close(ours_weights[name], reference_weights[name], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_fewer_workers_resume_through_the_resharding_path_keeping_the_global_batch(tmp_path):
    """A 2-worker run loses rank 1 at step 6 with no restart left (`max_failures=0`), after reporting step 4; the
    job run again under the same name on 1 worker (Ray hands it the step-4 report through
    `ray.train.get_checkpoint()`) continues from it with `HF_LIGHTNING_KEEP_GLOBAL_BATCH=1` (accumulation 1 -> 2),
    says so, and ends with the uninterrupted 2-worker run's weights."""
    _fit(tmp_path / "two", "ours", model="mlp")
    with pytest.raises(ray.train.TrainingFailedError):
        _fit(tmp_path / "lost", "ours", kill=True, failures=0, model="mlp")
    one = _fit(tmp_path / "one", "ours", workers=1, name="lost", model="mlp", keep_global_batch=True)
    assert one.error is None and one.metrics["step"] == MAX_STEPS
    said = (tmp_path / "one" / "said_0.txt").read_text()
    step_four = next(checkpoint for checkpoint, metrics in one.best_checkpoints if metrics["step"] == SAVE_STEPS)
    folder = Path(step_four.path, "checkpoint")
    assert f"continuing from Ray's checkpoint {folder}" in said, said
    assert f"{folder} was saved by 2 process(es) and this run has 1" in said, said
    assert f"{KEEP_GLOBAL_BATCH_ENV}=1: gradient_accumulation_steps 1 -> 2" in said, said
    steps = [int(line.split(":")[1]) for line in (tmp_path / "one" / "steps.txt").read_text().split()]
    assert steps == list(range(SAVE_STEPS + 1, MAX_STEPS + 1))
    resized, uninterrupted = _weights(tmp_path, "one"), _weights(tmp_path, "two")
    for name in uninterrupted:
        torch.testing.assert_close(resized[name], uninterrupted[name], rtol=0, atol=1e-6)


def test_rays_lightning_recipe_is_refused_naming_the_supported_one(tmp_path):
    """RayDDPStrategy / RayFSDPStrategy / Lightning's RayTrainReportCallback would replace the strategy and
    checkpoints the engine builds (docs/design.md, "Ray"): refused before training, naming `prepare_trainer` and
    transformers' `RayTrainReportCallback`."""
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
        ("strategy", built(ray_lightning.RayDeepSpeedStrategy), "RayDeepSpeedStrategy"),
        ("callbacks", [built(ray_lightning.RayTrainReportCallback)], "RayTrainReportCallback"),
    ):
        with pytest.raises(ValueError, match=rf"override '{key}' got {name} from Ray's Lightning recipe.*{supported}"):
            trainer.lightning_trainer_overrides = {key: value}
    with pytest.raises(ValueError, match=rf"callbacks= got RayTrainReportCallback.*{supported}"):
        Trainer(
            model=DropoutMLP(), args=args, train_dataset=regression_data(4),
            callbacks=[built(ray_lightning.RayTrainReportCallback)],
        )
