"""Arguments -> a typed `Plan` (`translation/plan.py`) for Lightning. `translate` is pure: no process
group, no model, no side effects; it reads the arguments and an `Environment` snapshot only.

Every field of the arguments gets a `FieldNote` (honoured / refused / warned / not-applicable)
from the registry in `hf_lightning.translation.handler_table`; refusals raise one ValueError listing them.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from hf_lightning.args.process import cpu_switch_on, reference_n_gpu
from hf_lightning.translation.environment import Environment
from hf_lightning.translation.handler_table import FIELD_REGISTRY
from hf_lightning.translation.handlers.core import (
    NOT_APPLICABLE,
    REFUSED,
    Context,
    Decision,
    plain,
)
from hf_lightning.translation.handlers.distributed import select_strategy
from hf_lightning.translation.plan import (
    CheckpointSettings,
    EvaluationSettings,
    FieldNote,
    HubSettings,
    LightningKwargs,
    LoggingSettings,
    ModuleSettings,
    Plan,
    StrategyPlan,
)

__all__ = ["Environment", "FieldNote", "Plan", "explain", "translate"]


def _cpu_requested(args: Any, env: Environment) -> bool:
    """`use_cpu`, or accelerate's `ACCELERATE_USE_CPU` switch (as `TrainingArguments.device` reads it)."""
    return bool(getattr(args, "use_cpu", False)) or cpu_switch_on(env.environ)


def _accelerator(args: Any, env: Environment) -> str:
    if _cpu_requested(args, env):
        return "cpu"
    if env.cuda_available:
        return "gpu"
    if env.mps_available:
        return "mps"
    return "cpu"


def _n_gpu(accelerator: str, env: Environment, strategy_name: str = "single", use_cpu: bool = False) -> int:
    """The reference's `args.n_gpu` (`args/process.py`'s `reference_n_gpu`) for the accelerator chosen, without setting
    up a device. Under DeepSpeed without a launcher the reference's state is the single-process one, so the
    plain rule applies."""
    return reference_n_gpu(
        {"gpu": "cuda"}.get(accelerator, accelerator),
        distributed=env.is_distributed_launch,
        cuda_device_count=env.cuda_device_count,
        deepspeed_launch=strategy_name == "deepspeed" and env.is_distributed_launch and not use_cpu,
    )


def _field_names(args: Any) -> list[str]:
    if dataclasses.is_dataclass(args):
        return [f.name for f in dataclasses.fields(args) if f.init]
    return [name for name in FIELD_REGISTRY if hasattr(args, name)]


def _note_value(name: str, value: Any) -> Any:
    """A display- and compare-safe copy: enums as strings, configs as dicts, tokens redacted."""
    if name.endswith("_token") and value is not None:
        return f"<{name.upper()}>"
    value = plain(value)
    if hasattr(value, "to_dict") and not isinstance(value, Mapping):
        value = value.to_dict()
    try:
        return copy.deepcopy(value)
    except Exception:  # an object that cannot be copied is shown, not kept
        return repr(value)


# The plan's sections beside `module` and `strategy`, each filled from its fields' `Decision` contributions.
_SECTIONS = ("evaluation", "checkpointing", "logging", "hub")


def _merge(
    target: dict[str, Any], update: Mapping[str, Any], field_name: str, what: str, owners: dict[str, str]
) -> None:
    for key, value in update.items():
        if key in owners and target[key] != value:
            raise RuntimeError(
                f"registry bug: {field_name} and {owners[key]} both set {what}[{key!r}] "
                f"({value!r} vs {target[key]!r})"
            )
        owners[key] = field_name
        target[key] = copy.deepcopy(value)


def translate(args: Any, env: Environment | None = None, *, raise_on_refusal: bool = True) -> Plan:
    """Turn `TrainingArguments` (ours or the reference's) into a `Plan`; pure.

    Raises ValueError naming every refused field, its value and what to do instead, unless
    `raise_on_refusal=False` (then the refusals stay in `plan.notes`, for `explain`).
    """
    env = env if env is not None else Environment.detect()
    accelerator = _accelerator(args, env)
    strategy_name = select_strategy(args, env)
    ctx = Context(
        args=args,
        env=env,
        accelerator=accelerator,
        strategy_name=strategy_name,
        n_gpu=_n_gpu(accelerator, env, strategy_name, use_cpu=_cpu_requested(args, env)),
    )
    # Each part is gathered as field name -> value, then typed once every handler has spoken.
    lightning: dict[str, Any] = {}
    module: dict[str, Any] = {}
    strategy: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    owners: dict[str, dict[str, str]] = {name: {} for name in ("lightning", "module", "strategy", *_SECTIONS)}
    loggers: list[dict[str, Any]] = []
    notes: dict[str, FieldNote] = {}

    for name in _field_names(args):
        value = getattr(args, name)
        entry = FIELD_REGISTRY.get(name)
        if entry is None:
            decision = Decision(
                NOT_APPLICABLE, "not a reference field (a subclass's own): hf_lightning does not read it"
            )
        else:
            decision = entry.decide(plain(value), ctx)
        notes[name] = FieldNote(name, _note_value(name, value), decision.status, decision.how)
        if decision.status == REFUSED:
            continue
        _merge(lightning, decision.lightning, name, "lightning", owners["lightning"])
        _merge(module, decision.module, name, "module", owners["module"])
        _merge(strategy, decision.strategy, name, "strategy", owners["strategy"])
        for section in _SECTIONS:
            _merge(sections[section], getattr(decision, section), name, section, owners[section])
        loggers.extend(copy.deepcopy(list(decision.loggers)))

    strategy_plan = None
    if ctx.strategy_name != "single":
        strategy_plan = StrategyPlan(name=ctx.strategy_name, **strategy)
        lightning["strategy"] = ctx.strategy_name
    plan = Plan(
        module=ModuleSettings(**module),
        strategy=strategy_plan,
        lightning=LightningKwargs(**lightning),
        evaluation=EvaluationSettings(**sections["evaluation"]),
        checkpointing=CheckpointSettings(**sections["checkpointing"]),
        logging=LoggingSettings(loggers=tuple(loggers), **sections["logging"]),
        hub=HubSettings(**sections["hub"]),
        notes=notes,
    )
    if raise_on_refusal and plan.refusals():
        lines = [f"  - {note.field}={note.value!r}: {note.how}" for note in plan.refusals()]
        raise ValueError("hf_lightning cannot honour these arguments:\n" + "\n".join(lines))
    return plan


def explain(plan: Plan) -> str:
    """A readable table, one line per field: field, value, status, how."""
    rows = [(note.field, _short(note.value), note.status, note.how) for note in plan.notes.values()]
    headers = ("field", "value", "status", "how")
    widths = [
        max(len(headers[i]), *(len(row[i]) for row in rows)) if rows else len(headers[i]) for i in range(3)
    ]
    lines = [f"{headers[0]:<{widths[0]}}  {headers[1]:<{widths[1]}}  {headers[2]:<{widths[2]}}  {headers[3]}"]
    lines.append("  ".join("-" * width for width in widths) + "  " + "-" * 3)
    for row in rows:
        lines.append(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}")
    return "\n".join(lines) + "\n"


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
