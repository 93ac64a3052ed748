"""A tool's effect: what it declares (:func:`declare`), and the verdict evidence reaches (:class:`Verdict`).

The judge reads recorded calls as :class:`Call` objects; :mod:`replay_sim.effects` says how the
evidence is weighed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["UNDECLARED", "Call", "Declaration", "Effect", "Pair", "Verdict", "declare", "repeatable"]


class Effect(StrEnum):
    """What calling a tool does to the state later answers depend on."""

    NONE = "none"
    """Changes nothing a later answer depends on: declared read-only, or shown so by witnesses."""
    CHANGES = "changes"
    """Changes state: declared so, or a recorded answer changed after it (or depends on history)."""
    UNKNOWN = "unknown"
    """No evidence either way; treated as changing state, the safe assumption for replay."""


@dataclass(frozen=True, slots=True)
class Declaration:
    """What the matching config or the server says about a tool, before any evidence."""

    effect: Effect
    fixed: bool
    """Evidence cannot change it."""
    source: str
    """``config``, ``annotation`` or ``default``."""
    reason: str


UNDECLARED = Declaration(Effect.UNKNOWN, False, "default", "no evidence")
"""A tool nothing declares: unknown until evidence settles it."""


def declare(annotations: Mapping[str, Any] | None, read_only: bool | None = None) -> Declaration:
    """A tool's effect as declared.

    Args:
        annotations: The tool's ``annotations`` as listed by its server.
        read_only: The matching config's ``read_only`` for the tool (None: not set).
    """
    if read_only is not None:
        effect = Effect.NONE if read_only else Effect.CHANGES
        return Declaration(effect, True, "config", f"matching config: read_only = {str(read_only).lower()}")
    hints = annotations or {}
    if hints.get("readOnlyHint") is True:  # destructiveHint means something only when it is not
        return Declaration(Effect.NONE, False, "annotation", "annotated readOnlyHint: true")
    if hints.get("readOnlyHint") is False:
        return Declaration(Effect.CHANGES, True, "annotation", "annotated readOnlyHint: false")
    if hints.get("destructiveHint") is True:
        return Declaration(Effect.CHANGES, True, "annotation", "annotated destructiveHint: true")
    return UNDECLARED


def repeatable(annotations: Mapping[str, Any] | None) -> bool:
    """Whether the server says calling the tool again is harmless (read-only or idempotent)."""
    hints = annotations or {}
    return hints.get("readOnlyHint") is True or hints.get("idempotentHint") is True


@dataclass(frozen=True, slots=True)
class Call:
    """One recorded call, as the effect judge sees it.

    Attributes:
        id: The recording's id (None when not stored yet).
        method: Its MCP method.
        name: The tool, prompt or resource it asked for.
        key: Its exact key (:func:`~replay_sim.canonical.call_key`).
        answer: What the server said, canonical (:func:`~replay_sim.canonical.answer_text`).
        failed: The answer is an error: it can contradict a witness, never be one.
        inert: It cannot have changed state whatever its tool does (failed, a dry run, not a tool call).
        names: The things it names (:func:`named`; a resource read: its URI).
        kind: The kind of call it is (:func:`~replay_sim.effects.kinds.kind_of`: ``select``,
            ``insert`` …), None when its arguments say none that can be trusted.
        selectors: The values it picks its target by (:func:`~replay_sim.effects.sensitivity.selected`:
            a find/replace's ``old``): a read that does not show them cannot witness it.
    """

    id: int | None
    method: str
    name: str
    key: str
    answer: str
    failed: bool
    inert: bool
    names: frozenset[str] = frozenset()
    kind: str | None = None
    selectors: frozenset[str] = frozenset()

    @property
    def tool(self) -> str | None:
        """The tool called, or None for other requests."""
        return self.name if self.method == "tools/call" else None


Pair = tuple[int | None, int | None]


@dataclass(frozen=True, slots=True)
class Verdict:
    """A tool's effect and why.

    Attributes:
        effect: What calling it does to state.
        source: ``config``, ``annotation``, ``evidence`` or ``default``.
        reason: One line for a reader (``3 reads unchanged``, ``read_file before/after differed``).
        witnesses: Recording pairs that saw no change (a few).
        contrary: The recording pair that showed a change, if any.
        shown: How many different calls of the tool were seen to change nothing.
        kinds: For a tool whose calls differ in kind and that is not effect-free as a whole, each
            recorded kind's own verdict, learned from its calls alone (``select`` -> none). A call
            of a kind not listed here has the tool's effect.
    """

    effect: Effect
    source: str
    reason: str
    witnesses: tuple[Pair, ...] = ()
    contrary: Pair | None = None
    shown: int = 0
    kinds: tuple[tuple[str, Verdict], ...] = ()

    @property
    def changes_state(self) -> bool:
        """Whether replay must treat its calls as state changes (anything but :attr:`Effect.NONE`)."""
        return self.effect is not Effect.NONE

    def of_kind(self, kind: str | None) -> Verdict:
        """The verdict a call of this kind gets: its kind's own, else the tool's."""
        return next((v for k, v in self.kinds if k == kind), self) if kind is not None else self

    def describe(self) -> str:
        """``effect: reason``, e.g. ``none: 3 reads unchanged (recordings 4 and 7, …)``."""
        return f"{self.effect}: {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the stats command and the admin API); ``kinds`` only when learned."""
        found: dict[str, Any] = {
            "effect": str(self.effect),
            "source": self.source,
            "reason": self.reason,
            "witnesses": [list(p) for p in self.witnesses],
            "contrary": None if self.contrary is None else list(self.contrary),
            "shown": self.shown,
        }
        if self.kinds:
            found["kinds"] = {kind: verdict.as_dict() for kind, verdict in self.kinds}
        return found

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        """The verdict :meth:`as_dict` wrote (a store keeps learned verdicts so).

        Raises:
            KeyError, TypeError, ValueError: ``data`` is not such a form.
        """
        contrary = data["contrary"]
        return cls(
            Effect(data["effect"]),
            str(data["source"]),
            str(data["reason"]),
            tuple((a, b) for a, b in data["witnesses"]),
            None if contrary is None else (contrary[0], contrary[1]),
            int(data["shown"]),
            tuple((str(k), cls.from_dict(v)) for k, v in data.get("kinds", {}).items()),
        )
