"""DeepSpeed through Lightning: the engine path of HFLightningModule against the reference's DeepSpeed runs.

The run-level test trains a tiny BERT with `transformers.Trainer` + DeepSpeed and with `HFLightningTrainer` +
`HFDeepSpeedStrategy` in one subprocess (this file run as a script), on DeepSpeed's CPU accelerator with gloo:
ZeRO-1/2/3, the trainer's or the config's optimizer and scheduler, checkpoints, and a resume. Both sides use
the real DeepSpeed engine. What the subprocess changes to run without CUDA, and why:
- Lightning's `DeepSpeedStrategy` refuses non-CUDA accelerators (`setup_environment`) and CPU devices (no device
  index); both guards are lifted there, and hf_lightning's own refusal is passed by translating the arguments
  for a CUDA machine, then running the plan on Lightning's CPU accelerator;
- DeepSpeed compiles a shared-memory all-reduce extension on first use (minutes); one process never needs it, so
  `build_shm_op` returns None there;
- the config optimizers set `torch_adam: true` (else DeepSpeed JIT-compiles its fused Adam), on both sides.
The unit tests below check the routing to the engine with a recording engine (no deepspeed import).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hf_lightning.strategies.deepspeed.strategy import (
    EngineOptimizerView,
    EnginePrecision,
    EngineSchedulerView,
)

ROOT = Path(__file__).resolve().parents[2]

AUTO_ADAMW = {
    "type": "AdamW",
    "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto", "torch_adam": True},
}
SCENARIOS = {
    # the trainer's optimizer and schedule (stepped by our module), ZeRO-2, checkpoints every 2 steps
    "zero2_trainer_optim": {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}},
    # DeepSpeed's optimizer and scheduler (both stepped by the engine), ZeRO-3 with the 16-bit gather on save
    "zero3_config_optim_sched": {
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
            "stage3_gather_16bit_weights_on_model_save": True,
        },
        "optimizer": AUTO_ADAMW,
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": "auto",
                "warmup_max_lr": "auto",
                "warmup_num_steps": "auto",
                "total_num_steps": "auto",
            },
        },
    },
    # DeepSpeed's optimizer with the trainer's schedule, built and stepped by the engine, ZeRO-1
    "zero1_config_optim": {"zero_optimization": {"stage": 1}, "optimizer": AUTO_ADAMW},
}
BASE_CONFIG = {
    "train_micro_batch_size_per_gpu": "auto",
    "train_batch_size": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
}
RUN_ARGS = {
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 2,
    "max_steps": 4,
    "learning_rate": 1e-3,
    "warmup_steps": 1,
    "weight_decay": 0.01,
    "max_grad_norm": 0.5,
    "logging_steps": 1,
    "save_strategy": "steps",
    "save_steps": 2,
    "report_to": "none",
    "disable_tqdm": True,
}
SPEED_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second")


# ---------------------------------------------------------------- the subprocess


def _listing(folder: Path) -> dict:
    """Checkpoint folders -> their files; the engine's `global_step*` folders -> their files too."""
    result = {}
    for checkpoint in sorted(p for p in folder.iterdir() if p.name.startswith("checkpoint-")):
        files = {}
        for entry in sorted(checkpoint.iterdir()):
            files[entry.name] = sorted(os.listdir(entry)) if entry.is_dir() else None
        result[checkpoint.name] = files
    return result


def _weights(checkpoint: Path) -> dict:
    from safetensors.torch import load_file

    return {name: tensor.float() for name, tensor in load_file(str(checkpoint / "model.safetensors")).items()}


def _max_abs_diff(first: dict, second: dict) -> float:
    assert first.keys() == second.keys()
    return max(float((first[name] - second[name]).abs().max()) for name in first)


def _lift_cuda_guards() -> None:
    """See the module docstring: run DeepSpeed through Lightning on its CPU accelerator, in this process only."""
    import importlib

    import lightning.pytorch.strategies.deepspeed as lightning_deepspeed
    from lightning.pytorch.strategies import DDPStrategy

    from hf_lightning.strategies.deepspeed.strategy import HFDeepSpeedStrategy

    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    lightning_deepspeed._validate_device_index_selection = lambda devices: None
    HFDeepSpeedStrategy.setup_environment = DDPStrategy.setup_environment


