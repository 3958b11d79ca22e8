"""Building blocks shared by the field handlers: statuses, `Decision`, `Context`, `FieldEntry`.

A handler is a pure function `(field, value, ctx) -> Decision`. It says how one argument is
honoured (and what it contributes to the plan), or why it is refused. `translate` merges the
decisions into a `Plan`.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hf_lightning.translation.plan import HONOURED as HONOURED
from hf_lightning.translation.plan import NOT_APPLICABLE as NOT_APPLICABLE
from hf_lightning.translation.plan import REFUSED as REFUSED
from hf_lightning.translation.plan import STATUSES as STATUSES
from hf_lightning.translation.plan import WARNED as WARNED

if TYPE_CHECKING:
    from hf_lightning.translation.environment import Environment


@dataclass(frozen=True)
class Decision:
    """What one field means for the plan: a status, a sentence, and its contributions."""

    status: str
    how: str
    # Field name -> value for `LightningKwargs`, `ModuleSettings`, `StrategyPlan` and the sections
    # `EvaluationSettings`, `CheckpointSettings`, `LoggingSettings`, `HubSettings` (translation/plan.py).
    lightning: Mapping[str, Any] = field(default_factory=dict)
    module: Mapping[str, Any] = field(default_factory=dict)
    strategy: Mapping[str, Any] = field(default_factory=dict)
    evaluation: Mapping[str, Any] = field(default_factory=dict)
    checkpointing: Mapping[str, Any] = field(default_factory=dict)
    logging: Mapping[str, Any] = field(default_factory=dict)
    hub: Mapping[str, Any] = field(default_factory=dict)
    loggers: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; expected one of {STATUSES}")


def honoured(how: str, **contributions: Any) -> Decision:
    """The field is carried out; `how` says by whom."""
    return Decision(HONOURED, how, **contributions)


def refused(how: str) -> Decision:
    """The value cannot be honoured; `how` says why and what to do instead."""
    return Decision(REFUSED, how)


def warned(how: str, **contributions: Any) -> Decision:
    """Accepted with a warning the trainer shows once (`Plan.warnings()`)."""
    return Decision(WARNED, how, **contributions)


def not_applicable(how: str, **contributions: Any) -> Decision:
    """Accepted; has no effect in this configuration (said explicitly)."""
    return Decision(NOT_APPLICABLE, how, **contributions)


def plain(value: Any) -> Any:
    """Enums -> their value, recursively through lists; everything else unchanged."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def config_as_dict(value: Any) -> dict[str, Any] | None:
    """An `AcceleratorConfig`-like object, a dataclass or a dict -> a deep-copied plain dict."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return copy.deepcopy(dict(value))
    if hasattr(value, "to_dict"):
        return copy.deepcopy(dict(value.to_dict()))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return copy.deepcopy(dict(vars(value)))


@dataclass(frozen=True)
class Context:
    """Read-only view of the arguments and the environment, with derived values handlers share."""

    args: Any
    env: Environment
    accelerator: str  # "cpu" | "gpu" | "mps"
    strategy_name: str  # "single" | "ddp" | "fsdp" | "fsdp2" | "deepspeed" | "tp"
    n_gpu: int  # the reference's `args.n_gpu`, computed from `env` (no device set-up)

    def get(self, name: str, default: Any = None) -> Any:
        """`args.<name>` with enums turned into their string values."""
        return plain(getattr(self.args, name, default))

    @property
    def multi_process(self) -> bool:
        """True when a process group is created (DDP, FSDP, DeepSpeed)."""
        return self.strategy_name != "single"


Handler = Callable[[str, Any, Context], Decision]


@dataclass(frozen=True)
class FieldEntry:
    """One row of the registry: the reference's field, its default, its handler and README text.

    `carries=(section, key)`: the plan carries the field's value as `<section>.<key>` (`section` one of
    "evaluation", "checkpointing", "logging", "hub"); that section's component reads it there, not on the arguments.
    """

    name: str
    default: Any
    handler: Handler
    doc: str
    support: str | None = None  # the README's "supported" cell when it is not "yes" (e.g. only the default is)
    carries: tuple[str, str] | None = None

    def decide(self, value: Any, ctx: Context) -> Decision:
        """The handler's decision on `value`, with the value added to the section the entry carries it in."""
        decision = self.handler(self.name, value, ctx)
        if self.carries is None:
            return decision
        section, key = self.carries
        contribution = {**getattr(decision, section), key: tuple(value) if isinstance(value, list) else value}
        return dataclasses.replace(decision, **{section: contribution})


# ---------------------------------------------------------------- handler factories


def always(how: str) -> Handler:
    """A field honoured the same way whatever its value."""

    def handler(field_name: str, value: Any, ctx: Context) -> Decision:
        return honoured(how)

    return handler


def script_flag(how: str) -> Handler:
    """A field the reference keeps for scripts and never reads itself."""

    def handler(field_name: str, value: Any, ctx: Context) -> Decision:
        return not_applicable(how)

    return handler
