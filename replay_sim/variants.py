"""The differences of an argument's value that a server may ignore: one registry, two users.

Each :class:`Transform` takes one difference out of a value (:meth:`Transform.apply`, used by the
resolver's canonical tier once the recordings show the server ignores it) and makes one
(:meth:`Transform.vary`, used by the recorder to ask the real server). Neither side assumes a
difference is ignored: :mod:`replay_sim.resolve.invariance` learns it from recorded pairs.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from replay_sim.canonical import canonical_json

__all__ = ["MIN_EVIDENCE", "Transform"]

_MAX_CHARS = 1000  # longer strings are prose nobody retypes in another case

MIN_EVIDENCE = 2
"""Distinct answers that must support a learned invariance."""


class Transform(StrEnum):
    """A difference of one argument that a server may ignore (applied in this order)."""

    SPACE = "space"
    CASE = "case"
    ORDER = "order"

    def apply(self, value: Any) -> Any:
        """The value with this difference taken out (values it does not apply to are unchanged)."""
        if self is Transform.ORDER:
            return sorted(value, key=canonical_json) if isinstance(value, list) else value
        if not isinstance(value, str):
            return value
        return value.strip() if self is Transform.SPACE else value.casefold()

    def vary(self, value: Any) -> Any | None:
        """A value that differs from ``value`` only by this difference (None when there is none)."""
        if self is Transform.ORDER:
            if isinstance(value, list) and list(reversed(value)) != value:
                return list(reversed(value))
            return None
        if not isinstance(value, str) or not value.strip() or len(value) > _MAX_CHARS:
            return None
        if self is Transform.SPACE:
            return value.strip() if value != value.strip() else f" {value} "
        if value.upper() == value.lower():
            return None  # nothing with a case
        return value.upper() if value != value.upper() else value.lower()