def _build(side: str, config: dict, output_dir: Path, **extra_args) -> object:
    """The reference's or our trainer on the tiny BERT, with the DeepSpeed `config` (see the module docstring)."""
    import transformers

    from hf_lightning import TrainingArguments
    from hf_lightning.trainer.trainer import HFLightningTrainer
    from hf_lightning.translation.environment import Environment
    from tests.models import classification_data, make_tiny_bert_classifier

    model, data = make_tiny_bert_classifier(), classification_data(12)
    arguments = {"output_dir": str(output_dir), "deepspeed": config, **RUN_ARGS, **extra_args}
    if side == "ref":
        args = transformers.TrainingArguments(use_cpu=True, **arguments)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    else:
        # bf16 is validated against the machine (CPU here: use_cpu=True), then translated as for a CUDA GPU.
        bf16 = bool(extra_args.get("bf16"))
        args = TrainingArguments(**arguments, use_cpu=True) if bf16 else TrainingArguments(**arguments)
        args.use_cpu = False
        gpu = Environment(
            cuda_available=True, cuda_device_count=1, installed_packages=frozenset({"deepspeed"})
        )
        original_detect = Environment.detect
        Environment.detect = classmethod(lambda cls: gpu)
        try:
            trainer = HFLightningTrainer(model=model, args=args, train_dataset=data)
        finally:
            Environment.detect = original_detect
        trainer.plan = dataclasses.replace(
            trainer.plan, lightning=dataclasses.replace(trainer.plan.lightning, accelerator="cpu")
        )
    return trainer


def _construction_flags(trainer) -> dict:
    return {
        "is_deepspeed_enabled": trainer.is_deepspeed_enabled,
        "deepspeed_is_none": trainer.deepspeed is None,
        "place_model_on_device": trainer.place_model_on_device,
    }


def _eval_metrics(trainer) -> dict:
    from tests.models import classification_data

    metrics = trainer.evaluate(classification_data(6, seed=1))
    return {key: value for key, value in metrics.items() if "runtime" not in key and "per_second" not in key}


def _run(
    side: str, config: dict, output_dir: Path, resume: str | None = None, evaluate: bool = False, **extra_args
) -> dict:
    trainer = _build(side, config, output_dir, **extra_args)
    constructed = _construction_flags(trainer)
    trainer.train(resume_from_checkpoint=resume)
    history = [{k: v for k, v in entry.items() if k not in SPEED_KEYS} for entry in trainer.state.log_history]
    return {
        "constructed": constructed,
        "log_history": history,
        "checkpoints": _listing(output_dir),
        "optimizer": type(trainer.optimizer).__name__,
        "scheduler": type(trainer.lr_scheduler).__name__,
        "engine": type(trainer.model_wrapped).__name__,
        "eval_metrics": _eval_metrics(trainer) if evaluate else None,
    }


def _evaluate_before_train(side: str, config: dict, output_dir: Path) -> dict:
    """evaluate() before any train(): the metrics, or the error's type and message."""
    trainer = _build(side, config, output_dir)
    try:
        return {"metrics": _eval_metrics(trainer)}
    except ValueError as error:
        return {"error": str(error)}


def _main_followups(out_dir: Path, results: dict) -> None:
    """Resume from the engine's files only, bf16 evaluation after training, evaluation before training."""
    import copy
    import shutil

    name = "zero2_trainer_optim"
    config = {**copy.deepcopy(BASE_CONFIG), **copy.deepcopy(SCENARIOS[name])}
    engine_only = out_dir / "resumed_engine_only"
    shutil.copytree(out_dir / name / "ours" / "checkpoint-2", engine_only / "checkpoint-2")
    (engine_only / "checkpoint-2" / "model.safetensors").unlink()
    results["resumed_engine_only"] = _run(
        "ours", config, engine_only, resume=str(engine_only / "checkpoint-2")
    )
    results["resumed_engine_only"]["weights_max_abs_diff"] = _max_abs_diff(
        _weights(engine_only / "checkpoint-4"), _weights(out_dir / name / "ours" / "checkpoint-4")
    )
    bf16_config = {**config, "bf16": {"enabled": "auto"}}
    results["bf16_eval"] = {
        side: _run(side, bf16_config, out_dir / "bf16" / side, evaluate=True, bf16=True, save_strategy="no")
        for side in ("ref", "ours")
    }
    # Ours first: the reference's ZeRO-3 config, once alive, makes transformers build models under zero.Init.
    zero3 = {**copy.deepcopy(BASE_CONFIG), **copy.deepcopy(SCENARIOS["zero3_config_optim_sched"])}
    results["evaluate_before_train"] = {
        stage: {
            side: _evaluate_before_train(side, stage_config, out_dir / f"eval_{stage}" / side)
            for side in ("ours", "ref")
        }
        for stage, stage_config in (("zero2", config), ("zero3", zero3))
    }


