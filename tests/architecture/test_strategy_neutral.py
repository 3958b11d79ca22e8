"""`checkpoint/` and `evaluation/` never ask which strategy runs: they call the strategy's checkpoint I/O
(`strategies/checkpoint_io.py`, chosen in `strategies/build.py`) and what evaluation needs to know of it
(`strategies/evaluation.py`). So they import no strategy-specific module and read no strategy flag."""

from __future__ import annotations

import ast

from tests.architecture.test_import_cycles import ROOT, import_graph

STRATEGY_NEUTRAL = {
    "hf_lightning.strategies.build",
    "hf_lightning.strategies.checkpoint_io",
    "hf_lightning.strategies.evaluation",
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
