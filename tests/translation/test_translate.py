"""`translate`: arguments -> Plan for Lightning, checked against Lightning's own constructors."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import os
from datetime import datetime, timedelta

import lightning
import pytest
import torch
import transformers
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.strategies import DDPStrategy

from hf_lightning.integrations.logger_backends.tensorboard import default_logdir
from hf_lightning.integrations.loggers import build_loggers
from hf_lightning.strategies.build import build_strategy, resolve_ddp_kwargs
from hf_lightning.strategies.process_group_options import process_group_kwargs
from hf_lightning.translation.environment import Environment
from hf_lightning.translation.handlers.core import STATUSES
from hf_lightning.translation.handlers.distributed import fsdp_config
from hf_lightning.translation.plan import Plan
from hf_lightning.translation.translate import explain, translate
from tests.models import make_tiny_bert_classifier

CPU = Environment(installed_loggers=frozenset({"tensorboard"}))
ONE_GPU = Environment(cuda_available=True, cuda_device_count=1, installed_loggers=frozenset({"tensorboard"}))
DDP_2 = Environment(world_size=2, local_world_size=2, is_distributed_launch=True)


def override(args, **attributes):
    """Set attributes after construction, for values this CPU machine would not validate."""
    for name, value in attributes.items():
        setattr(args, name, value)
    return args


def refusal(args, env=CPU):
    with pytest.raises(ValueError) as error:
        translate(args, env)
    return str(error.value)


# ------------------------------------------------------------------ defaults


def test_default_arguments_note_every_field(make_args):
    args = make_args()
    plan = translate(args, CPU)
    assert list(plan.notes) == [f.name for f in dataclasses.fields(args)]
    assert len(plan.notes) == 114
    assert {note.status for note in plan.notes.values()} <= set(STATUSES)
    assert plan.refusals() == []
    assert plan.strategy is None and plan.logging.loggers == ()


def test_default_seq2seq_arguments_note_every_field(make_args):
    plan = translate(make_args(transformers.Seq2SeqTrainingArguments), CPU)
    assert len(plan.notes) == 119
    assert plan.notes["predict_with_generate"].status == "not-applicable"


def test_default_plan_builds_a_real_lightning_trainer(make_args, tmp_path):
    args = make_args()
    plan = translate(args, CPU)
    trainer = lightning.Trainer(**plan.lightning.as_kwargs())
    assert trainer.max_steps == -1 and trainer.max_epochs == -1
    assert trainer.accumulate_grad_batches == 1 and trainer.gradient_clip_val is None
    assert trainer.num_devices == 1 and trainer.logger is None
    assert trainer.num_sanity_val_steps == 0 and trainer.limit_val_batches == 0
    assert trainer.checkpoint_callback is None and trainer.progress_bar_callback is None
    assert trainer.default_root_dir == args.output_dir
    assert type(trainer.precision_plugin).__name__ == "Precision"  # 32-true
    assert plan.module.gradient_accumulation_steps == 1
    assert plan.module.max_grad_norm == 1.0


def test_default_save_strategy_is_honoured_without_warnings(make_args):
    plan = translate(make_args(), CPU)
    assert plan.notes["save_strategy"].status == "honoured"
    assert plan.warnings() == []
    assert translate(make_args(save_strategy="epoch", save_total_limit=2), CPU).notes["save_total_limit"].status == (
        "honoured"
    )


# ------------------------------------------------------------------ module settings


def test_accumulation_and_clipping_are_module_settings(make_args):
    plan = translate(make_args(gradient_accumulation_steps=4, max_grad_norm=0.5), CPU)
    assert plan.module.gradient_accumulation_steps == 4
    assert plan.module.max_grad_norm == 0.5
    assert plan.lightning.accumulate_grad_batches == 1
    assert plan.lightning.gradient_clip_val is None


def test_accelerator_config_num_steps_replaces_accumulation_of_one(make_args):
    config = {"gradient_accumulation_kwargs": {"num_steps": 4}}
    assert (
        translate(make_args(accelerator_config=config), CPU).module.gradient_accumulation_steps
        == 4
    )
    message = refusal(make_args(accelerator_config=config, gradient_accumulation_steps=2))
    assert "accelerator_config" in message and "T9" in message


# ------------------------------------------------------------------ precision


def test_bf16_maps_to_bf16_mixed_and_lightning_accepts_it(make_args):
    plan = translate(make_args(bf16=True), CPU)
    assert plan.lightning.precision == "bf16-mixed"
    trainer = lightning.Trainer(**plan.lightning.as_kwargs())
    assert trainer.precision_plugin.precision == "bf16-mixed"


def test_fp16_on_gpu_maps_to_16_mixed(make_args):
    args = override(make_args(), use_cpu=False, fp16=True)
    assert translate(args, ONE_GPU).lightning.precision == "16-mixed"
    assert (
        translate(override(make_args(), use_cpu=False, bf16=True), ONE_GPU).lightning.precision
        == "bf16-mixed"
    )


def test_fp16_on_cpu_trains_in_float32_as_the_reference(make_args):
    # accelerate turns native AMP off for fp16 on CPU; Lightning would swap in bf16 instead.
    plan = translate(make_args(fp16=True), CPU)
    assert plan.lightning.precision == "32-true"
    assert "CPU" in plan.notes["fp16"].how


def test_fp16_and_bf16_together_are_refused(make_args):
    message = refusal(override(make_args(), fp16=True, bf16=True))
    assert "bf16" in message


def test_full_determinism_sets_deterministic_and_no_benchmark(make_args):
    plan = translate(make_args(full_determinism=True), CPU)
    assert plan.lightning.deterministic is True
    assert plan.lightning.benchmark is False
    try:
        trainer = lightning.Trainer(**plan.lightning.as_kwargs())
        assert torch.are_deterministic_algorithms_enabled()
        assert trainer is not None
    finally:
        torch.use_deterministic_algorithms(False)
    assert translate(make_args(), CPU).lightning.deterministic is None


# ------------------------------------------------------------------ distributed


DDP_ARGS = dict(
    ddp_find_unused_parameters=False,
    ddp_bucket_cap_mb=25,
    ddp_broadcast_buffers=False,
    ddp_static_graph=True,
    ddp_timeout=600,
)


def ddp_args(make_args):
    # ddp_backend makes the reference's arguments set up a process group, so it is set afterwards
    return override(make_args(**DDP_ARGS), ddp_backend="gloo")


def test_ddp_kwargs_under_a_launcher_are_valid_for_lightning_and_torch(make_args):
    plan = translate(ddp_args(make_args), DDP_2)
    assert plan.lightning.devices == 2 and plan.lightning.strategy == "ddp"
    kwargs = resolve_ddp_kwargs(plan, torch.nn.Linear(2, 2))
    assert kwargs == {
        "find_unused_parameters": False,
        "bucket_cap_mb": 25,
        "broadcast_buffers": False,
        "static_graph": True,
        "process_group_backend": "gloo",
        "timeout": timedelta(seconds=600),
    }
    strategy = DDPStrategy(**kwargs)
    assert strategy.process_group_backend == "gloo"
    assert strategy._timeout == timedelta(seconds=600)
    ddp_parameters = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    assert set(strategy._ddp_kwargs) <= set(ddp_parameters)
    assert strategy._ddp_kwargs == {
        "find_unused_parameters": False,
        "bucket_cap_mb": 25,
        "broadcast_buffers": False,
        "static_graph": True,
    }


def test_ddp_plan_builds_a_real_lightning_trainer(make_args):
    plan = translate(ddp_args(make_args), DDP_2)
    model = torch.nn.Linear(2, 2)
    trainer = lightning.Trainer(**{**plan.lightning.as_kwargs(), "strategy": build_strategy(plan, model)})
    assert isinstance(trainer.strategy, DDPStrategy)
    assert trainer.strategy._ddp_kwargs["bucket_cap_mb"] == 25


def test_find_unused_parameters_default_follows_r7_3(make_args):
    plan = translate(make_args(), DDP_2)
    assert plan.strategy.find_unused_parameters is None
    assert resolve_ddp_kwargs(plan, torch.nn.Linear(2, 2))["find_unused_parameters"] is True
    assert resolve_ddp_kwargs(plan, make_tiny_bert_classifier())["find_unused_parameters"] is True
    checkpointing = translate(make_args(activation_checkpointing=True), DDP_2)
    assert resolve_ddp_kwargs(checkpointing, make_tiny_bert_classifier())["find_unused_parameters"] is False
    assert resolve_ddp_kwargs(checkpointing, torch.nn.Linear(2, 2))["find_unused_parameters"] is True
    explicit = translate(make_args(ddp_find_unused_parameters=False), DDP_2)
    assert resolve_ddp_kwargs(explicit, torch.nn.Linear(2, 2))["find_unused_parameters"] is False


def test_ddp_options_are_not_applicable_in_one_process(make_args):
    plan = translate(ddp_args(make_args), CPU)
    assert plan.strategy is None and plan.lightning.strategy == "auto"
    for name in [*DDP_ARGS, "ddp_backend"]:
        assert plan.notes[name].status == "not-applicable"


def test_several_gpus_in_one_process_are_refused_naming_n_gpu(make_args):
    args = override(make_args(), use_cpu=False)
    message = refusal(args, Environment(cuda_available=True, cuda_device_count=2))
    assert "n_gpu" in message and "torchrun" in message
    launched = Environment(
        cuda_available=True, cuda_device_count=2, world_size=2, local_world_size=2, is_distributed_launch=True
    )
    plan = translate(args, launched)
    assert plan.lightning.accelerator == "gpu" and plan.lightning.devices == 2


def test_deepspeed_without_cuda_is_refused(make_args):
    message = refusal(override(make_args(), deepspeed={"zero_optimization": {"stage": 2}}), DDP_2)
    assert "deepspeed" in message and "CUDA" in message


def test_n_gpu_under_deepspeed_follows_the_references_launch_rule(make_args, tmp_path):
    from hf_lightning.translation.translate import _accelerator, _n_gpu

    # Without a launcher the reference's state is the single-process one: it counts this machine's GPUs.
    reference = transformers.TrainingArguments(
        output_dir=str(tmp_path / "ref"), deepspeed={"zero_optimization": {"stage": 2}}
    )
    here = Environment.detect()
    assert _n_gpu(_accelerator(reference, here), here, "deepspeed") == reference.n_gpu
    # Under a launcher its DeepSpeed state keeps n_gpu=1 on any device, a CPU included (0 with use_cpu).
    launched_cpu = Environment(world_size=1, is_distributed_launch=True)
    assert _n_gpu("cpu", launched_cpu, "deepspeed") == 1
    assert (
        _n_gpu("cpu", launched_cpu, "single") == _n_gpu("cpu", launched_cpu, "deepspeed", use_cpu=True) == 0
    )
    # Unlaunched with two GPUs the reference would wrap the model in nn.DataParallel: refused, naming n_gpu.
    two_gpus = Environment(
        cuda_available=True, cuda_device_count=2, installed_packages=frozenset({"deepspeed"})
    )
    args = override(make_args(), use_cpu=False, deepspeed={"zero_optimization": {"stage": 2}})
    assert "n_gpu=2" in refusal(args, two_gpus)


def test_arguments_and_translation_count_gpus_by_one_rule(tmp_path, monkeypatch):
    """`TrainingArguments.n_gpu` and the translation share `reference_n_gpu`, DeepSpeed's launch rule included."""
    from hf_lightning import TrainingArguments
    from hf_lightning.translation.translate import _n_gpu

    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    launched_cpu = Environment(world_size=1, is_distributed_launch=True)
    deepspeed = {"zero_optimization": {"stage": 2}}
    for use_cpu, expected in ((False, 1), (True, 0)):
        args = TrainingArguments(
            output_dir=str(tmp_path), deepspeed=deepspeed, use_cpu=use_cpu, report_to="none"
        )
        assert args.device.type == "cpu"
        assert args.n_gpu == _n_gpu("cpu", launched_cpu, "deepspeed", use_cpu=use_cpu) == expected
    plain = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    assert plain.n_gpu == _n_gpu("cpu", launched_cpu, "single") == 0
    # accelerate's ACCELERATE_USE_CPU counts as use_cpu on both sides.
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    switched = TrainingArguments(output_dir=str(tmp_path), deepspeed=deepspeed, report_to="none")
    assert switched.n_gpu == 0


