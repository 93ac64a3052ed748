"""Calls a bound, warm sandbox instance answers, taken by the fast paths without the SDK's request path.

The SDK path costs a sandbox answer more than the instance itself: request models, the middleware
chain, result shaping, a response envelope, and the call resolved twice (the fast path's attempt,
then the SDK path's). A call the cache does not answer on a server whose episode holds a bound,
alive and idle instance is asked here instead — through the same miss policy, so everything true
of a sandbox answer stays true: the episode's lock and instance, the per-call limit, the answer
recorded off the answer path, the instance's last use, the episode's trail marked by a
state-changing call, the miss logged, the metrics and episode stats counted. Its result JSON is
written as the SDK path writes it, provenance included.

Only a call nothing else is asked of is taken (:meth:`SandboxCalls.take`): no fault injection or
latency shaping configured, no per-request options or progress token in ``_meta``, an episode (or
session) history, and an exact miss (or a call the policy claims). An answer needing more than its
result — notifications or questions to re-enact, a JSON-RPC error (a lost episode, an unreadable
store) — is handed to the SDK path with the call's outcome (:mod:`~replay_sim.replay.core.handover`),
never asked twice.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from replay_sim.canonical import call_identity
from replay_sim.errors import EpisodeError
from replay_sim.protocol import MIN_CONFIDENCE_META_KEY
from replay_sim.replay.core.answering import Answer, Answering
from replay_sim.replay.core.episodes import History
from replay_sim.replay.core.prepared import Prepared, Style
from replay_sim.resolve.lineage import Trail
from replay_sim.resolve.resolution import Resolution

__all__ = ["SandboxCalls", "Taken"]


@dataclass(slots=True)
class Taken:
    """A call :meth:`SandboxCalls.take` took: what asking and settling it need."""

    server: str
    method: str
    params: dict[str, Any]
    """Its params without ``_meta``."""
    history: History
    trail: Trail
    miss: Resolution
    """What the cache resolved it to (a miss, or a hit the policy claims)."""
    started: float


class SandboxCalls:
    """Calls a bound, warm sandbox instance answers, for the doors' fast paths.

    Args:
        replay: The replay whose resolver, miss policy, histories and metrics answer.
        prepared: How its results are serialised as the SDK path serialises them.
    """

    def __init__(self, replay: Answering, prepared: Prepared) -> None:
        self.replay = replay
        self.prepared = prepared

    def take(self, server: str, method: str, params: dict[str, Any], scope: Hashable | None) -> Taken | None:
        """The call, when its episode's warm instance answers it with nothing else to do; else None.

        Nothing is changed when the answer is None (the SDK path answers the call).
        """
        replay = self.replay
        meta = params.get("_meta")
        if isinstance(meta, dict) and ("progressToken" in meta or MIN_CONFIDENCE_META_KEY in meta):
            return None
        warm = getattr(replay.policy, "warm", None)
        if warm is None or scope is None or replay.injector.faults or replay.injector.latency.mode != "none":
            return None
        started = time.perf_counter()
        try:
            history = replay.histories.history(scope)
        except EpisodeError:
            return None  # the SDK path says why
        if history is None:
            return None
        trail = history.trail(server)
        if not warm(server, trail):
            return None
        call = {k: v for k, v in params.items() if k != "_meta"}
        redacted = replay.redactor.redact(call)
        miss = replay.resolver.resolve_now(server, method, redacted, trail)
        if miss is None:
            return None  # it needs what loads or an embedding: the SDK path's
        name, arguments = call_identity(method, redacted)
        if miss.hit and not replay.claimed(server, method, name, arguments, trail):
            return None
        return Taken(server, method, call, history, trail, miss, started)

    async def answer(self, taken: Taken) -> Answer:
        """Ask the call of the episode's instance, through the miss policy (the miss logged).

        Raises:
            EpisodeLost: The episode's instance died.
            StoreError: The store cannot be read.
        """
        return await self.replay.ask_policy(
            taken.server, taken.method, taken.params, taken.miss, taken.trail, taken.history
        )

    def settle(self, taken: Taken, answer: Answer, version: str, style: Style) -> bytes | None:
        """The answer's result JSON, as the SDK path writes it, once its call is settled (the trail
        advanced, the call counted); None when only the SDK path can deliver it (nothing settled)."""
        reply, recording = answer.reply, answer.resolution.recording
        if answer.pending or not isinstance(reply, dict):
            return None
        lookup = self.replay.resolver.lookup
        same = [] if recording is None else lookup.alternatives(recording, taken.trail)
        if any(r.notifications for r in same):
            return None  # re-enacted to the client: the SDK path's stream
        self.replay.settle(taken.server, taken.method, taken.params, answer, taken.history, taken.started)
        return self.prepared.dumped(taken.server, taken.method, reply, version, style)

    def count(self, what: str) -> None:
        """Count a call in the miss policy's stats: ``fast`` (its answer written here), ``handed``
        (handed over to the SDK path)."""
        counts = getattr(self.replay.policy, "counts", None)
        if isinstance(counts, dict):
            counts[what] = counts.get(what, 0) + 1
