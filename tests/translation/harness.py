"""Tiny, instrumented runs for the per-field tests: one recipe per kind of observation.

A run is built from `BASE_ARGS` plus a case's context and (for the changed side) the field's value; it records
what the observations need: the log history, files, the batches the model saw, dtypes, spied calls, and the
objects the run built. Global switches a field may flip (determinism, verbosity, TF32, environment variables)
are restored after every run so that runs stay independent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from hf_lightning import Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer, TrainerCallback, TrainingArguments
from hf_lightning.callbacks.state import ExportableState
from hf_lightning.strategies.build import build_strategy
from hf_lightning.translation.environment import Environment
from hf_lightning.translation.translate import translate
from tests.models import (
    ListDataset,
    RegressionMLP,
    classification_data,
    make_tiny_bert_classifier,
    make_tiny_t5,
    pad_seq2seq_batch,
    regression_data,
    seq2seq_data,
)

BASE_ARGS: dict[str, Any] = {
    "use_cpu": True,
    "report_to": "none",
    "disable_tqdm": True,
    "save_strategy": "no",
    "per_device_train_batch_size": 4,
    "per_device_eval_batch_size": 3,
    "max_steps": 4,
    "logging_steps": 1,
    "learning_rate": 1e-2,
}
TRAIN_SIZE = 24  # 6 batches of 4 per epoch
EVAL_SIZE = 8  # 3 eval batches of 3
DDP_ENV = Environment(world_size=2, local_world_size=2, is_distributed_launch=True)
CUDA_ENV = Environment(cuda_available=True, cuda_device_count=1, installed_packages=frozenset({"deepspeed"}))


# ---------------------------------------------------------------- models and data


class Probe(RegressionMLP):
    """The regression MLP, recording the dtype of every forward's output."""

    main_input_name = "x"

    def __init__(self) -> None:
        torch.manual_seed(0)
        super().__init__()
        self.dtypes: set[torch.dtype] = set()

    def forward(self, x, labels=None):
        # Inputs follow the weights' dtype, so a model cast for full fp16 / bf16 evaluation runs.
        out = super().forward(x.to(self.norm.weight.dtype), labels)
        self.dtypes.add(out["logits"].dtype)
        return out


class NanOnFourthStep(Probe):
    """Its fourth training forward returns a NaN loss (the earlier ones are finite)."""

    def __init__(self) -> None:
        super().__init__()
        self.training_calls = 0

    def forward(self, x, labels=None):
        out = super().forward(x, labels)
        if self.training:
            self.training_calls += 1
            if self.training_calls == 4:
                out["loss"] = out["loss"] * float("nan")
        return out