def test_accelerate_use_cpu_switch_picks_the_cpu(make_args):
    gpu_machine = Environment(cuda_available=True, cuda_device_count=1)
    switched = Environment(cuda_available=True, cuda_device_count=1, environ={"ACCELERATE_USE_CPU": "1"})
    args = override(make_args(), use_cpu=False)
    assert translate(args, gpu_machine).lightning.accelerator == "gpu"
    assert translate(args, switched).lightning.accelerator == "cpu"


def test_fsdp_on_cpu_runs_under_a_launch(make_args):
    # torch runs FSDP on CPU with gloo (hf_lightning/strategies/fsdp/policies.py); the reference falls back to DDP there.
    plan = translate(override(make_args(), fsdp=True), DDP_2)
    assert plan.strategy.name == "fsdp2"
    assert "distributed launch" in refusal(override(make_args(), fsdp=True), Environment())


def test_fsdp2_is_described_once_the_feature_lands(make_args, monkeypatch):
    env = Environment(
        cuda_available=True, cuda_device_count=2, world_size=2, local_world_size=2, is_distributed_launch=True
    )
    args = override(
        make_args(), use_cpu=False, fsdp=True, fsdp_config={"fsdp_cpu_offload": True}, ddp_timeout=60
    )
    plan = translate(args, env)
    assert plan.strategy.name == "fsdp2"
    assert process_group_kwargs(plan.strategy) == {"timeout": timedelta(seconds=60)}
    assert fsdp_config(args) == {"cpu_offload": True} and plan.strategy.fsdp.plugin_args["cpu_offload"] is True
    assert args.fsdp_config == {"fsdp_cpu_offload": True}  # the user's dict is untouched


