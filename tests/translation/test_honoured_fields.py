""""Honoured" means read: for every field the registry marks honoured, changing that field alone changes the run.

Each case runs a tiny base configuration (`BASE_ARGS` plus the case's context) and the same configuration with
only the field changed, then asserts the expected difference: steps, logged values, files, the batches seen, or
the objects built (dataloaders, strategies, the `lightning.Trainer` arguments) where CPU cannot show more.
Base runs are shared between cases with the same recipe and context. The coverage test fails when the
registry honours a field this table does not test.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from accelerate.parallelism_config import ParallelismConfig

from hf_lightning import PrinterCallback, ProgressCallback, Seq2SeqTrainingArguments, TrainingArguments
from hf_lightning.translation.environment import Environment
from hf_lightning.translation.translate import translate
from tests.integrations.hub_server import OTHER_TOKEN
from tests.models import regression_data
from tests.translation.harness import (
    BASE_ARGS,
    EVAL_SIZE,
    RECIPE_ENV,
    SEQ2SEQ_RECIPES,
    TRAIN_SIZE,
    Run,
    execute,
)

LR = BASE_ARGS["learning_rate"]
SAVE_EVERY_2 = {"save_strategy": "steps", "save_steps": 2}
EVAL_EVERY_STEP = {"eval_strategy": "steps"}
BEST_MODEL = {"eval_strategy": "steps", "save_strategy": "steps", "save_steps": 1}
ONE_EPOCH = {"max_steps": -1, "num_train_epochs": 1}
ONE_WORKER = {"dataloader_num_workers": 1}
PUSHING = {"push_to_hub": True, **SAVE_EVERY_2}


@dataclasses.dataclass(frozen=True)
class Case:
    """Change `value` on top of `context`, run `recipe` both ways, then `check(base, changed)`."""

    value: Any
    check: Callable[[Run, Run], None]
    recipe: str = "train"
    context: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    patches: tuple[tuple[str, Any], ...] = ()
    # The only cases whose changed value is refused: the field is honoured at its default ("off") only.
    refused: bool = False


# ---------------------------------------------------------------- observations


def _losses(run: Run) -> dict[int, float]:
    return run.logged("loss")


def _differs_after_first_update(base: Run, changed: Run) -> None:
    assert _losses(changed)[1] == pytest.approx(_losses(base)[1])  # same data, same initial weights
    assert _losses(changed)[3] != pytest.approx(_losses(base)[3], rel=1e-4)


def _train_dataloader(run: Run):
    return run.trainer.get_train_dataloader()


def _lr_ratio(ratio: float, step: int = 1) -> Callable[[Run, Run], None]:
    def check(base: Run, changed: Run) -> None:
        assert changed.logged("learning_rate")[step] == pytest.approx(ratio * base.logged("learning_rate")[step])

    return check


def _first_batch_differs(base: Run, changed: Run) -> None:
    assert changed.batches[0] != base.batches[0]
    assert changed.initial_params.keys() == base.initial_params.keys()
    assert all(torch.equal(changed.initial_params[k], base.initial_params[k]) for k in base.initial_params)
    assert _losses(changed)[1] != pytest.approx(_losses(base)[1])


def _refused(base: Run, changed: Run) -> None:
    assert base.error is None and base.trainer is not None
    assert changed.error is not None and changed.trainer is None


def _sigterm_checkpoint(base: Run, changed: Run) -> None:
    """SIGTERM at the end of step 2: without the field the process dies by it; with it, a checkpoint of step 3 (the
    next update boundary) and a normal exit."""
    assert os.WIFSIGNALED(base.wait_status) and os.WTERMSIG(base.wait_status) == signal.SIGTERM
    assert base.checkpoints() == []
    assert os.WIFEXITED(changed.wait_status) and os.WEXITSTATUS(changed.wait_status) == 0
    assert changed.checkpoints() == ["checkpoint-3"]


def _checkpoints(expected_base: list[int], expected_changed: list[int]) -> Callable[[Run, Run], None]:
    def check(base: Run, changed: Run) -> None:
        assert base.checkpoints() == [f"checkpoint-{n}" for n in expected_base]
        assert changed.checkpoints() == [f"checkpoint-{n}" for n in expected_changed]

    return check


def _logged_steps(key: str, expected_base: list[int], expected_changed: list[int]) -> Callable[[Run, Run], None]:
    def check(base: Run, changed: Run) -> None:
        assert sorted(base.logged(key)) == expected_base
        assert sorted(changed.logged(key)) == expected_changed

    return check


def _global_steps(expected_base: int, expected_changed: int) -> Callable[[Run, Run], None]:
    def check(base: Run, changed: Run) -> None:
        assert (base.output.global_step, changed.output.global_step) == (expected_base, expected_changed)

    return check


def _dataloader_attribute(name: str, expected_base: Any, expected_changed: Any) -> Callable[[Run, Run], None]:
    def check(base: Run, changed: Run) -> None:
        assert getattr(_train_dataloader(base), name) == expected_base
        assert getattr(_train_dataloader(changed), name) == expected_changed

    return check


def _start_method(base: Run, changed: Run) -> None:
    assert _train_dataloader(base).multiprocessing_context is None
    assert _train_dataloader(changed).multiprocessing_context.get_start_method() == "spawn"


def _output_dir(base: Run, changed: Run) -> None:
    assert changed.out_dir != base.out_dir and changed.out_dir.name == "moved"
    assert changed.checkpoints() == base.checkpoints() == ["checkpoint-2", "checkpoint-4"]
    assert changed.trainer.lightning_trainer.default_root_dir == str(changed.out_dir)


def _batch_size(base: Run, changed: Run) -> None:
    assert {len(b) for b in base.batches} == {4} and {len(b) for b in changed.batches} == {2}
    assert base.log_history[-2]["epoch"] == pytest.approx(4 / 6)
    assert changed.log_history[-2]["epoch"] == pytest.approx(4 / 12)


def _constant_lr(base: Run, changed: Run) -> None:
    assert set(changed.logged("learning_rate").values()) == {LR}
    assert base.logged("learning_rate")[1] > base.logged("learning_rate")[3]


def _polynomial_power(base: Run, changed: Run) -> None:
    base_lr, changed_lr = base.logged("learning_rate"), changed.logged("learning_rate")
    for step in (2, 3, 4):  # the lr of update k: (1 - (k - 1) / 4) ** 2 < (1 - (k - 1) / 4) ** 1
        assert changed_lr[step] < base_lr[step]


def _sgd(base: Run, changed: Run) -> None:
    assert type(base.trainer.optimizer).__name__ == "AdamW"
    assert type(changed.trainer.optimizer) is torch.optim.SGD
    assert _losses(changed)[2] != pytest.approx(_losses(base)[2])


def _momentum(base: Run, changed: Run) -> None:
    assert base.trainer.optimizer.defaults["momentum"] == 0
    assert changed.trainer.optimizer.defaults["momentum"] == 0.9
    assert _losses(changed)[3] != pytest.approx(_losses(base)[3])


def _weight_decay(base: Run, changed: Run) -> None:
    assert {g["weight_decay"] for g in base.trainer.optimizer.param_groups} == {0.0}
    assert {g["weight_decay"] for g in changed.trainer.optimizer.param_groups} == {0.5, 0.0}
    assert not torch.equal(base.final_params()["net.0.weight"], changed.final_params()["net.0.weight"])


def _adam_default(key: str, index: int | None, expected: float) -> Callable[[Run, Run], None]:
    def check(base: Run, changed: Run) -> None:
        value = changed.trainer.optimizer.defaults[key]
        assert (value if index is None else value[index]) == expected
        _differs_after_first_update(base, changed)

    return check


def _accumulation(base: Run, changed: Run) -> None:
    assert (base.output.global_step, changed.output.global_step) == (6, 3)
    assert len(base.batches) == len(changed.batches) == 6  # the same micro-batches, half the updates


def _clipping(base: Run, changed: Run) -> None:
    # SGD at lr 0.1: clipped to norm 1e-4, four updates move the weights by at most 4e-5.
    assert changed.logged("grad_norm")[1] == pytest.approx(base.logged("grad_norm")[1])  # the pre-clip norm
    assert changed.moved() <= 4 * 0.1 * 1e-4 * 1.01
    assert base.moved() > 100 * changed.moved()


def _label_smoothing(base: Run, changed: Run) -> None:
    assert base.trainer.label_smoother is None and changed.trainer.label_smoother is not None
    assert _losses(changed)[1] > _losses(base)[1]


def _dtype_during(dtype: torch.dtype) -> Callable[[Run, Run], None]:
    def check(base: Run, changed: Run) -> None:
        assert base.model.dtypes == {torch.float32}
        assert dtype in changed.model.dtypes

    return check


def _fp16_lightning_plugin(base: Run, changed: Run) -> None:
    from lightning.pytorch.plugins.precision import MixedPrecision

    assert base.lightning_kwargs["precision"] == "32-true" and "plugins" not in base.lightning_kwargs
    (plugin,) = changed.lightning_kwargs["plugins"]
    assert isinstance(plugin, MixedPrecision) and plugin.scaler is not None


def _tf32(base: Run, changed: Run) -> None:
    assert base.fp32_precision == "none"  # left as it is
    assert changed.fp32_precision == "tf32"


def _checkpointing(base: Run, changed: Run) -> None:
    assert not base.model.is_activation_checkpointing
    assert changed.model.is_activation_checkpointing


def _checkpointing_kwargs(base: Run, changed: Run) -> None:
    def keywords(run: Run) -> dict:
        layer = run.model.bert.encoder.layer[0]
        return dict(layer._gradient_checkpointing_func.keywords)

    assert keywords(base).get("use_reentrant") is not True
    assert keywords(changed)["use_reentrant"] is True


def _compiled(base: Run, changed: Run) -> None:
    assert base.compile_calls == []
    assert changed.compile_calls == [{"backend": "inductor", "mode": None}]


def _compile_kwarg(key: str, value: str) -> Callable[[Run, Run], None]:
    def check(base: Run, changed: Run) -> None:
        assert len(base.compile_calls) == len(changed.compile_calls) == 1
        assert base.compile_calls[0][key] != value and changed.compile_calls[0][key] == value

    return check


def _use_cache(base: Run, changed: Run) -> None:
    assert base.model.config.use_cache is False and changed.model.config.use_cache is True


def _neftune(base: Run, changed: Run) -> None:
    assert _losses(changed)[1] != pytest.approx(_losses(base)[1], rel=1e-6)
    assert not changed.model.get_input_embeddings()._forward_hooks  # removed after training


def _cache_clears(base: Run, changed: Run) -> None:
    assert base.cache_clears == 0
    assert changed.cache_clears == 4  # every micro-step, global_step % 1 == 0


def _auto_batch(base: Run, changed: Run) -> None:
    assert isinstance(base.error, torch.OutOfMemoryError)
    assert changed.error is None and changed.model.batch_sizes[0] == 4 and set(changed.model.batch_sizes[1:]) == {3}


def _no_step_logs(base: Run, changed: Run) -> None:
    assert sorted(base.logged("loss")) == [1, 2, 3, 4]
    assert changed.logged("loss") == {} and "train_runtime" in changed.log_history[-1]


def _nan_filter(base: Run, changed: Run) -> None:
    assert math.isfinite(_losses(base)[4])
    assert math.isnan(_losses(changed)[4])
    assert _losses(changed)[3] == pytest.approx(_losses(base)[3])


def _tokens_seen(base: Run, changed: Run) -> None:
    assert base.logged("num_input_tokens_seen") == {}
    assert changed.logged("num_input_tokens_seen") == {1: 16, 2: 32, 3: 48, 4: 64}  # 4 samples x 4 features


def _verbosity(expected_base: int, expected_changed: int) -> Callable[[Run, Run], None]:
    def check(base: Run, changed: Run) -> None:
        assert (base.verbosity, changed.verbosity) == (expected_base, expected_changed)

    return check


def _progress(base: Run, changed: Run) -> None:
    def kinds(run: Run) -> set[type]:
        return {type(cb) for cb in run.trainer.callback_handler.callbacks}

    assert ProgressCallback in kinds(base) and PrinterCallback not in kinds(base)
    assert PrinterCallback in kinds(changed) and ProgressCallback not in kinds(changed)


def _csv_logger(base: Run, changed: Run) -> None:
    from lightning.pytorch.loggers import CSVLogger

    assert base.trainer.lightning_trainer.loggers == []
    (logger,) = changed.trainer.lightning_trainer.loggers
    assert isinstance(logger, CSVLogger)
    assert list(changed.out_dir.rglob("metrics.csv")) and not list(base.out_dir.rglob("metrics.csv"))


def _eval_batch_size(base: Run, changed: Run) -> None:
    assert base.trainer.get_eval_dataloader().batch_size == 3
    assert changed.trainer.get_eval_dataloader().batch_size == 5


def _loss_only(base: Run, changed: Run) -> None:
    assert base.predictions.predictions.shape == (EVAL_SIZE,)
    assert changed.predictions.predictions is None
    assert changed.predictions.metrics["test_loss"] == pytest.approx(base.predictions.metrics["test_loss"])


def _eval_on_start(base: Run, changed: Run) -> None:
    assert sorted(base.logged("eval_loss")) == [2, 4]
    assert sorted(changed.logged("eval_loss")) == [0, 2, 4]


def _unconcatenated(base: Run, changed: Run) -> None:
    assert base.predictions.predictions.shape == (EVAL_SIZE,)
    assert [p.shape for p in changed.predictions.predictions] == [(3,), (3,), (2,)]


def _gathered_as_objects(base: Run, changed: Run) -> None:
    assert base.gathers and set(base.gathers) == {"tensors"}
    assert changed.gathers and set(changed.gathers) == {"objects"}
    assert changed.predictions.predictions.shape == base.predictions.predictions.shape == (EVAL_SIZE,)


def _to_cpu_moves(base: Run, changed: Run) -> None:
    assert base.to_cpu_moves == 3  # losses, predictions and labels, once at the end
    assert changed.to_cpu_moves == 3 * 3  # the three after each of the 3 batches


def _metrics_inputs(base: Run, changed: Run) -> None:
    assert [call["inputs"] for call in base.metric_calls] == [None]
    (call,) = changed.metric_calls
    assert call["inputs"].shape == (EVAL_SIZE, 4)


def _batch_metrics(base: Run, changed: Run) -> None:
    assert [call["compute_result"] for call in base.metric_calls] == [None]
    assert [call["compute_result"] for call in changed.metric_calls] == [False, False, True]


def _model_only(base: Run, changed: Run) -> None:
    assert (base.out_dir / "checkpoint-4" / "optimizer.pt").is_file()
    assert not (changed.out_dir / "checkpoint-4" / "optimizer.pt").exists()
    assert (changed.out_dir / "checkpoint-4" / "trainer_state.json").is_file()


def _output_dir_created(base: Run, changed: Run) -> None:
    # Rank 1 is not node 0's main process; with save_on_each_node it is its own node's, so it saves.
    assert not base.out_dir.exists()
    assert changed.out_dir.is_dir()


def _best_model_loaded(base: Run, changed: Run) -> None:
    # On the adverse eval set the last checkpoint is not the best one.
    eval_losses = base.logged("eval_loss")
    best = min(eval_losses, key=eval_losses.get)
    assert best != 4
    assert base.trainer.state.best_model_checkpoint is None
    assert changed.trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best}")
    final = changed.final_params()
    assert not torch.equal(final["net.0.weight"], base.final_params()["net.0.weight"])
    from safetensors.torch import load_file

    stored = load_file(str(changed.out_dir / f"checkpoint-{best}" / "model.safetensors"))
    assert torch.equal(final["net.0.weight"], stored["net.0.weight"])


def _best_metric(base: Run, changed: Run) -> None:
    assert base.trainer.state.best_metric is None
    assert changed.trainer.state.best_metric == pytest.approx(min(changed.logged("eval_loss").values()))


def _greater_is_better(base: Run, changed: Run) -> None:
    assert base.trainer.state.best_metric == pytest.approx(min(base.logged("eval_loss").values()))
    assert changed.trainer.state.best_metric == pytest.approx(max(changed.logged("eval_loss").values()))


def _data_skip(base: Run, changed: Run) -> None:
    uninterrupted = base.predictions
    assert changed.predictions == uninterrupted  # the same first run
    # Resumed at step 2: the base skips the two batches already trained on, the changed run does not.
    assert base.batches[0] == uninterrupted[2]
    assert changed.batches[0] == uninterrupted[0]


def _callback_states(base: Run, changed: Run) -> None:
    assert max(base.callback_counts) == 2  # counts only the two steps after the resume
    assert max(changed.callback_counts) == 4  # restored to 2 from the checkpoint, then two more


def _determinism(base: Run, changed: Run) -> None:
    assert base.deterministic is False and changed.deterministic is True


def _accelerator(base: Run, changed: Run) -> None:
    assert base.lightning_kwargs["accelerator"] == "cpu"
    assert changed.lightning_kwargs["accelerator"] == "gpu"


def _drop_last(base: Run, changed: Run) -> None:
    assert (base.output.global_step, changed.output.global_step) == (7, 6)  # 26 samples in batches of 4
    assert len(base.batches[-1]) == 2 and {len(b) for b in changed.batches} == {4}


def _extra_column(base: Run, changed: Run) -> None:
    assert set(next(iter(_train_dataloader(base)))) == {"x", "labels"}
    assert set(next(iter(_train_dataloader(changed)))) == {"x", "labels", "extra"}


def _label_names(base: Run, changed: Run) -> None:
    assert base.predictions.label_ids.shape == (EVAL_SIZE,)
    assert changed.predictions.label_ids.shape == (EVAL_SIZE, 4)  # the "x" column


def _sequential(base: Run, changed: Run) -> None:
    labels = [float(item["labels"]) for item in regression_data(TRAIN_SIZE).items]
    assert changed.batches[0] == pytest.approx(labels[:4])
    assert base.batches[0] != pytest.approx(labels[:4])


def _seedable_sampler(base: Run, changed: Run) -> None:
    from torch.utils.data import RandomSampler

    assert type(_train_dataloader(base).sampler).__name__ == "SeedableRandomSampler"
    assert type(_train_dataloader(changed).sampler) is RandomSampler


def _strategy_class(expected_base: str, expected_changed: str) -> Callable[[Run, Run], None]:
    def check(base: Run, changed: Run) -> None:
        assert type(base.strategy).__name__ == expected_base
        assert type(changed.strategy).__name__ == expected_changed

    return check


def _reshard(base: Run, changed: Run) -> None:
    assert base.strategy.reshard_after_forward is True
    assert changed.strategy.reshard_after_forward is False


def _ddp_kwarg(key: str, expected_base: Any, expected_changed: Any) -> Callable[[Run, Run], None]:
    def check(base: Run, changed: Run) -> None:
        assert base.strategy._ddp_kwargs.get(key) == expected_base
        assert changed.strategy._ddp_kwargs.get(key) == expected_changed

    return check


def _ddp_backend(base: Run, changed: Run) -> None:
    assert base.strategy._process_group_backend is None  # Lightning picks gloo on CPU when it sets up
    assert changed.strategy._process_group_backend == "gloo"


def _ddp_timeout(base: Run, changed: Run) -> None:
    assert base.strategy._timeout.total_seconds() == 1800
    assert changed.strategy._timeout.total_seconds() == 60


def _memory_metrics(base: Run, changed: Run) -> None:
    assert not any(key.endswith("_mem_cpu_alloc_delta") for key in base.output.metrics)
    assert "train_mem_cpu_alloc_delta" in changed.output.metrics


def _generated(base: Run, changed: Run) -> None:
    assert base.predictions.predictions[0].ndim == 3 and base.generate_calls == []  # logits
    assert changed.predictions.predictions.ndim == 2 and len(changed.generate_calls) == 2  # token ids, per batch
    assert changed.predictions.predictions.dtype.kind == "i"


def _generation_kwarg(key: str, value: int) -> Callable[[Run, Run], None]:
    def check(base: Run, changed: Run) -> None:
        assert base.generate_calls and all(call.get(key) != value for call in base.generate_calls)
        assert changed.generate_calls and all(call[key] == value for call in changed.generate_calls)

    return check


def _generation_length(base: Run, changed: Run) -> None:
    _generation_kwarg("max_length", 4)(base, changed)
    # Padded to the model's generation config length either way; only 4 tokens are generated.
    pad = changed.model.config.pad_token_id
    assert (changed.predictions.predictions[:, 4:] == pad).all()
    assert (base.predictions.predictions[:, 4:] != pad).any()


def _pushed(base: Run, changed: Run) -> None:
    assert base.hub.commits == []
    assert [c.message for c in changed.hub.commits] == ["Training in progress, step 2"]


def _pushed_to(expected_changed: str) -> Callable[[Run, Run], None]:
    def check(base: Run, changed: Run) -> None:
        assert {c.repo_id for c in base.hub.commits} == {f"tester/{base.out_dir.name}"}
        assert {c.repo_id for c in changed.hub.commits} == {expected_changed.format(name=changed.out_dir.name)}

    return check


def _last_checkpoint_pushed(base: Run, changed: Run) -> None:
    def pushed(run: Run) -> set[str]:
        (tree,) = [trees["main"] for trees in run.hub.trees.values()]
        return {path.split("/")[0] for path in tree if "/" in path}

    assert pushed(base) == set() and pushed(changed) == {"last-checkpoint"}


def _private(base: Run, changed: Run) -> None:
    assert list(base.hub.private.values()) == [False] and list(changed.hub.private.values()) == [True]


def _pushes_started(base: Run, changed: Run) -> None:
    assert (base.hub.pushes, changed.hub.pushes) == (1, 2)  # saves at 2 and 4; the first push still runs at 4


def _branch(base: Run, changed: Run) -> None:
    assert {c.branch for c in base.hub.commits} == {"main"} and {c.branch for c in changed.hub.commits} == {"dev"}


# ---------------------------------------------------------------- the table

_TF32_ON_THIS_MACHINE = (("hf_lightning.args.training_args.check_tf32_supported", lambda *_: True),)

CASES: dict[str, Case] = {
    # schedule and optimizer
    "output_dir": Case("moved", _output_dir, context=SAVE_EVERY_2),
    "per_device_train_batch_size": Case(2, _batch_size),
    "num_train_epochs": Case(2, _global_steps(6, 12), context=ONE_EPOCH),
    "max_steps": Case(2, _global_steps(4, 2)),
    "learning_rate": Case(2 * LR, _lr_ratio(2.0)),
    "lr_scheduler_type": Case("constant", _constant_lr),
    "lr_scheduler_kwargs": Case({"power": 2.0}, _polynomial_power, context={"lr_scheduler_type": "polynomial"}),
    "warmup_steps": Case(2, _lr_ratio((1 / 2) / (3 / 4), step=2)),  # update 2: warmup 1/2, linear decay 3/4
    "optim": Case("sgd", _sgd),
    "optim_args": Case("momentum=0.9", _momentum, context={"optim": "sgd"}),
    "weight_decay": Case(0.5, _weight_decay),
    "adam_beta1": Case(0.5, _adam_default("betas", 0, 0.5)),
    "adam_beta2": Case(0.5, _adam_default("betas", 1, 0.5)),
    "adam_epsilon": Case(0.1, _adam_default("eps", None, 0.1)),
    "gradient_accumulation_steps": Case(2, _accumulation, context=ONE_EPOCH),
    "max_grad_norm": Case(1e-4, _clipping, context={"optim": "sgd", "learning_rate": 0.1}),
    "label_smoothing_factor": Case(0.1, _label_smoothing, recipe="classify"),
    # precision and model preparation
    "bf16": Case(True, _dtype_during(torch.bfloat16)),
    "fp16": Case(True, _fp16_lightning_plugin, recipe="cuda_lightning", context={"use_cpu": False}),
    "bf16_full_eval": Case(True, _dtype_during(torch.bfloat16), recipe="predict"),
    "fp16_full_eval": Case(True, _dtype_during(torch.float16), recipe="predict"),
    "tf32": Case(True, _tf32, recipe="cuda_lightning", context={"use_cpu": False}, patches=_TF32_ON_THIS_MACHINE),
    "activation_checkpointing": Case(True, _checkpointing, recipe="hf"),
    "gradient_checkpointing": Case(True, _checkpointing, recipe="hf"),
    "activation_checkpointing_kwargs": Case(
        {"use_reentrant": True}, _checkpointing_kwargs, recipe="hf", context={"activation_checkpointing": True}
    ),
    "gradient_checkpointing_kwargs": Case(
        {"use_reentrant": True}, _checkpointing_kwargs, recipe="hf", context={"gradient_checkpointing": True}
    ),
    "torch_compile": Case(True, _compiled),
    "torch_compile_backend": Case("eager", _compile_kwarg("backend", "eager"), context={"torch_compile": True}),
    "torch_compile_mode": Case(
        "reduce-overhead", _compile_kwarg("mode", "reduce-overhead"), context={"torch_compile": True}
    ),
    "use_liger_kernel": Case(True, _refused, recipe="refusal", refused=True),  # liger_kernel is not installed
    "use_cache": Case(True, _use_cache, recipe="hf", context={"max_steps": 1}),
    "neftune_noise_alpha": Case(5.0, _neftune, recipe="hf"),
    "torch_empty_cache_steps": Case(1, _cache_clears),
    "auto_find_batch_size": Case(True, _auto_batch, recipe="oom"),
    # logging
    "logging_strategy": Case("no", _no_step_logs),
    "logging_steps": Case(2, _logged_steps("loss", [1, 2, 3, 4], [2, 4])),
    "logging_first_step": Case(True, _logged_steps("loss", [3], [1, 3]), context={"logging_steps": 3}),
    "logging_nan_inf_filter": Case(False, _nan_filter, recipe="nan"),
    "include_num_input_tokens_seen": Case("all", _tokens_seen),
    "log_level": Case("error", _verbosity(30, 40), recipe="built"),
    "log_level_replica": Case("error", _verbosity(30, 40), recipe="replica", context={"log_level_replica": "warning"}),
    "disable_tqdm": Case(True, _progress, recipe="built", context={"disable_tqdm": False}),
    "report_to": Case(["csv"], _csv_logger),
    # evaluation
    "eval_strategy": Case("steps", _logged_steps("eval_loss", [], [1, 2, 3, 4]), recipe="eval"),
    "eval_steps": Case(2, _logged_steps("eval_loss", [1, 2, 3, 4], [2, 4]), recipe="eval", context=EVAL_EVERY_STEP),
    "eval_delay": Case(3, _logged_steps("eval_loss", [1, 2, 3, 4], [3, 4]), recipe="eval", context=EVAL_EVERY_STEP),
    "per_device_eval_batch_size": Case(5, _eval_batch_size, recipe="built"),
    "prediction_loss_only": Case(True, _loss_only, recipe="predict"),
    "eval_on_start": Case(True, _eval_on_start, recipe="eval", context={"eval_strategy": "steps", "eval_steps": 2}),
    "eval_do_concat_batches": Case(False, _unconcatenated, recipe="predict"),
    "eval_use_gather_object": Case(True, _gathered_as_objects, recipe="gather"),
    "eval_accumulation_steps": Case(1, _to_cpu_moves, recipe="predict"),
    "include_for_metrics": Case(["inputs"], _metrics_inputs, recipe="predict"),
    "batch_eval_metrics": Case(True, _batch_metrics, recipe="predict"),
    # saving, best model and resuming
    "save_only_model": Case(True, _model_only, context=SAVE_EVERY_2),
    "save_strategy": Case("steps", _checkpoints([], [2, 4]), context={"save_steps": 2}),
    "save_steps": Case(2, _checkpoints([4], [2, 4]), context={"save_strategy": "steps"}),
    "save_total_limit": Case(1, _checkpoints([2, 4], [4]), context=SAVE_EVERY_2),
    "save_on_each_node": Case(
        True, _output_dir_created, recipe="second_process", context={"save_strategy": "steps"}
    ),
    "log_on_each_node": Case(False, _verbosity(40, 30), recipe="second_process", context={"log_level": "error"}),
    "enable_jit_checkpoint": Case(True, _sigterm_checkpoint, recipe="sigterm"),
    "load_best_model_at_end": Case(True, _best_model_loaded, recipe="eval_adverse", context=BEST_MODEL),
    "metric_for_best_model": Case("loss", _best_metric, recipe="eval", context=BEST_MODEL),
    "greater_is_better": Case(
        True, _greater_is_better, recipe="eval_adverse", context={**BEST_MODEL, "metric_for_best_model": "loss"}
    ),
    "ignore_data_skip": Case(True, _data_skip, recipe="resume"),
    # the Hub (a local Hub-compatible server, tests/integrations/hub_server.py)
    "push_to_hub": Case(True, _pushed, recipe="hub", context=SAVE_EVERY_2),
    "hub_model_id": Case("tester/named", _pushed_to("tester/named"), recipe="hub", context=PUSHING),
    "hub_token": Case(OTHER_TOKEN, _pushed_to("other/{name}"), recipe="hub", context=PUSHING),
    "hub_strategy": Case("checkpoint", _last_checkpoint_pushed, recipe="hub", context=PUSHING),
    "hub_private_repo": Case(True, _private, recipe="hub", context=PUSHING),
    "hub_always_push": Case(True, _pushes_started, recipe="hub", context=PUSHING),
    "hub_revision": Case("dev", _branch, recipe="hub", context=PUSHING),
    "restore_callback_states_from_checkpoint": Case(True, _callback_states, recipe="resume"),
    # reproducibility, device and data
    "full_determinism": Case(True, _determinism, recipe="built"),
    "seed": Case(7, _first_batch_differs),
    "data_seed": Case(7, _first_batch_differs),
    "use_cpu": Case(False, _accelerator, recipe="cuda_lightning"),
    "accelerator_config": Case({"use_seedable_sampler": False}, _seedable_sampler, recipe="built"),
    "dataloader_drop_last": Case(True, _drop_last, recipe="ragged", context=ONE_EPOCH),
    "dataloader_num_workers": Case(1, _dataloader_attribute("num_workers", 0, 1), recipe="built"),
    "dataloader_pin_memory": Case(
        False, _dataloader_attribute("pin_memory", True, False), recipe="built", context={"use_cpu": False}
    ),
    "dataloader_persistent_workers": Case(
        True, _dataloader_attribute("persistent_workers", False, True), recipe="built", context=ONE_WORKER
    ),
    "dataloader_prefetch_factor": Case(
        4, _dataloader_attribute("prefetch_factor", 2, 4), recipe="built", context=ONE_WORKER
    ),
    "dataloader_multiprocessing_context": Case(
        "spawn", _start_method, recipe="built", context=ONE_WORKER
    ),
    "dataloader_in_order": Case(False, _dataloader_attribute("in_order", True, False), recipe="built", context=ONE_WORKER),
    "remove_unused_columns": Case(False, _extra_column, recipe="extra_column"),
    "label_names": Case(["x"], _label_names, recipe="predict"),
    "train_sampling_strategy": Case("sequential", _sequential),
    # strategies (no process group on CPU here: the strategy objects the engine builds are observed)
    "fsdp": Case("full_shard", _strategy_class("MicroBatchDDPStrategy", "HFFSDP2Strategy"), recipe="ddp_strategy"),
    # dp_shard_size over both processes: FSDP2 on ModelParallelStrategy's mesh instead of DDP.
    "parallelism_config": Case(
        ParallelismConfig(dp_shard_size=2),
        _strategy_class("MicroBatchDDPStrategy", "HFFSDP2Strategy"),
        recipe="ddp_strategy",
    ),
    "fsdp_config": Case(
        {"reshard_after_forward": False}, _reshard, recipe="ddp_strategy", context={"fsdp": "full_shard"}
    ),
    "deepspeed": Case(
        {"zero_optimization": {"stage": 2}}, _strategy_class("str", "HFDeepSpeedStrategy"),
        recipe="cuda_strategy", context={"use_cpu": False},
    ),
    "ddp_find_unused_parameters": Case(False, _ddp_kwarg("find_unused_parameters", True, False), recipe="ddp_strategy"),
    "ddp_bucket_cap_mb": Case(5, _ddp_kwarg("bucket_cap_mb", None, 5), recipe="ddp_strategy"),
    "ddp_broadcast_buffers": Case(False, _ddp_kwarg("broadcast_buffers", None, False), recipe="ddp_strategy"),
    "ddp_static_graph": Case(True, _ddp_kwarg("static_graph", None, True), recipe="ddp_strategy"),
    "ddp_backend": Case("gloo", _ddp_backend, recipe="ddp_strategy"),
    "ddp_timeout": Case(60, _ddp_timeout, recipe="ddp_strategy"),
    "debug": Case("underflow_overflow", _refused, recipe="refusal", refused=True),  # no debug option is supported
    "skip_memory_metrics": Case(False, _memory_metrics),
    # Seq2SeqTrainingArguments
    "predict_with_generate": Case(True, _generated, recipe="seq2seq"),
    "generation_max_length": Case(4, _generation_length, recipe="seq2seq", context={"predict_with_generate": True}),
    "generation_num_beams": Case(
        2, _generation_kwarg("num_beams", 2), recipe="seq2seq", context={"predict_with_generate": True}
    ),
}


# ---------------------------------------------------------------- running the cases


def _args_class(case: Case) -> type:
    return Seq2SeqTrainingArguments if case.recipe in SEQ2SEQ_RECIPES else TrainingArguments


def _arguments(name: str, case: Case, changed: bool) -> dict[str, Any]:
    kwargs = {**BASE_ARGS, **case.context}
    if changed:
        kwargs[name] = case.value
    return kwargs


@pytest.fixture(scope="module")
def run_of(tmp_path_factory):
    """Runs by (recipe, arguments, patches), each made once per module: cases share their base runs."""
    cache: dict[tuple, Run] = {}

    def get(name: str, case: Case, changed: bool) -> Run:
        kwargs = _arguments(name, case, changed)
        out_dir = tmp_path_factory.mktemp(case.recipe)
        if name == "output_dir" and changed:
            kwargs.pop("output_dir")
            out_dir = out_dir / "moved"
        key = (case.recipe, repr(sorted(kwargs.items())), repr(case.patches), name == "output_dir" and changed)
        if key not in cache:
            # Recipes that observe whether the trainer creates its output directory get one not yet made.
            target = out_dir / "out" if case.recipe in ("second_process",) else out_dir
            cache[key] = execute(case.recipe, kwargs, target, case.patches)
        return cache[key]

    return get


@pytest.mark.parametrize("name", sorted(CASES))
def test_changing_the_field_alone_changes_the_run(name, run_of):
    case = CASES[name]
    base, changed = run_of(name, case, False), run_of(name, case, True)
    case.check(base, changed)


# ---------------------------------------------------------------- coverage


def _translate(name: str, case: Case, changed: bool):
    kwargs = {"output_dir": "unused", **_arguments(name, case, changed)}
    with pytest.MonkeyPatch.context() as mp:
        for target, value in case.patches:
            mp.setattr(target, value)
        args = _args_class(case)(**kwargs)
    return translate(args, env=RECIPE_ENV.get(case.recipe, Environment()), raise_on_refusal=False)


def test_every_honoured_field_has_a_case():
    defaults = {"output_dir": "unused", "use_cpu": True, "report_to": "none"}
    honoured: set[str] = set()
    for plan in (translate(TrainingArguments(**defaults)), translate(Seq2SeqTrainingArguments(**defaults))):
        honoured |= {name for name, note in plan.notes.items() if note.status == "honoured"}
    for name, case in CASES.items():
        if _translate(name, case, True).notes[name].status == "honoured":
            honoured.add(name)
    assert sorted(honoured - set(CASES)) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_case_changes_a_field_the_registry_honours(name):
    case = CASES[name]
    expected = "refused" if case.refused else "honoured"
    assert _translate(name, case, True).notes[name].status == expected
