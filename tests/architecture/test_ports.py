"""The components' ports describe the real facade: each port's methods exist on `HFLightningTrainer` with the same
parameters, each of its attributes is set somewhere in the package (or is a member of the facade's class), and the
components that take the trainer type it by their port, not by `Any`."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from hf_lightning.checkpoint.resume import CallbackStateOwner, ResumeHooks, ResumeRun
from hf_lightning.checkpoint.resume_files import ResumeFilesSource
from hf_lightning.core.blocked_time import TelemetryOwner
from hf_lightning.engine.accelerator.ports import AcceleratorOwner
from hf_lightning.engine.guard_snapshot import SnapshotSource
from hf_lightning.engine.input_checks import ConstructorArguments
from hf_lightning.engine.jit_checkpoint import JITOwner
from hf_lightning.engine.logging_connector import LoggedRun, LogHooks
from hf_lightning.engine.loss import ItemCountSource
from hf_lightning.engine.module import ModuleRun, StepHooks
from hf_lightning.engine.run_guard import GuardedTrainer
from hf_lightning.engine.signals import SignalOwner
from hf_lightning.engine.telemetry.meter import MeteredTrainer
from hf_lightning.engine.training_banner import BannerSource
from hf_lightning.engine.training_run import RunFacade, TrainingRun
from hf_lightning.trainer.trainer import HFLightningTrainer

ROOT = Path(__file__).resolve().parents[2] / "hf_lightning"

TRAINER_PORTS = [
    AcceleratorOwner, BannerSource, CallbackStateOwner, ConstructorArguments, GuardedTrainer, ItemCountSource,
    JITOwner, LogHooks, MeteredTrainer, ResumeFilesSource, ResumeHooks, RunFacade, SignalOwner, SnapshotSource,
    StepHooks, TelemetryOwner,
]  # fmt: skip
RUN_PORTS = [LoggedRun, ModuleRun, ResumeRun]

# The modules whose functions took the facade as `Any` or as the wide `TrainerLike` (issue 49, point 2).
PORTED_MODULES = [
    "engine/accelerator/accelerator.py", "engine/accelerator/collectives.py", "engine/accelerator/dataloader.py",
    "engine/accelerator/state.py", "engine/accelerator/process_control.py", "engine/training_run.py",
    "engine/module.py", "engine/signals.py", "engine/training_banner.py", "engine/logging_connector.py",
    "engine/jit_checkpoint.py", "engine/interrupt_report.py", "engine/run_guard.py", "engine/guard_snapshot.py",
    "engine/loss.py", "engine/input_checks.py", "engine/telemetry/flops.py", "engine/telemetry/meter.py",
    "checkpoint/resume.py", "checkpoint/resume_files.py", "core/blocked_time.py",
]  # fmt: skip
TRAINER_NAMES = ("trainer", "facade", "owner")


def _members(port: type) -> tuple[dict[str, object], list[str]]:
    """The port's methods and properties (its own and its bases'), and its annotated attributes."""
    methods: dict[str, object] = {}
    attributes: list[str] = []
    for klass in reversed(port.__mro__):
        if klass is object or not getattr(klass, "_is_protocol", False):
            continue
        attributes += [name for name in vars(klass).get("__annotations__", {}) if name not in attributes]
        for name, value in vars(klass).items():
            if (inspect.isfunction(value) or isinstance(value, property)) and not name.startswith("__"):
                methods[name] = value
    return methods, attributes


def _assigned_attribute_names() -> set[str]:
    names = set()
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                        if isinstance(element, ast.Attribute):
                            names.add(element.attr)
    return names


@pytest.mark.parametrize("port", TRAINER_PORTS, ids=lambda port: port.__name__)
def test_every_port_method_is_a_facade_method_with_the_same_parameters(port):
    methods, _ = _members(port)
    for name, value in methods.items():
        ours = inspect.getattr_static(HFLightningTrainer, name, None)
        assert ours is not None, f"{port.__name__}.{name}: HFLightningTrainer has no {name}"
        if isinstance(value, property):
            assert isinstance(ours, property), f"{port.__name__}.{name} is a property, the facade's is not"
            continue
        expected = list(inspect.signature(value).parameters)
        assert list(inspect.signature(ours).parameters) == expected, f"{port.__name__}.{name}"


@pytest.mark.parametrize("port", TRAINER_PORTS, ids=lambda port: port.__name__)
def test_every_port_attribute_is_set_on_the_facade(port):
    _, attributes = _members(port)
    assert attributes, f"{port.__name__} names no attribute"
    assigned = _assigned_attribute_names()
    missing = [name for name in attributes if name not in assigned and not hasattr(HFLightningTrainer, name)]
    assert missing == [], f"{port.__name__}: never set on the facade: {missing}"


@pytest.mark.parametrize("port", RUN_PORTS, ids=lambda port: port.__name__)
def test_every_run_port_attribute_is_set_by_the_training_run(port):
    source = (ROOT / "engine" / "training_run.py").read_text(encoding="utf-8")
    set_in_run = {
        element.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        for element in (target.elts if isinstance(target, ast.Tuple) else [target])
        if isinstance(element, ast.Attribute) and isinstance(element.value, ast.Name) and element.value.id == "self"
    }
    _, attributes = _members(port)
    assert attributes and [name for name in attributes if name not in set_in_run] == [], port.__name__
    assert TrainingRun.__init__.__annotations__["facade"] == "RunFacade"


def test_the_ported_components_type_the_trainer_by_their_port():
    found = []
    for relative in PORTED_MODULES:
        tree = ast.parse((ROOT / relative).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            for argument in arguments:
                if argument.arg not in TRAINER_NAMES:
                    continue
                annotation = "" if argument.annotation is None else ast.unparse(argument.annotation)
                if annotation in ("", "Any", "TrainerLike") or "Any" in annotation.split(" | "):
                    found.append(f"{relative}:{node.lineno} {node.name}({argument.arg}: {annotation or '?'})")
    assert found == [], "components taking the trainer untyped:\n" + "\n".join(found)
    assert not (ROOT / "core" / "protocols.py").exists(), "the wide TrainerLike port is gone"