def test_deepspeed_auto_values_are_filled_once_the_feature_lands(make_args, monkeypatch):
    env = Environment(cuda_available=True, cuda_device_count=1, installed_packages=frozenset({"deepspeed"}))
    config = {
        "zero_optimization": {"stage": 2},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "optimizer": {"params": {"lr": 1e-3, "betas": "auto"}},
    }
    args = override(make_args(), use_cpu=False, deepspeed=config, per_device_train_batch_size=4)
    plan = translate(args, env)
    resolved = plan.strategy.deepspeed.config
    assert resolved["train_micro_batch_size_per_gpu"] == 4
    # The engine keeps the reference's accumulation count (gradient_accumulation_steps=1 here).
    assert resolved["gradient_accumulation_steps"] == 1
    assert resolved["optimizer"]["params"]["betas"] == [0.9, 0.999]
    assert list(plan.strategy.deepspeed.mismatches) == ["- ds optimizer.params.lr=0.001 vs hf learning_rate=5e-05"]
    assert config["train_micro_batch_size_per_gpu"] == "auto"


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("field", "kwargs", "words"),
    [
        ("use_liger_kernel", {"use_liger_kernel": True}, ["liger"]),
        ("debug", {"debug": "underflow_overflow"}, ["underflow_overflow"]),
        ("debug", {"debug": "tpu_metrics_debug"}, ["XLA"]),
        ("report_to", {"report_to": None}, ["'all'", "'none'"]),
        ("report_to", {"report_to": "azure_ml"}, ["azure_ml", "has no Lightning logger", "pip install azureml-core"]),
        ("report_to", {"report_to": "neptune"}, ["neptune", "supported names"]),
        ("report_to", {"report_to": "wandb"}, ["wandb", "install"]),
        ("report_to", {"report_to": "no_such_tracker"}, ["not an integration name"]),
    ],
)
def test_refusals_name_the_field(make_args, field, kwargs, words):
    message = refusal(make_args(**kwargs))
    assert f"{field}=" in message
    for word in words:
        assert word in message


