"""`checkpoint/` and `evaluation/` never ask which strategy runs: they call the strategy's checkpoint I/O
(`strategies/checkpoint_io.py`, chosen in `strategies/build.py`) and what evaluation needs to know of it
(`strategies/for_evaluation.py`). So they import no strategy-specific module and read no strategy flag."""

from __future__ import annotations

import ast

from tests.architecture.test_import_cycles import ROOT, import_graph

STRATEGY_NEUTRAL = {
    "hf_lightning.strategies.build",
    "hf_lightning.strategies.checkpoint_io",
    "hf_lightning.strategies.for_evaluation",
    "hf_lightning.strategies.distributed",
    # Every layout's states read into one form, whichever strategy wrote them (resume's checks, consolidate).
    "hf_lightning.strategies.portable_state",
}
STRATEGY_FLAGS = {"is_deepspeed_enabled", "is_fsdp_enabled", "is_fsdp_plan", "is_tp_sharded", "trainer_tp_size"}
NEUTRAL_SUBPACKAGES = ("checkpoint", "evaluation")


def _neutral_modules() -> dict[str, dict[str, int]]:
    return {
        module: targets
        for module, targets in import_graph().items()
        if module.split(".")[1:2] and module.split(".")[1] in NEUTRAL_SUBPACKAGES
    }


def test_checkpoint_and_evaluation_import_only_strategy_neutral_modules():
    found = [
        f"{module}:{line} imports {target}"
        for module, targets in _neutral_modules().items()
        for target, line in targets.items()
        if target.startswith("hf_lightning.strategies.") and target not in STRATEGY_NEUTRAL
    ]
    assert not found, "strategy-specific imports (ask the strategy's checkpoint I/O instead):\n" + "\n".join(found)


def test_checkpoint_and_evaluation_read_no_strategy_flag():
    found = []
    for subpackage in NEUTRAL_SUBPACKAGES:
        for path in sorted((ROOT / subpackage).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
                if name is None and isinstance(node, ast.Constant) and isinstance(node.value, str):
                    name = node.value  # getattr(trainer, "is_fsdp_enabled", ...)
                if name in STRATEGY_FLAGS:
                    found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} reads {name}")
    assert not found, "strategy branches:\n" + "\n".join(found)


# ---- engine/ asks the strategy's steps, never which strategy runs ----------------------------------------------

ENGINE_FACADE_FLAGS = {"is_deepspeed_enabled", "is_fsdp_enabled"}  # the reference's attributes: set, never read
# `trainer_tp_size` stays allowed: the tensor-parallel size is the process layout accelerate's surface reports.
STRATEGY_KIND_NAMES = STRATEGY_FLAGS - ENGINE_FACADE_FLAGS - {"trainer_tp_size"} | {
    "is_fsdp1_model",
    "is_fsdp2_model",
    "is_deepspeed_engine",
    "DeepSpeedStrategy",
    "FSDPStrategy",
    "ModelParallelStrategy",
    "DDPStrategy",
    "HFDeepSpeedStrategy",
    "HFFSDPStrategy",
    "HFFSDP2Strategy",
    "HFTensorParallelStrategy",
    "MicroBatchDDPStrategy",
    "SingleDeviceStrategy",
}


def _names(path) -> list[tuple[int, str, ast.AST]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute):
            found.append((node.lineno, node.attr, node))
        elif isinstance(node, ast.Name):
            found.append((node.lineno, node.id, node))
        elif isinstance(node, ast.alias):
            found.append((node.lineno, node.name.rsplit(".", 1)[-1], node))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value, node))  # getattr(trainer, "is_fsdp_enabled", ...)
    return found


# The facade's own reads of the reference's flags, where the reference reads them too (not a strategy branch).
FACADE_READS = {
    ("trainer/hp_search_methods.py", "is_deepspeed_enabled"): "the reference's sweep check: DeepSpeed needs args.deepspeed",
}


def test_engine_does_not_branch_on_the_strategy_kind():
    """Clipping, the learning rate, the inputs' dtype, generation's sync and model placement are the strategy's
    (strategies/steps.py); the engine only sets the reference's `is_deepspeed_enabled` / `is_fsdp_enabled`."""
    found = []
    for path in sorted([*(ROOT / "engine").rglob("*.py"), *(ROOT / "trainer").rglob("*.py")]):
        for line, name, node in _names(path):
            where = f"{path.relative_to(ROOT.parent)}:{line}"
            if (path.relative_to(ROOT).as_posix(), name) in FACADE_READS:
                continue
            if name in STRATEGY_KIND_NAMES:
                found.append(f"{where} names {name}")
            elif name in ENGINE_FACADE_FLAGS and not (
                isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            ):
                found.append(f"{where} reads {name}")
    assert not found, "strategy branches in engine/ or trainer/ (ask the plan's StrategySteps instead):\n" + "\n".join(
        found
    )


def _is_facade(node: ast.AST) -> bool:
    """`facade`, `trainer` or `<anything>.facade`: the trainer the strategies must not write on."""
    if isinstance(node, ast.Name):
        return node.id in ("facade", "trainer")
    return isinstance(node, ast.Attribute) and node.attr == "facade"


def test_strategies_write_nothing_on_the_facade():
    """A strategy hands what it built to the LightningModule (`adopt_wrapped_model`, `adopt_optimizer_and_scheduler`,
    `adopt_engine`), which sets the facade's state and the reference's flags."""
    found = []
    for path in sorted((ROOT / "strategies").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(element, ast.Attribute) and _is_facade(element.value):
                        found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} sets .{element.attr}")
    assert not found, "strategies writing on the facade:\n" + "\n".join(found)


# ---- strategies/ take narrow ports, not the whole trainer --------------------------------------------------------

_TRAINER_NAMES = ("trainer", "facade", "owner")
_WIDE_ANNOTATIONS = ("Any", "TrainerLike")


def test_strategies_take_narrow_ports_not_the_trainer():
    """A trainer parameter in `strategies/` is typed by the protocol naming what it uses (strategies/ports.py) or
    Lightning's `pl.Trainer`; never `Any`, `TrainerLike` or nothing; no `getattr(trainer, ...)` guard."""
    found = []
    for path in sorted((ROOT / "strategies").rglob("*.py")):
        where = path.relative_to(ROOT.parent)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                for argument in arguments:
                    if argument.arg not in _TRAINER_NAMES:
                        continue
                    annotation = None if argument.annotation is None else ast.unparse(argument.annotation)
                    if annotation is None or annotation in _WIDE_ANNOTATIONS:
                        found.append(f"{where}:{node.lineno} {node.name}({argument.arg}: {annotation})")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
                target = ast.unparse(node.args[0]) if node.args else ""
                if target.split(".")[0] in _TRAINER_NAMES:
                    found.append(f"{where}:{node.lineno} getattr({target}, ...)")
    assert not found, "wide trainer parameters or guards in strategies/:\n" + "\n".join(found)
