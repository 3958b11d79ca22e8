"""One source of truth per setting: a field a plan section carries (`translation/handler_table.py`'s
`CARRIED_FIELDS`) is read from the plan, never from the arguments, outside `args/` and `translation/`.

The documented exceptions read the arguments on purpose:
- `callbacks/`: the reference's `TrainerCallback` API hands each callback the arguments, and user and library
  callbacks (and ours, which they subclass) read them there;
- `engine/input_checks.py`: the construction checks look at the arguments themselves (a combination the reference
  refuses), before and beside the plan.
Two single reads are pinned in `EXCEPTIONS` with their reason.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from transformers import TrainingArguments

from hf_lightning.translation.handler_table import CARRIED_FIELDS as SECTION_FIELDS
from hf_lightning.translation.plan import ModuleSettings
from tests.architecture.test_import_cycles import ROOT

ALLOWED_PLACES = ("args/", "translation/", "callbacks/", "engine/input_checks.py")
# The training section (`plan.module`) carries the arguments of the same name.
_ARGUMENT_NAMES = {item.name for item in dataclasses.fields(TrainingArguments)}
CARRIED_FIELDS = {
    **{item.name: ("module", item.name) for item in dataclasses.fields(ModuleSettings) if item.name in _ARGUMENT_NAMES},
    **SECTION_FIELDS,
}
# (module, field): why this one read of the arguments stays.
EXCEPTIONS = {
    ("trainer/trainer.py", "neftune_noise_alpha"): "the construction checks run before the arguments are translated",
    ("optim/extras.py", "gradient_accumulation_steps"): (
        "the reference's static `get_optimizer_cls_and_kwargs(args, model)` checks the arguments it is given "
        "(the accumulation planned from accelerator_config is written back to them before the optimizer is made)"
    ),
}


def argument_reads(source: str) -> list[tuple[int, str]]:
    """(line, field) of each read of a carried field on arguments: `args.x`, `<obj>.args.x`, `getattr(args, "x")`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in CARRIED_FIELDS and isinstance(node.ctx, ast.Load):
            receiver = node.value
            if (isinstance(receiver, ast.Name) and receiver.id == "args") or (
                isinstance(receiver, ast.Attribute) and receiver.attr == "args"
            ):
                found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in CARRIED_FIELDS:
                target = ast.unparse(node.args[0])
                if target == "args" or target.endswith(".args"):
                    found.append((node.lineno, node.args[1].value))
    return found


def test_no_carried_field_is_read_on_the_arguments_outside_the_allowed_places():
    reads = [
        f"{path.relative_to(ROOT.parent)}:{line}: args.{field} (read plan.{'.'.join(CARRIED_FIELDS[field])})"
        for path in sorted(ROOT.rglob("*.py"))
        if not str(path.relative_to(ROOT)).startswith(ALLOWED_PLACES)
        for line, field in argument_reads(path.read_text(encoding="utf-8"))
        if (str(path.relative_to(ROOT)), field) not in EXCEPTIONS
    ]
    assert not reads, "carried fields read on the arguments:\n" + "\n".join(reads)


def test_the_scan_sees_every_form_of_read():
    source = (
        "def f(trainer, args):\n"
        "    a = trainer.args.save_total_limit\n"
        "    b = args.push_to_hub\n"
        "    c = getattr(self.args, 'eval_on_start', False)\n"
        "    d = trainer.plan.checkpointing.save_total_limit\n"
        "    args.save_strategy = 'no'\n"
    )
    assert argument_reads(source) == [(2, "save_total_limit"), (3, "push_to_hub"), (4, "eval_on_start")]


def test_the_training_section_is_covered():
    assert CARRIED_FIELDS["gradient_accumulation_steps"] == ("module", "gradient_accumulation_steps")
    assert CARRIED_FIELDS["max_grad_norm"] == ("module", "max_grad_norm")


def test_each_exception_is_still_a_read():
    for (module, field) in EXCEPTIONS:
        reads = argument_reads((ROOT / module).read_text(encoding="utf-8"))
        assert field in {name for _, name in reads}, f"{module} no longer reads args.{field}: drop the exception"


def test_the_allowed_places_exist():
    assert all((ROOT / place).exists() for place in ALLOWED_PLACES)
    assert Path(ROOT / "translation" / "handler_table.py").is_file()