def test_parallelism_config_is_refused(make_args):
    message = refusal(override(make_args(), parallelism_config=object()))
    assert "parallelism_config" in message and "R7.5" in message


def test_every_refusal_is_listed_in_one_error(make_args):
    message = refusal(
        make_args(debug="underflow_overflow", use_liger_kernel=True, report_to="clearml")
    )
    for field in ("debug", "use_liger_kernel", "report_to"):
        assert f"{field}=" in message


def test_explain_can_show_refusals_without_raising(make_args):
    plan = translate(make_args(debug="underflow_overflow", use_liger_kernel=True), CPU, raise_on_refusal=False)
    assert {note.field for note in plan.refusals()} == {"debug", "use_liger_kernel"}
    line = next(line for line in explain(plan).splitlines() if line.startswith("use_liger_kernel "))
    assert "refused" in line


def test_liger_kernel_is_honoured_when_installed(make_args):
    env = Environment(installed_packages=frozenset({"liger_kernel"}))
    plan = translate(make_args(use_liger_kernel=True), env)
    assert plan.notes["use_liger_kernel"].status == "honoured"
    assert plan.notes["liger_kernel_config"].status == "honoured"


def test_hub_fields_are_honoured_when_pushing(make_args):
    fields = dict(hub_model_id="me/model", hub_strategy="checkpoint", hub_private_repo=True, hub_always_push=True,
                  hub_revision="dev", hub_token="hf_secret_value")
    pushing = translate(make_args(push_to_hub=True, **fields), CPU)
    local = translate(make_args(**fields), CPU)
    for name in ("push_to_hub", *fields):
        assert pushing.notes[name].status == "honoured", name
        assert "trainer/hub_methods.py" in pushing.notes[name].how, name
    for name in fields:
        assert local.notes[name].status == "not-applicable", name
    assert "hf_secret_value" not in explain(pushing)


