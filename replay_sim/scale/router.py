"""Ray Serve request router: every request of an episode or MCP session reaches its replica.

Serve calls :meth:`EpisodeRouter.choose_replicas` in the caller's process (here the gateway) for
each call of the replica deployment. The gateway passes an :class:`~replay_sim.scale.wire.Envelope`:

- with a ``target`` (the replica holding the request's MCP session, or the episode's known
  holder): that replica alone — and when it is not among the live replicas, any replica, which
  then refuses the request as lost (it is not the target);
- with an episode and no target: the episode's owner by rendezvous hashing over the live replicas
  (:func:`~replay_sim.scale.ring.owner`), the same in every router;
- with neither: any replica, the least loaded (Serve's queue-length probing).

A single chosen replica that is at ``max_ongoing_requests`` is waited for (with backoff), never
swapped for another: routing does not depend on load or luck. Each router also publishes the live
replicas it sees (:func:`live_replicas`), so the gateway can tell a lost holder from a live one.
"""

from __future__ import annotations

import importlib
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from replay_sim.scale.ring import owner
from replay_sim.scale.wire import Envelope

__all__ = ["EpisodeRouter", "live_replicas"]

_live: frozenset[str] = frozenset()


def live_replicas() -> frozenset[str]:
    """The replica ids the routers of this process last saw running (empty before the first update)."""
    return _live


class EpisodeRouter(RequestRouter):
    """Routes by the envelope's target or episode; keyless requests to the least loaded replica."""

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Record the new set of running replicas (and publish it to :func:`live_replicas`)."""
        super().update_replicas(replicas)
        # Serve ships this class to the caller pickled by value, with globals of its own: publish
        # through the module as imported in this process, where live_replicas() reads.
        module = importlib.import_module(__name__)
        module._live = frozenset(r.replica_id.unique_id for r in replicas)  # type: ignore[attr-defined]

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """One replica for a targeted or episode request; every candidate for the rest."""
        if not candidate_replicas:
            return []
        envelope = _envelope(pending_request)
        if envelope is None:
            return [candidate_replicas]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        chosen = envelope.target
        if chosen is None and envelope.affinity.key is not None:
            chosen = owner(envelope.affinity.key, by_id)
        if chosen is None:
            return [candidate_replicas]
        if chosen not in by_id:
            # The holder is gone: any replica will do, since none but the holder may answer — the
            # one chosen sees it is not the target and answers that the episode is lost.
            return [candidate_replicas]
        assert pending_request is not None
        pending_request.routing_context.should_backoff = True  # wait for it, never fall over
        return [[by_id[chosen]]]


def _envelope(pending: PendingRequest | None) -> Envelope | None:
    """The envelope a replica call carries as its first argument, if any."""
    args: list[Any] = pending.args if pending is not None else []
    first = args[0] if args else None
    return first if isinstance(first, Envelope) else None
