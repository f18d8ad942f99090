"""KEEP: the table value that leaves the recipe's own (bridge_fields and telemetry_fields both use it)."""

from __future__ import annotations

from typing import Any


class _Keep:
    """Sentinel: leave the recipe's value (printed as such by the plan)."""

    def __repr__(self) -> str:
        return "(recipe's)"


KEEP: Any = _Keep()