def test_evaluation_fields_are_honoured(make_args):
    plan = translate(make_args(eval_strategy="steps", eval_steps=10, per_device_eval_batch_size=4), CPU)
    assert plan.notes["eval_strategy"].status == "honoured"
    assert plan.notes["eval_steps"].status == "honoured"
    assert plan.notes["per_device_eval_batch_size"].status == "honoured"


def test_eval_only_fields_are_honoured_without_evaluation_during_training(make_args):
    plan = translate(make_args(per_device_eval_batch_size=32, eval_accumulation_steps=4), CPU)
    assert plan.notes["per_device_eval_batch_size"].status == "honoured"
    assert "eval / test dataloaders" in plan.notes["per_device_eval_batch_size"].how
    assert plan.notes["eval_accumulation_steps"].status == "honoured"


def test_hub_token_is_accepted_and_never_shown(make_args):
    plan = translate(make_args(hub_token="hf_secret_value"), CPU)
    assert plan.notes["hub_token"].status == "not-applicable"
    assert plan.notes["hub_token"].value == "<HUB_TOKEN>"
    assert "hf_secret_value" not in explain(plan)
    assert "hf_secret_value" not in repr(plan)


def test_sortish_sampler_warns(make_args):
    plan = translate(make_args(transformers.Seq2SeqTrainingArguments, sortish_sampler=True), CPU)
    assert plan.notes["sortish_sampler"].status == "warned"