class FitsThreeSamples(Probe):
    """Raises the out-of-memory error a device raises, for batches larger than 3 samples."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_sizes: list[int] = []

    def forward(self, x, labels=None):
        self.batch_sizes.append(len(x))
        if len(x) > 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().forward(x, labels)


class Classifier(nn.Module):
    """Three classes from four features, cross-entropy loss."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 3)

    def forward(self, x, labels=None):
        logits = self.linear(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


def class_data(n: int = TRAIN_SIZE) -> ListDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    labels = torch.randint(0, 3, (n,), generator=generator)
    return ListDataset([{"x": x[i], "labels": labels[i]} for i in range(n)])


def adverse_eval_data() -> ListDataset:
    """Eval labels of the opposite sign: the more the model learns, the larger its eval loss."""
    return ListDataset([{"x": item["x"], "labels": -item["labels"]} for item in regression_data(EVAL_SIZE, seed=1)])


def with_extra_column(dataset: ListDataset) -> ListDataset:
    return ListDataset([{**item, "extra": torch.tensor(1.0)} for item in dataset.items])


class RecordingCollator:
    """Stacks dict items (as the default collator) and records each batch's labels, in order."""

    def __init__(self) -> None:
        self.batches: list[list[float]] = []

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        batch = {key: torch.stack([f[key] for f in features]) for key in features[0]}
        if "labels" in batch:
            self.batches.append(batch["labels"].tolist())
        return batch


class StepCounter(TrainerCallback, ExportableState):
    """A stateful callback counting optimizer steps; its count is stored in checkpoints."""

    def __init__(self, start: int = 0) -> None:
        self.count = start

    def on_step_end(self, args, state, control, **kwargs):
        self.count += 1

    def state(self) -> dict:
        return {"args": {"start": 0}, "attributes": {"count": self.count}}


# ---------------------------------------------------------------- what a run records


@dataclass
class Run:
    """What one run did and built."""

    out_dir: Path
    trainer: Any = None
    output: Any = None
    error: BaseException | None = None
    model: Any = None
    batches: list[list[float]] = field(default_factory=list)
    initial_params: dict[str, torch.Tensor] = field(default_factory=dict)
    compile_calls: list[dict] = field(default_factory=list)
    cache_clears: int = 0
    to_cpu_moves: int = 0
    metric_calls: list[dict] = field(default_factory=list)
    generate_calls: list[dict] = field(default_factory=list)
    verbosity: int | None = None
    deterministic: bool | None = None
    fp32_precision: str | None = None
    lightning_kwargs: dict | None = None
    strategy: Any = None
    predictions: Any = None
    callback_counts: list[int] = field(default_factory=list)
    gathers: list[str] = field(default_factory=list)
    hub: Any = None  # the test Hub's record of a "hub" recipe run (HubRecord)
    wait_status: int | None = None

    @property
    def log_history(self) -> list[dict]:
        return list(self.trainer.state.log_history)

    def logged(self, key: str) -> dict[int, float]:
        """step -> value of `key`, over the log entries that hold it."""
        return {entry["step"]: entry[key] for entry in self.log_history if key in entry}

    def checkpoints(self) -> list[str]:
        """The checkpoint-N folders in the output directory, by step."""
        return sorted((p.name for p in self.out_dir.glob("checkpoint-*")), key=lambda n: int(n.split("-")[1]))

    def final_params(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.trainer.model.state_dict().items()}

    def moved(self) -> float:
        """Total parameter distance travelled from the initial weights."""
        final = self.final_params()
        return float(sum((final[k] - self.initial_params[k]).norm() ** 2 for k in final) ** 0.5)


class _Captured(Exception):
    def __init__(self, kwargs: dict) -> None:
        super().__init__("lightning.Trainer construction captured")
        self.kwargs = kwargs


@contextlib.contextmanager
def _restored_global_state() -> Iterator[None]:
    import transformers

    environ = dict(os.environ)
    deterministic = torch.are_deterministic_algorithms_enabled()
    verbosity = transformers.logging.get_verbosity()
    levels = {name: logging.getLogger(name).level for name in ("hf_lightning", "transformers")}
    precision = getattr(torch.backends, "fp32_precision", None)
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    # Each run starts from transformers' default verbosity: an earlier test's trainer with log_level="debug" sets
    # it for the whole process (as the reference's does), which would make the base run's verbosity depend on
    # the test order.
    transformers.logging.set_verbosity(transformers.logging.WARNING)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(environ)
        torch.use_deterministic_algorithms(deterministic)
        transformers.logging.set_verbosity(verbosity)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        if precision is not None:
            torch.backends.fp32_precision = precision
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


def _instrument(mp: pytest.MonkeyPatch, run: Run) -> None:
    """Spies on the calls some fields make and nothing else observes on CPU."""
    import hf_lightning.trainer.step_methods as step_methods
    from hf_lightning.evaluation.helpers import EvalLoopContainer

    def fake_compile(model, **kwargs):
        run.compile_calls.append(kwargs)
        return model

    def count_clear() -> None:
        run.cache_clears += 1

    to_cpu = EvalLoopContainer.to_cpu_and_numpy

    def count_to_cpu(self) -> None:
        run.to_cpu_moves += self.tensors is not None
        to_cpu(self)

    mp.setattr(torch, "compile", fake_compile)
    mp.setattr(step_methods, "empty_device_cache", count_clear)
    mp.setattr(EvalLoopContainer, "to_cpu_and_numpy", count_to_cpu)


def _metrics_spy(run: Run) -> Callable:
    def compute_metrics(prediction, compute_result: bool | None = None) -> dict[str, float]:
        run.metric_calls.append({"inputs": prediction.inputs, "compute_result": compute_result})
        return {"calls": float(len(run.metric_calls))}

    return compute_metrics


# ---------------------------------------------------------------- recipes


def _trainer(run: Run, args_kwargs: dict, model: nn.Module, **kwargs: Any) -> Trainer:
    args = TrainingArguments(output_dir=str(run.out_dir), **args_kwargs)
    collator = RecordingCollator()
    run.model = model
    run.initial_params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer = Trainer(model=model, args=args, data_collator=collator, **kwargs)
    run.batches = collator.batches
    run.trainer = trainer
    run.verbosity = _verbosity()
    run.deterministic = torch.are_deterministic_algorithms_enabled()
    run.fp32_precision = getattr(torch.backends, "fp32_precision", None)
    return trainer


def _verbosity() -> int:
    import transformers

    return transformers.logging.get_verbosity()


def _train(run: Run, kw: dict, model: nn.Module | None = None, data: Any = None) -> None:
    trainer = _trainer(run, kw, model or Probe(), train_dataset=data or regression_data(TRAIN_SIZE))
    run.output = trainer.train()


def recipe_train(run: Run, kw: dict) -> None:
    _train(run, kw)


def recipe_ragged(run: Run, kw: dict) -> None:
    _train(run, kw, data=regression_data(TRAIN_SIZE + 2))


def recipe_nan(run: Run, kw: dict) -> None:
    _train(run, kw, model=NanOnFourthStep())


def recipe_classify(run: Run, kw: dict) -> None:
    _train(run, kw, model=Classifier(), data=class_data())


def recipe_hf(run: Run, kw: dict) -> None:
    trainer = Trainer(
        model=make_tiny_bert_classifier(), args=TrainingArguments(output_dir=str(run.out_dir), **kw),
        train_dataset=classification_data(TRAIN_SIZE),
    )
    run.trainer, run.model = trainer, trainer.model
    run.output = trainer.train()


def recipe_oom(run: Run, kw: dict) -> None:
    try:
        _train(run, kw, model=FitsThreeSamples())
    except torch.OutOfMemoryError as error:
        run.error = error


def recipe_eval(run: Run, kw: dict) -> None:
    trainer = _trainer(
        run, kw, Probe(), train_dataset=regression_data(TRAIN_SIZE), eval_dataset=regression_data(EVAL_SIZE, seed=1)
    )
    run.output = trainer.train()


def recipe_eval_adverse(run: Run, kw: dict) -> None:
    trainer = _trainer(run, kw, Probe(), train_dataset=regression_data(TRAIN_SIZE), eval_dataset=adverse_eval_data())
    run.output = trainer.train()


def recipe_predict(run: Run, kw: dict) -> None:
    trainer = _trainer(run, kw, Probe(), compute_metrics=_metrics_spy(run))
    run.predictions = trainer.predict(regression_data(EVAL_SIZE, seed=1))


def recipe_built(run: Run, kw: dict) -> None:
    """Construction only: the trainer, its dataloaders and the switches it set."""
    _trainer(run, kw, Probe(), train_dataset=regression_data(TRAIN_SIZE), eval_dataset=regression_data(EVAL_SIZE))


def recipe_extra_column(run: Run, kw: dict) -> None:
    _trainer(run, kw, Probe(), train_dataset=with_extra_column(regression_data(TRAIN_SIZE)))


def recipe_refusal(run: Run, kw: dict) -> None:
    try:
        recipe_built(run, kw)
    except ValueError as error:
        run.error = error


def recipe_second_process(run: Run, kw: dict) -> None:
    """Construction as rank 1 of two, the main process of the second node (not of node 0)."""
    os.environ.update({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    recipe_built(run, kw)


def recipe_replica(run: Run, kw: dict) -> None:
    """Construction as rank 1 of two on one node: a replica, which does not log."""
    os.environ.update({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    recipe_built(run, kw)


def _capture_lightning(run: Run, kw: dict, env: Environment, mp: pytest.MonkeyPatch) -> None:
    """train() up to the `lightning.Trainer` construction, in `env`; its kwargs are recorded."""

    def capture(**kwargs):
        raise _Captured(kwargs)

    mp.setattr(Environment, "detect", lambda *_: env)
    mp.setattr(pl, "Trainer", capture)
    trainer = _trainer(run, kw, Probe(), train_dataset=regression_data(TRAIN_SIZE))
    with pytest.raises(_Captured) as captured:
        trainer.train()
    run.lightning_kwargs = captured.value.kwargs


def recipe_cuda_lightning(run: Run, kw: dict, mp: pytest.MonkeyPatch) -> None:
    _capture_lightning(run, kw, CUDA_ENV, mp)


def recipe_gather(run: Run, kw: dict, mp: pytest.MonkeyPatch) -> None:
    """predict() as if in a process group of one, with the cross-process gathers spied on (identity)."""
    import hf_lightning.strategies.distributed as distributed

    def spy(kind: str) -> Callable:
        def gather(data: Any) -> Any:
            run.gathers.append(kind)
            return data

        return gather

    mp.setattr(distributed, "is_distributed", lambda: True)
    mp.setattr(distributed, "gather", spy("tensors"))
    mp.setattr(distributed, "gather_object", spy("objects"))
    mp.setattr(distributed, "pad_across_processes", lambda tensor, **_: tensor)
    mp.setattr(distributed, "ensure_process_group", lambda *_: False)
    recipe_predict(run, kw)


def recipe_ddp_strategy(run: Run, kw: dict) -> None:
    """translate() in a two-process launch and the strategy the engine builds from it."""
    run.strategy = build_strategy(translate(TrainingArguments(output_dir=str(run.out_dir), **kw), env=DDP_ENV), Probe())


def recipe_cuda_strategy(run: Run, kw: dict) -> None:
    run.strategy = build_strategy(translate(TrainingArguments(output_dir=str(run.out_dir), **kw), env=CUDA_ENV), Probe())


def _resume(run: Run, kw: dict, counter: StepCounter) -> Trainer:
    kw = {**kw, "save_strategy": "steps", "save_steps": 2}
    first = RecordingCollator()
    args = TrainingArguments(output_dir=str(run.out_dir / "first"), **kw)
    Trainer(model=Probe(), args=args, data_collator=first, train_dataset=regression_data(TRAIN_SIZE),
            callbacks=[StepCounter()]).train()
    trainer = _trainer(run, kw, Probe(), train_dataset=regression_data(TRAIN_SIZE), callbacks=[counter])
    run.output = trainer.train(resume_from_checkpoint=str(run.out_dir / "first" / "checkpoint-2"))
    run.predictions = first.batches  # the uninterrupted run's batches
    return trainer


def recipe_resume(run: Run, kw: dict) -> None:
    trainer = _resume(run, kw, StepCounter())
    run.callback_counts = [cb.count for cb in trainer.callback_handler.callbacks if isinstance(cb, StepCounter)]


def recipe_seq2seq(run: Run, kw: dict) -> None:
    model = make_tiny_t5()
    generate = model.generate

    def spy(*args, **kwargs):
        run.generate_calls.append(kwargs)
        return generate(*args, **kwargs)

    model.generate = spy
    args = Seq2SeqTrainingArguments(output_dir=str(run.out_dir), **kw)
    trainer = Seq2SeqTrainer(model=model, args=args, data_collator=pad_seq2seq_batch)
    run.trainer, run.model = trainer, model
    run.predictions = trainer.predict(seq2seq_data(4))


@dataclass
class HubRecord:
    """What a run left on the test Hub: its commits, repos (id -> private), trees and started pushes."""

    commits: list
    private: dict[str, bool]
    trees: dict[str, dict[str, dict[str, bytes]]]
    pushes: int


def recipe_hub(run: Run, kw: dict, mp: pytest.MonkeyPatch) -> None:
    """Train while pushing to the test Hub; the first push is held until training ends (hub_always_push shows)."""
    from huggingface_hub import HfApi

    from tests.integrations.hub_server import HoldCommitsDuringTraining, point_hub_at, shared_server

    server = shared_server()
    server.state.reset()
    point_hub_at(server, mp)
    if kw.get("hub_revision"):  # the branch exists beforehand, as a user of hub_revision prepares it
        repo_id = HfApi().create_repo(kw.get("hub_model_id") or run.out_dir.name, exist_ok=True).repo_id
        HfApi().create_branch(repo_id, branch=kw["hub_revision"])
    trainer = _trainer(run, kw, Probe(), train_dataset=regression_data(TRAIN_SIZE),
                       callbacks=[HoldCommitsDuringTraining(server)])
    run.output = trainer.train()
    state = server.state
    with state.lock:
        repos = dict(state.repos)
        run.hub = HubRecord(
            commits=list(state.commits),
            private={repo_id: repo.private for repo_id, repo in repos.items()},
            trees={
                repo_id: {branch: dict(repo.trees[sha]) for branch, sha in repo.branches.items()}
                for repo_id, repo in repos.items()
            },
            pushes=sum("/preupload/" in path for _, path in state.requests),
        )
class SigtermAtStep(TrainerCallback):
    """Sends this process SIGTERM at the end of step `step`."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def recipe_sigterm(run: Run, kw: dict) -> None:
    """Training in a forked child that receives SIGTERM at the end of step 2; its wait status is recorded."""
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            torch.set_num_threads(1)  # the parent's OpenMP team does not exist in a forked child
            _trainer(run, kw, Probe(), train_dataset=regression_data(TRAIN_SIZE), callbacks=[SigtermAtStep(2)]).train()
        finally:
            os._exit(0)
    _, run.wait_status = os.waitpid(child, 0)


RECIPES: dict[str, Callable] = {
    name.removeprefix("recipe_"): function for name, function in globals().items() if name.startswith("recipe_")
}
NEEDS_MONKEYPATCH = {"cuda_lightning", "gather", "hub"}
SEQ2SEQ_RECIPES = {"seq2seq"}
# Recipes whose runs translate in an environment other than this process's.
RECIPE_ENV: dict[str, Environment] = {
    "ddp_strategy": DDP_ENV,
    "cuda_strategy": CUDA_ENV,
    "cuda_lightning": CUDA_ENV,
    "second_process": Environment(world_size=2, num_nodes=2, process_index=1, is_distributed_launch=True),
    "replica": Environment(world_size=2, local_world_size=2, process_index=1, is_distributed_launch=True),
}


def execute(recipe: str, kw: dict, out_dir: Path, patches: tuple[tuple[str, Any], ...] = ()) -> Run:
    """Run `recipe` with the arguments `kw` into `out_dir`, instrumented, global state restored after."""
    run = Run(out_dir=out_dir)
    with _restored_global_state(), pytest.MonkeyPatch.context() as mp:
        _instrument(mp, run)
        for target, value in patches:
            mp.setattr(target, value)
        if recipe in NEEDS_MONKEYPATCH:
            RECIPES[recipe](run, kw, mp)
        else:
            RECIPES[recipe](run, kw)
    return run
