"""The resolver: which recording answers a call (exact → canonical → semantic → miss).

This module holds the resolution types shared by the replay server and the evaluator, and the
tiered lookup itself. When one key has several recordings (the server's state changed between
them), the one whose recorded session prefix best matches this episode's history wins; ties go
to the earliest recording, so the same call sequence always yields the same answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from replay_sim.canonical import call_identity, call_key
from replay_sim.store import Recording, Store

__all__ = ["Candidate", "FieldDiff", "Resolution", "Resolver", "Tier"]


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
    SYNTHETIC = "synthetic"
    """No match; an LLM made the answer up (miss policy `synthesize`)."""
    MISS = "miss"
    """No recording answers the call."""


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


@dataclass(frozen=True, slots=True)
class Resolution:
    """The resolver's answer for one call."""

    tier: Tier
    score: float
    recording: Recording | None = None
    candidates: list[Candidate] = field(default_factory=list)
    reason: str = ""

    @property
    def hit(self) -> bool:
        """True when a recording answers the call."""
        return self.recording is not None


def history_affinity(recording: Recording, history: Sequence[str], prefix: Sequence[str]) -> int:
    """How many trailing calls of the recording's session prefix this episode's history repeats."""
    matched = 0
    for recorded, made in zip(reversed(prefix), reversed(history), strict=False):
        if recorded != made:
            break
        matched += 1
    return matched


class Resolver:
    """Answers calls from a store.

    Args:
        store: The recording store.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._prefix_cache: dict[int, list[str]] = {}

    def _session_prefix(self, recording: Recording) -> list[str]:
        """Keys of the calls made before ``recording`` in its recorded session."""
        cached = self._prefix_cache.get(recording.id)
        if cached is None:
            if recording.session is None:
                cached = []
            else:
                earlier = self.store.recordings(session=recording.session)
                cached = [r.key for r in earlier if (r.seq or 0) < (recording.seq or 0)]
            self._prefix_cache[recording.id] = cached
        return cached

    def choose(self, recordings: Sequence[Recording], history: Sequence[str]) -> Recording:
        """Pick the recording whose session prefix best matches ``history`` (earliest on ties)."""
        if len(recordings) == 1:
            return recordings[0]
        return max(
            recordings,
            key=lambda r: (history_affinity(r, history, self._session_prefix(r)), -r.id),
        )

    def resolve(self, server: str, method: str, params: dict[str, Any], history: Sequence[str] = ()) -> Resolution:
        """Find the recording that answers a call.

        Args:
            server: Recorded server name.
            method: MCP method (``tools/call``, ``resources/read``, ``prompts/get``, ``completion/complete``).
            params: Request params, wire JSON.
            history: Keys of the calls this episode made so far, oldest first.

        Returns:
            A :class:`Resolution`; ``tier`` is ``miss`` when nothing answers the call.
        """
        name, arguments = call_identity(method, params)
        key = call_key(server, method, name, arguments)
        found = self.store.recordings(key=key)
        if found:
            return Resolution(Tier.EXACT, 1.0, self.choose(found, history))
        return Resolution(Tier.MISS, 0.0, reason=f"no recording of {method} {name!r} on {server!r} matches")