def test_subclass_fields_are_noted_not_refused(tmp_path):
    @dataclasses.dataclass
    class MyArguments(transformers.TrainingArguments):
        my_knob: int = 3

    plan = translate(MyArguments(output_dir=str(tmp_path), use_cpu=True), CPU)
    assert plan.notes["my_knob"].status == "not-applicable"
    assert len(plan.notes) == 115


# ------------------------------------------------------------------ loggers


def test_report_to_tensorboard_and_csv_build_real_loggers(make_args, tmp_path):
    args = make_args(report_to=["tensorboard", "csv"], run_name="r1")
    plan = translate(args, CPU)
    assert [spec["name"] for spec in plan.logging.loggers] == ["tensorboard", "csv"]
    assert plan.lightning.logger is False
    now = datetime(2024, 3, 5, 14, 7, 9)
    tensorboard, csv = build_loggers(plan, now=now)
    assert isinstance(tensorboard, TensorBoardLogger) and isinstance(csv, CSVLogger)
    expected_dir = os.path.join(args.output_dir, default_logdir(now))
    assert "Mar05_14-07-09_" in expected_dir
    assert os.path.normpath(tensorboard.log_dir) == os.path.normpath(expected_dir)
    tensorboard.log_metrics({"train/loss": 1.5}, step=1)
    tensorboard.finalize("success")
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(expected_dir))
    csv.log_metrics({"train/loss": 1.5}, step=1)
    csv.finalize("success")
    assert os.path.exists(os.path.join(csv.log_dir, "metrics.csv"))
    assert csv.log_dir.startswith(args.output_dir)
    trainer = lightning.Trainer(**{**plan.lightning.as_kwargs(), "logger": [tensorboard, csv]})
    assert trainer.loggers == [tensorboard, csv]


def test_tensorboard_dir_comes_from_the_environment_variable(make_args, tmp_path):
    env = dataclasses.replace(CPU, environ={"TENSORBOARD_LOGGING_DIR": str(tmp_path / "tb")})
    plan = translate(make_args(report_to="tensorboard"), env)
    (logger,) = build_loggers(plan)
    assert os.path.normpath(logger.log_dir) == str(tmp_path / "tb")


def test_report_to_requires_the_backend_package(make_args):
    message = refusal(make_args(report_to="tensorboard"), Environment())
    assert "report_to=" in message and "tensorboard" in message and "install" in message


def test_report_to_all_expands_to_installed_supported_loggers(make_args):
    args = override(make_args(), report_to="all")
    env = Environment(installed_loggers=frozenset({"tensorboard", "wandb", "neptune"}))
    plan = translate(args, env)
    assert [spec["name"] for spec in plan.logging.loggers] == ["tensorboard", "wandb"]
    wandb = plan.logging.loggers[1]
    # WANDB_MODE unset: decided at run time from the credentials present (offline without any).
    assert wandb["mode"] is None and wandb["kwargs"]["project"] == "huggingface"


def test_mlflow_spec_stays_under_output_dir(make_args):
    env = Environment(installed_loggers=frozenset({"mlflow"}))
    plan = translate(make_args(report_to="mlflow", run_name="run"), env)
    (spec,) = plan.logging.loggers
    store = os.path.join(os.path.abspath(plan.lightning.default_root_dir), "mlflow.db")
    assert spec["kwargs"]["tracking_uri"] == "sqlite:///" + store
    assert spec["kwargs"]["run_name"] == "run"


# ------------------------------------------------------------------ purity and environment


def test_translate_is_pure(make_args):
    args = override(
        ddp_args(make_args), report_to=["tensorboard", "csv"], gradient_accumulation_steps=2, bf16=True
    )
    before = copy.deepcopy(args.to_dict())
    first, second = translate(args, CPU), translate(args, CPU)
    assert isinstance(first, Plan) and first == second
    ddp_env = dataclasses.replace(DDP_2, installed_loggers=CPU.installed_loggers)
    assert translate(args, ddp_env) == translate(args, ddp_env)
    assert args.to_dict() == before
    # the plan holds copies: editing it does not leak into the next translation
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.module.even_batches = False
    assert translate(args, CPU).module.even_batches is True


