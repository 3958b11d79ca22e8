"""Which engine features have landed: the switchboard the field handlers consult.

A field whose feature has not landed is accepted at its default value (noted as
"not-applicable" or "warned") and refused with a message when its value would change what
`train()` does. Flip an entry to True when the feature lands; the registry tests then expect
the "honoured" path for that feature's fields.
"""

from __future__ import annotations

# feature name -> (landed, what it covers, in the user's words); landed features leave the switchboard.
FEATURES: dict[str, tuple[bool, str]] = {
}


def landed_features() -> dict[str, bool]:
    """Snapshot of the landed flags, taken once per `translate` call."""
    return {name: landed for name, (landed, _) in FEATURES.items()}


def describe(feature: str) -> str:
    """The user-facing description of a feature."""
    return FEATURES[feature][1]