def _main(out_dir: Path) -> None:
    import copy

    _lift_cuda_guards()
    results: dict = {}
    for name, extra in SCENARIOS.items():
        config = {**copy.deepcopy(BASE_CONFIG), **copy.deepcopy(extra)}
        results[name] = {side: _run(side, config, out_dir / name / side) for side in ("ref", "ours")}
        final = f"checkpoint-{RUN_ARGS['max_steps']}"
        results[name]["weights_max_abs_diff"] = _max_abs_diff(
            _weights(out_dir / name / "ref" / final), _weights(out_dir / name / "ours" / final)
        )
    # Resume the ZeRO-2 run from its step-2 checkpoint, in a fresh output folder holding a copy of it.
    import shutil

    name = "zero2_trainer_optim"
    resumed_dir = out_dir / "resumed"
    shutil.copytree(out_dir / name / "ours" / "checkpoint-2", resumed_dir / "checkpoint-2")
    config = {**copy.deepcopy(BASE_CONFIG), **copy.deepcopy(SCENARIOS[name])}
    results["resumed"] = _run("ours", config, resumed_dir, resume=str(resumed_dir / "checkpoint-2"))
    results["resumed"]["weights_max_abs_diff"] = _max_abs_diff(
        _weights(resumed_dir / "checkpoint-4"), _weights(out_dir / name / "ours" / "checkpoint-4")
    )
    _main_followups(out_dir, results)
    (out_dir / "results.json").write_text(json.dumps(results))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def deepspeed_runs(tmp_path_factory) -> dict:
    out_dir = tmp_path_factory.mktemp("deepspeed_runs")
    # One process of a launch of one: the reference's accelerate reads these, DeepSpeed's comm too.
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "PYTHONPATH": str(ROOT),
    }
    completed = subprocess.run(
        [sys.executable, __file__, str(out_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert completed.returncode == 0, completed.stderr[-6000:]
    return json.loads((out_dir / "results.json").read_text())


def _assert_same_history(ours: list[dict], reference: list[dict]) -> None:
    assert [entry["step"] for entry in ours] == [entry["step"] for entry in reference]
    for our_entry, ref_entry in zip(ours, reference):
        assert list(our_entry) == list(ref_entry), (ref_entry, our_entry)
        for key, value in ref_entry.items():
            assert our_entry[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (key, ref_entry, our_entry)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_deepspeed_run_matches_the_reference(deepspeed_runs, scenario):
    run = deepspeed_runs[scenario]
    reference, ours = run["ref"], run["ours"]
    _assert_same_history(ours["log_history"], reference["log_history"])
    assert [entry["step"] for entry in ours["log_history"]] == [1, 2, 3, 4, 4]
    # Same folders and files (the engine's global_step<N>/ shards, latest, zero_to_fp32.py), ours plus the
    # completion marker of the atomic save; scheduler.pt only where the trainer steps its own schedule.
    for checkpoint, files in reference["checkpoints"].items():
        our_files = dict(ours["checkpoints"][checkpoint])
        assert our_files.pop("hf_lightning_complete.json") is None
        assert our_files == files, checkpoint
    assert list(ours["checkpoints"]) == list(reference["checkpoints"]) == ["checkpoint-2", "checkpoint-4"]
    assert run["weights_max_abs_diff"] < 1e-6
    assert ours["engine"] == "DeepSpeedEngine" and ours["optimizer"] == "EngineOptimizerView"
    engine_schedules = scenario != "zero2_trainer_optim"
    assert ours["scheduler"] == ("EngineSchedulerView" if engine_schedules else "LambdaLR")
    assert ("scheduler.pt" in ours["checkpoints"]["checkpoint-2"]) is not engine_schedules


@pytest.mark.slow
def test_resumed_deepspeed_run_continues_the_uninterrupted_one(deepspeed_runs):
    resumed = deepspeed_runs["resumed"]
    uninterrupted = deepspeed_runs["zero2_trainer_optim"]["ours"]
    tail = [entry for entry in uninterrupted["log_history"] if entry["step"] > 2]
    resumed_tail = [entry for entry in resumed["log_history"] if entry["step"] > 2]
    _assert_same_history(
        resumed_tail[:-1], tail[:-1]
    )  # the final summary's train_loss covers only the resumed part
    assert resumed["weights_max_abs_diff"] < 1e-6


# ---------------------------------------------------------------- routing, with a recording engine


class _RecordingEngine:
    def __init__(self):
        self.calls: list[tuple] = []

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        self.calls.append(("boundary", is_boundary))

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool = True) -> None:
        self.calls.append(("backward", float(loss), scale_wrt_gas))

    def step(self) -> None:
        self.calls.append(("step",))


def test_backward_goes_to_the_engine_with_the_windows_boundary():
    engine = _RecordingEngine()
    module = SimpleNamespace(trainer=SimpleNamespace(strategy=SimpleNamespace(deepspeed_engine=engine)))
    precision = EnginePrecision()
    for sync in (False, False, True):
        module.sync_gradients = sync
        precision.backward(torch.tensor(0.5), module, None)
    assert engine.calls == [
        ("boundary", False),
        ("backward", 0.5, False),
        ("boundary", False),
        ("backward", 0.5, False),
        ("boundary", True),
        ("backward", 0.5, False),
        ("step",),
    ]
    assert precision.convert_module(module) is module and precision.convert_input(engine) is engine


def test_views_do_not_step_what_the_engine_steps():
    parameter = torch.nn.Parameter(torch.ones(2))
    inner = torch.optim.SGD([parameter], lr=0.5)
    view = EngineOptimizerView(inner)
    scheduler = torch.optim.lr_scheduler.LambdaLR(view, lambda step: 1.0 / (step + 1))  # a Trainer schedule
    parameter.grad = torch.ones(2)
    view.step()
    view.zero_grad()
    assert torch.equal(parameter.detach(), torch.ones(2)) and parameter.grad is not None
    scheduler.step()
    assert inner.param_groups[0]["lr"] == 0.25  # the schedule reaches DeepSpeed's groups through the view
    assert not view.step_was_skipped
    inner.overflow = True
    assert view.step_was_skipped

    engine_owned = EngineSchedulerView(torch.optim.lr_scheduler.LambdaLR(inner, lambda step: 0.1))
    engine_owned.step()
    assert engine_owned.get_last_lr() == [0.05] and engine_owned.last_epoch == 0


def test_a_user_optimizer_is_dropped_with_a_warning_and_the_engines_views_silently(caplog):
    """`optimizers=` under DeepSpeed: the engine is built from the config or the arguments, as the reference does;
    the warning names what to override. The views our engine set-up left in the trainer are not the user's."""
    from hf_lightning.strategies.deepspeed.strategy import HFDeepSpeedStrategy

    inner = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.5)
    view = EngineOptimizerView(inner)
    with caplog.at_level("WARNING", logger="hf_lightning.strategies.deepspeed.strategy"):
        HFDeepSpeedStrategy._warn_if_given_optimizers_are_dropped(view, None)
        HFDeepSpeedStrategy._warn_if_given_optimizers_are_dropped(None, None)
        assert not caplog.records
        HFDeepSpeedStrategy._warn_if_given_optimizers_are_dropped(inner, None)
    assert len(caplog.records) == 1 and "Override `create_optimizer`" in caplog.records[0].getMessage()


# ---------------------------------------------------------------- DeepSpeed before train(), resume, evaluation


@pytest.mark.slow
def test_deepspeed_is_on_from_construction_as_in_the_reference(deepspeed_runs):
    for scenario in SCENARIOS:
        run = deepspeed_runs[scenario]
        assert run["ours"]["constructed"] == run["ref"]["constructed"], scenario
        assert run["ours"]["constructed"] == {
            "is_deepspeed_enabled": True,
            "deepspeed_is_none": True,
            "place_model_on_device": False,
        }


@pytest.mark.slow
def test_resume_from_the_engine_files_alone_continues_the_uninterrupted_run(deepspeed_runs):
    resumed = deepspeed_runs["resumed_engine_only"]
    assert (
        "model.safetensors" not in resumed["checkpoints"]["checkpoint-2"]
    )  # only the engine's files were there
    uninterrupted = deepspeed_runs["zero2_trainer_optim"]["ours"]
    tail = [entry for entry in uninterrupted["log_history"] if entry["step"] > 2]
    resumed_tail = [entry for entry in resumed["log_history"] if entry["step"] > 2]
    _assert_same_history(
        resumed_tail[:-1], tail[:-1]
    )  # the summary's train_loss covers the resumed part only
    assert resumed["weights_max_abs_diff"] < 1e-6


@pytest.mark.slow
def test_bf16_evaluation_under_deepspeed_matches_the_reference(deepspeed_runs):
    # The engine holds the model in bf16 and nothing autocasts its forward: an autocast forward returns float32
    # outputs and moves this eval_loss by ~4e-3.
    run = deepspeed_runs["bf16_eval"]
    _assert_same_history(run["ours"]["log_history"], run["ref"]["log_history"])
    assert run["ours"]["eval_metrics"] == pytest.approx(run["ref"]["eval_metrics"], rel=1e-6)


@pytest.mark.slow
def test_evaluate_before_train_under_deepspeed_follows_the_reference(deepspeed_runs):
    zero2 = deepspeed_runs["evaluate_before_train"]["zero2"]
    assert zero2["ours"]["error"].startswith(zero2["ref"]["error"])  # the reference's refusal below ZeRO-3
    zero3 = deepspeed_runs["evaluate_before_train"][
        "zero3"
    ]  # the reference: a float32 ZeRO-3 inference engine
    ours, reference = zero3["ours"]["metrics"], zero3["ref"]["metrics"]
    assert list(ours) == list(reference)
    assert ours["eval_loss"] == pytest.approx(reference["eval_loss"], rel=1e-6)


class _RecordingModel(torch.nn.Module):
    """Records the dtypes its forward receives and whether CPU autocast is on."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)
        self.seen: list[tuple] = []

    def forward(self, x, ids, labels=None):
        self.seen.append((x.dtype, ids.dtype, labels.dtype, torch.is_autocast_enabled("cpu")))
        logits = self.linear(x).squeeze(-1)
        return {"loss": (logits.float() - labels.float()).pow(2).mean(), "logits": logits}


def _recording_trainer(tmp_path, monkeypatch, deepspeed: dict | None):
    from hf_lightning import TrainingArguments
    from hf_lightning.trainer.trainer import HFLightningTrainer
    from hf_lightning.translation.environment import Environment

    args = TrainingArguments(
        output_dir=str(tmp_path), bf16=True, use_cpu=True, deepspeed=deepspeed, report_to="none"
    )
    if deepspeed is not None:  # translated as for a CUDA GPU, where DeepSpeed runs
        args.use_cpu = False
        gpu = Environment(
            cuda_available=True, cuda_device_count=1, installed_packages=frozenset({"deepspeed"})
        )
        monkeypatch.setattr(Environment, "detect", classmethod(lambda cls: gpu))
    return HFLightningTrainer(model=_RecordingModel(), args=args)


def test_evaluation_under_deepspeed_casts_float_inputs_and_does_not_autocast(tmp_path, monkeypatch):
    from tests.models import ListDataset

    data = ListDataset([{"x": torch.ones(2), "ids": torch.tensor(3), "labels": torch.tensor(1.0)}] * 2)
    trainer = _recording_trainer(
        tmp_path, monkeypatch, {"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}}
    )
    assert trainer.is_deepspeed_enabled and trainer.deepspeed is None and not trainer.place_model_on_device
    # What train() leaves behind: an engine, holding the model in the config's dtype.
    trainer.deepspeed = object()
    trainer.model.to(torch.bfloat16)
    trainer.evaluate(data)
    # The reference's `_prepare_input`: float tensors (labels too) take the DeepSpeed dtype, integers stay.
    assert trainer.model.seen == [(torch.bfloat16, torch.int64, torch.bfloat16, False)]

    plain = _recording_trainer(tmp_path / "plain", monkeypatch, None)  # bf16 without DeepSpeed: autocast
    plain.evaluate(data)
    assert plain.model.seen == [(torch.float32, torch.int64, torch.float32, True)]

    # Before train() the reference evaluates a ZeRO-3 inference engine in the config's dtype; hf_lightning has none.
    zero3 = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}
    with pytest.raises(
        ValueError, match="before train\\(\\) under DeepSpeed ZeRO-3 with a torch.bfloat16 config"
    ):
        _recording_trainer(tmp_path / "zero3", monkeypatch, zero3).evaluate(data)


@pytest.mark.parametrize(
    ("sections", "bf16", "expected"),
    [
        ({"bf16": {"enabled": "auto"}}, True, torch.bfloat16),
        ({"bf16": {"enabled": "auto"}}, False, torch.float32),
        ({}, True, torch.float32),  # no section at argument time (accelerate adds one later): float32
        ({"fp16": {"enabled": True}}, False, torch.float16),
        ({"fp16": {"enabled": "auto"}, "bf16": {"enabled": True}}, False, torch.bfloat16),
    ],
)
def test_deepspeed_input_dtype_is_the_references(tmp_path, sections, bf16, expected):
    import transformers
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    from hf_lightning import TrainingArguments
    from hf_lightning.strategies.for_evaluation import deepspeed_input_dtype

    config = {"zero_optimization": {"stage": 2}, **sections}
    reference_config = HfTrainerDeepSpeedConfig(json.loads(json.dumps(config)))
    reference_config.trainer_config_process(
        transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, bf16=bf16)
    )
    ours = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, bf16=bf16, deepspeed=config)
    assert deepspeed_input_dtype(ours) == reference_config.dtype() == expected


if __name__ == "__main__":
    from tests.distributed.teardown import end_worker

    _main(Path(sys.argv[1]))
    end_worker()