def test_environment_detect_reads_the_launcher(monkeypatch):
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    single = Environment.detect()
    assert (single.world_size, single.is_distributed_launch, single.num_nodes) == (1, False, 1)
    assert single.cuda_available == torch.cuda.is_available()
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WANDB_API_KEY", "secret")
    monkeypatch.setenv("WANDB_PROJECT", "p")
    launched = Environment.detect()
    assert (launched.world_size, launched.local_world_size, launched.num_nodes) == (4, 2, 2)
    assert launched.process_index == 3 and launched.is_distributed_launch
    assert dict(launched.environ) == {"WANDB_PROJECT": "p"}
    assert "tensorboard" in launched.installed_loggers


def test_explain_has_one_line_per_field(make_args):
    plan = translate(make_args(), CPU)
    lines = explain(plan).splitlines()
    assert lines[0].split() == ["field", "value", "status", "how"]
    body = lines[2:]
    assert [line.split()[0] for line in body] == list(plan.notes)
    seed_line = next(line for line in body if line.startswith("seed "))
    assert "42" in seed_line and "honoured" in seed_line


def _plain_arguments(**values):
    """A duck-typed arguments object holding the registry's defaults in their post-init form."""
    from types import SimpleNamespace

    from hf_lightning.translation.handler_table import TRAINING_ARGUMENTS_REGISTRY

    fields = {name: entry.default for name, entry in TRAINING_ARGUMENTS_REGISTRY.items()}
    fields.update(output_dir="trainer_output", report_to=[], debug=[], activation_checkpointing=False)
    fields.update(values)
    return SimpleNamespace(**fields)


def test_duck_typed_arguments_translate_like_the_reference_class(make_args):
    plain = translate(_plain_arguments(output_dir=make_args().output_dir, use_cpu=True), CPU)
    reference = translate(make_args(), CPU)
    assert list(plain.notes) == list(reference.notes)
    assert plain.lightning == reference.lightning
    differing = {name for name in plain.notes if plain.notes[name].status != reference.notes[name].status}
    assert differing == set()


def test_translate_runs_without_transformers_or_accelerate():
    import subprocess
    import sys

    # this test module imports transformers, so the arguments object is rebuilt inline
    code = (
        "import sys; sys.modules['transformers'] = None; sys.modules['accelerate'] = None\n"
        "from types import SimpleNamespace\n"
        "from hf_lightning.translation.translate import translate, explain, Environment\n"
        "from hf_lightning.translation.handler_table import TRAINING_ARGUMENTS_REGISTRY as R\n"
        "fields = {n: e.default for n, e in R.items()}\n"
        "fields.update(output_dir='o', report_to=['csv'], debug=[], use_cpu=True)\n"
        "plan = translate(SimpleNamespace(**fields), Environment())\n"
        "assert len(plan.notes) == 114 and plan.logging.loggers[0]['name'] == 'csv'\n"
        "assert 'transformers' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"bf16": True, "gradient_accumulation_steps": 3, "report_to": "csv"}, {"save_strategy": "no"}],
)
def test_our_arguments_translate_like_the_reference_arguments(tmp_path, kwargs):
    from hf_lightning.args.training_args import TrainingArguments

    ours = translate(TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **kwargs), CPU)
    reference = translate(
        transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **kwargs), CPU
    )
    assert ours.lightning == reference.lightning
    assert ours.module == reference.module
    assert ours.logging.loggers == reference.logging.loggers
    for section in ("evaluation", "checkpointing", "logging", "hub"):
        assert getattr(ours, section) == getattr(reference, section), section
    assert {name: note.status for name, note in ours.notes.items()} == {
        name: note.status for name, note in reference.notes.items()
    }
