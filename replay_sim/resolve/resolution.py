"""What the resolver answers: how a call was matched, why it was not, and the near misses.

These types are shared by the resolver (:mod:`replay_sim.resolve.resolver`), the replay server
that renders them as ``_meta["replay-sim/match"]`` and the evaluator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from replay_sim.store import Recording

__all__ = ["Candidate", "FieldDiff", "Problem", "Resolution", "Tier"]


class Tier(StrEnum):
    """How a call was answered (the ``status`` of ``_meta["replay-sim/match"]``)."""

    EXACT = "exact"
    """The call's canonical key equals a recorded call's key."""
    CANONICAL = "canonical"
    """Equal after normalising arguments against the tool's inputSchema (defaults, nulls, whitespace)."""
    SEMANTIC = "semantic"
    """Same non-free-text arguments; free text close enough by embedding, above the tool's threshold."""
    NEAREST = "nearest"
    """No certain match; the closest recording was served because the miss policy is `nearest`."""
    LIVE = "live"
    """No match; forwarded to the real server and recorded (miss policy `live`)."""
    SANDBOX = "sandbox"
    """No answer from the episode's state in the cache; its own instance of the real server answered
    (miss policy `sandbox`), and the answer was recorded."""
    SYNTHETIC = "synthetic"
    """No match; an LLM made the answer up (miss policy `synthesize`)."""
    MISS = "miss"
    """No recording answers the call."""


class Problem(StrEnum):
    """Why a call cannot be answered from any recording, when the reason is structural."""

    UNKNOWN_TOOL = "unknown_tool"
    """The tool (or server) is not in the recorded ``tools/list``; a real server would refuse it."""
    INVALID_ARGUMENTS = "invalid_arguments"
    """The arguments are not a JSON object or violate the tool's inputSchema."""
    DIVERGED = "diverged"
    """An earlier state-changing call of this episode was never recorded: later state is unknown."""
    OTHER_STATE = "other_state"
    """The call was recorded, but only after state changes this episode did not make."""


@dataclass(frozen=True, slots=True)
class FieldDiff:
    """One argument that differs between a request and a candidate recording."""

    name: str
    recorded: Any
    requested: Any


@dataclass(frozen=True, slots=True)
class Candidate:
    """A near miss: a recording that almost answers the call, and why it does not."""

    recording_id: int
    score: float
    differences: list[FieldDiff] = field(default_factory=list)
    private: bool = False
    """Made for another episode's call (a sandbox's answer …): its argument values are never shown."""


@dataclass(frozen=True, slots=True)
class Resolution:
    """The resolver's answer for one call.

    ``key`` is the requested call's exact key; ``step`` is what the call adds to the episode's
    history (:meth:`Resolver.advance`): the answering recording's key, or for a miss the requested
    key, marked as diverging when the call changed state. ``problem`` says why a miss is structural
    (unknown tool, invalid arguments …), None otherwise. ``differences`` are the arguments in which
    a canonical or semantic hit's recording differs from the call; ``sandbox`` says which sandbox
    instance answered (miss policy ``sandbox``).
    """

    tier: Tier
    score: float
    recording: Recording | None = None
    candidates: list[Candidate] = field(default_factory=list)
    reason: str = ""
    key: str = ""
    problem: Problem | None = None
    step: str = ""
    differences: list[FieldDiff] = field(default_factory=list)
    sandbox: dict[str, Any] | None = None
    """For a ``sandbox`` answer: the instance that gave it, its latency and the calls re-played first."""
    confidence: float | None = None
    """The probability that the real server answers what the recording says (for a miss: the best
    candidate's), learned from the store (:mod:`replay_sim.resolve.confidence`); None when no
    recording comes close."""
    drivers: tuple[tuple[str, float], ...] = ()
    """The features that drove ``confidence`` most, with their log-odds terms."""

    @property
    def hit(self) -> bool:
        """True when a recording answers the call."""
        return self.recording is not None
