"""The best candidate answer the store holds for a call, strict tiers or not.

Used for a miss at serve time (what a confidence-gated replay may serve instead, and what the
miss's provenance reports) and for every hidden recording in leave-one-out training, so the
candidates the model is trained on are chosen the way serving chooses them. In order: a recording
of the very call made from the episode's state, one equal after normalisation from that state,
then the same from another state, then the tool's nearest recording by embedding.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from replay_sim.canonical import call_key
from replay_sim.effects import Effect
from replay_sim.errors import ReplaySimError
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.confidence.features import Formed
from replay_sim.resolve.index import IndexSet
from replay_sim.resolve.lineage import StateLookup, Trail
from replay_sim.resolve.resolution import Resolution, Tier
from replay_sim.resolve.toolstate import ToolState
from replay_sim.schema import ToolSchema
from replay_sim.store import Recording, Store
from replay_sim.store.changes import Mark

__all__ = ["KIND_TIER", "Resolver", "Signatures", "form", "from_hit"]


class Resolver(Protocol):
    """What forming and judging read of the resolver (:class:`replay_sim.resolve.resolver.Resolver`)."""

    store: Store
    lookup: StateLookup
    config: MatchConfig

    def index(self) -> IndexSet:
        """The vector index, current with the store."""
        ...

    def version(self) -> Mark | None:
        """The store's version as the resolver last read it."""
        ...

    def tool_schema(self, server: str, tool: str) -> ToolSchema | None:
        """The recorded schema of a tool (effect included), or None."""
        ...

    def tool_state(self, server: str, tool: str, schema: ToolSchema) -> ToolState:
        """The tool's matching state."""
        ...


KIND_TIER = {"exact": Tier.EXACT, "canonical": Tier.CANONICAL, "nearest": Tier.SEMANTIC}
"""The provenance status of a candidate served by confidence."""
_HIT_KIND = {Tier.EXACT: "exact", Tier.CANONICAL: "canonical", Tier.SEMANTIC: "nearest"}

# (server, tool, hidden recording) -> the tool's nearest other recordings, (id, cosine) best first
Neighbours = Callable[[str, str, Recording], list[tuple[int, float]]]


def from_hit(resolution: Resolution) -> Formed | None:
    """The candidate a strict hit served (from the episode's state), or None for any other answer."""
    kind = _HIT_KIND.get(resolution.tier)
    if kind is None or resolution.recording is None:
        return None
    return Formed(resolution.recording, kind, float(resolution.score) if kind == "nearest" else 1.0)


def _other(resolver: Resolver, recording: Recording, trail: Trail) -> dict[str, Any]:
    """``other_state``, ``gap`` and ``diverged`` of a candidate (see :class:`Formed`): the gap is the
    recorded calls one state made more often than the other (a repeated write is a change too),
    each with whether its tool is known to change state."""
    made = resolver.lookup.state_of(recording)
    if trail.diverged is None and made == trail.state:
        return {}
    mine, theirs = Counter(made), Counter(trail.state)
    gap = []
    for key in sorted((mine - theirs) + (theirs - mine)):
        called = _tool_call(resolver.lookup, key)
        if called is not None:
            gap.append((called[0], called[1] is Effect.CHANGES))
    return {"other_state": True, "gap": tuple(gap), "diverged": trail.diverged is not None}


def _tool_call(lookup: StateLookup, key: str) -> tuple[Recording, Effect] | None:
    """A state-changing step's recorded tool call and its tool's effect (None: not a tool call)."""
    found = lookup.by_key(key)
    if not found or found[0].method != "tools/call":
        return None
    return found[0], lookup.effect(found[0].server, found[0].name).effect


