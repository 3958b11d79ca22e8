"""The reference's own integration callbacks for the `report_to` names they carry (`plan.logging.integrations`),
built as the reference's Trainer builds them (`get_reporting_integration_callbacks`), in `report_to`'s order.

Our callback system runs them with the reference's state and control, so each tracker records what the reference
records (keys, series, config, run name, step metric, and its own environment switches); each checks
`state.is_world_process_zero` itself, so only the main process reports. transformers is imported only when a name
is carried this way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hf_lightning.translation.plan import Plan


def reporting_callbacks(plan: Plan) -> list[Any]:
    """The reference's integration callback classes for the plan's `logging.integrations` (none: nothing imported)."""
    names = list(plan.logging.integrations)
    if not names:
        return []
    # lazy: transformers is optional and only needed when its callbacks carry report_to
    from transformers.integrations.integration_utils import get_reporting_integration_callbacks

    return get_reporting_integration_callbacks(names)
