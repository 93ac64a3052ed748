"""Where a replay keeps the calls no recording answered with certainty.

Every such call — a miss, a ``nearest`` or ``synthetic`` answer, a refusal, a recording whose client
answered the server's questions otherwise — is kept for the admin API and the dashboard
(:meth:`Metrics.record_miss <replay_sim.replay.observe.metrics.Metrics.record_miss>`). A call the resolver
missed is also persisted in the store's miss log (:mod:`replay_sim.store.misses`) for
``replay-sim backfill``, with the state-changing steps of its history: what it takes to ask the
real server the same call from the same state. Refusals and calls answered otherwise are not:
asking again would answer them the same way.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from replay_sim.replay.core.provenance import candidate_json
from replay_sim.replay.observe.metrics import Metrics, MissRecord
from replay_sim.resolve.lineage import DIVERGED, Trail
from replay_sim.resolve.resolution import Resolution
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store
from replay_sim.store.misslog import MissLog

__all__ = ["MissKeeper"]


class MissKeeper:
    """Keeps a replay's misses: in its metrics, and those worth asking again in the miss log.

    Args:
        store: The store whose miss log persists misses (a snapshot's: a side file).
        resolver: The replay's resolver (what a history's steps changed).
        metrics: Where the admin API's misses go.
    """

    def __init__(self, store: Store, resolver: Resolver, metrics: Metrics) -> None:
        self.log: MissLog | None = MissLog(store)
        """Where misses persist for ``replay-sim backfill`` (None: nowhere)."""
        self.resolver = resolver
        self.metrics = metrics

    def keep(
        self,
        server: str,
        method: str,
        name: str,
        arguments: dict[str, Any],
        status: str,
        miss: Resolution,
        kept: Sequence[str] | Trail | bool | None = False,
    ) -> None:
        """Keep a call that no recording answered with certainty for the admin API.

        Args:
            server: Recorded server name.
            method: The MCP method.
            name: The tool, prompt or resource the call asked for.
            arguments: The call's arguments (redacted).
            status: How it was answered (provenance status, ``refused`` or ``fault``).
            miss: The resolver's miss (its reason and candidates).
            kept: The call's history (None when it had none): it is also persisted in the miss log
                for ``replay-sim backfill``. False for refusals and calls answered otherwise.
        """
        if kept is not False and self.log is not None:
            candidates = [candidate_json(c) for c in miss.candidates]
            prefix = None if kept is None or kept is True else self._state_steps(kept)
            self.log.add(server, method, name, arguments, prefix=prefix, status=status,
                         reason=miss.reason, candidates=candidates)  # fmt: skip
        self.metrics.record_miss(
            MissRecord(
                at=time.time(),
                server=server,
                method=method,
                name=name,
                arguments=arguments,
                status=status,
                reason=miss.reason,
                candidates=[candidate_json(c) for c in miss.candidates],
            )
        )

    def _state_steps(self, history: Sequence[str] | Trail) -> list[str]:
        """The keys of the state-changing calls of a history, in order: recorded, or missed (diverged)."""
        lookup = self.resolver.lookup
        trail = lookup.trail(history)
        if trail.diverged is None:
            return list(trail.state)
        steps = trail.steps
        return [s.removeprefix(DIVERGED) for s in steps if s.startswith(DIVERGED) or lookup.is_mutating(s)]