class Signatures:
    """Which states calls not known to be effect-free separate (:func:`~.features.describe`'s
    ``separated``): a recording's *signature* is the calls of its state that may change state,
    counted; two recordings whose signatures differ were made across possible changes, so a
    different answer there may be the state's doing, where one between equal signatures (the same
    state, or states apart by effect-free calls only) is the server answering one call two ways.

    Each recording's signature is formed once (a call every episode makes has as many recordings
    as episodes, compared with each other's); forget them when the store changes (a tool's learned
    effect may have).
    """

    def __init__(self, resolver: Resolver) -> None:
        self._lookup = resolver.lookup
        self._may_change: dict[str, bool] = {}
        self._of: dict[int | None, tuple[tuple[str, int], ...]] = {}

    def of(self, recording: Recording) -> tuple[tuple[str, int], ...]:
        """The recording's signature."""
        found = self._of.get(recording.id)
        if found is None:
            counted = Counter(key for key in self._lookup.state_of(recording) if self._changes(key))
            found = self._of[recording.id] = tuple(sorted(counted.items()))
        return found

    def separated_from(self, recording: Recording) -> Callable[[Recording], bool]:
        """Whether another recording's signature differs from ``recording``'s."""
        mine = self.of(recording)
        return lambda other: self.of(other) != mine

    def _changes(self, key: str) -> bool:
        found = self._may_change.get(key)
        if found is None:
            called = _tool_call(self._lookup, key)
            found = self._may_change[key] = called is not None and called[1] is not Effect.NONE
        return found


def _pick(resolver: Resolver, groups: Sequence[tuple[str, list[Recording]]], trail: Trail) -> Formed | None:
    """The first group with a recording from this state, else the first group with any."""
    lookup = resolver.lookup
    for kind, found in groups:
        if found and trail.diverged is None and lookup.from_state(found, trail):
            chosen = lookup.choose(found, trail)
            assert chosen is not None
            return Formed(chosen, kind)
    for kind, found in groups:
        if found:
            chosen = lookup.choose(found, trail, strict=False)
            assert chosen is not None
            return Formed(chosen, kind, **_other(resolver, chosen, trail))
    return None


def form(
    resolver: Resolver,
    server: str,
    method: str,
    name: str,
    arguments: dict[str, Any],
    trail: Trail,
    *,
    nearest: Sequence[tuple[int, float]] = (),
    exclude: int | None = None,
) -> Formed | None:
    """The best candidate for a call from the store (``exclude`` hidden), or None.

    Args:
        resolver: The resolver whose lookups, effects and tool states are used.
        server: Recorded server name.
        method: The MCP method.
        name: The tool, prompt or resource.
        arguments: The call's arguments (redacted as recorded).
        trail: The episode's trail.
        nearest: The tool's nearest recordings, ``(id, cosine)`` best first (a miss's candidates).
        exclude: A recording to treat as absent (leave-one-out).

    Raises:
        Deferred: Within :meth:`Resolver.resolve_now`, when the tool's matching state is not built.
    """
    key = call_key(server, method, name, arguments)
    groups: list[tuple[str, list[Recording]]] = [
        ("exact", [r for r in resolver.lookup.by_key(key) if r.id != exclude])
    ]
    # A sandboxed server's miss is its instance's to answer, never a guess's: its best candidate is
    # an exact recording (from another state), and the tool's matching state — read from every
    # recording of the tool, again after each batch of sandbox answers — is not built for it.
    # (Leave-one-out forms every candidate: what the model learns from is the same whoever serves.)
    guessed = method == "tools/call" and (exclude is not None or server not in resolver.lookup.strict)
    schema = resolver.tool_schema(server, name) if guessed else None
    state = None
    normalised: dict[str, Any] = {}
    if schema is not None:
        state = resolver.tool_state(server, name, schema)
        try:
            normalised = state.normalise(arguments)
            same = state.canonical.get(call_key(server, method, name, normalised), [])
        except (ValueError, TypeError, RecursionError):
            same = []
        groups.append(("canonical", [r for r in same if r.id != exclude]))
    picked = _pick(resolver, groups, trail)
    if picked is not None or state is None:
        return picked
    by_id = {r.id: r for r in state.recordings}
    for rid, score in nearest:
        rec = by_id.get(rid)
        if rec is None or rid == exclude:
            continue
        group = set(state.group(normalised)) if normalised else set()
        return Formed(
            rec,
            "nearest",
            round(float(score), 6),
            same_identifiers=rid in group,
            **_other(resolver, rec, trail),
        )
    return None


def index_neighbours(resolver: Resolver) -> Neighbours:
    """A recording's nearest other recordings of its tool, by the vectors the index holds."""

    def neighbours(server: str, tool: str, hidden: Recording) -> list[tuple[int, float]]:
        try:
            index = resolver.index()
            part = index.partition(server, tool)
            if part is None:
                return []
            vector = np.asarray(part.vectors([hidden.id]))[0]
            return [p for p in index.search(server, tool, vector, 4) if p[0] != hidden.id]
        except ReplaySimError:
            return []

    return neighbours
