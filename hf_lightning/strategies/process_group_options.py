"""The process-group options of a planned strategy, as every Lightning strategy accepts them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hf_lightning.translation.plan import StrategyPlan


def process_group_kwargs(strategy: StrategyPlan) -> dict[str, Any]:
    """The process-group options every Lightning strategy accepts, only those the plan sets."""
    kwargs: dict[str, Any] = {}
    if strategy.process_group_backend is not None:
        kwargs["process_group_backend"] = strategy.process_group_backend
    if strategy.timeout is not None:
        kwargs["timeout"] = strategy.timeout
    return kwargs
