"""Ray Serve request router: every request of an episode or MCP session reaches its replica.

Serve calls :meth:`EpisodeRouter.choose_replicas` in the caller's process for each call of the
replica deployment: in Serve's HTTP proxy for a client's request (whose URL and headers it reads
from the request's ASGI scope — not its body, which the proxy has not read yet), and in a replica
for a request it forwards (an :class:`~replay_sim.scale.wire.Envelope`). A request goes

- with a target (the replica that minted its MCP session, the episode's known holder, or the one
  an ``X-Replay-Replica`` header names) to that replica alone — and when it is not among the live
  replicas, to any, which then refuses the request as lost (it is not the target);
- with an episode (URL or ``X-Replay-Episode``) to the episode's owner by rendezvous hashing over
  the live replicas (:func:`~replay_sim.scale.ring.owner`), the same in every router;
- with neither (an episode named only in ``_meta`` included) to the least loaded replica, which
  reads the body and forwards it to the episode's holder if that is another replica.

A single chosen replica that is at ``max_ongoing_requests`` is waited for (with backoff), never
swapped for another: routing does not depend on load or luck. Each router also publishes the live
replicas it sees (:func:`live_replicas`), so a replica's front can tell a lost holder from a live one:
the replicas Serve's controller last listed, less any a call of this process found dead (the
controller takes seconds to notice a death, and lists a dead replica until it does).
"""

from __future__ import annotations

import importlib
import pickle
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from replay_sim.scale.affinity import affinity
from replay_sim.scale.ring import owner
from replay_sim.scale.wire import Envelope

__all__ = ["EpisodeRouter", "live_replicas"]

_listed: frozenset[str] = frozenset()
_dead: frozenset[str] = frozenset()
_live: frozenset[str] = frozenset()


def live_replicas() -> frozenset[str]:
    """The replica ids running as this process last heard (empty before the controller's first list)."""
    return _live


def _note(listed: frozenset[str] | None = None, died: str | None = None) -> None:
    """Update :func:`live_replicas` with the controller's new list, or a replica a call found dead."""
    global _listed, _dead, _live
    if listed is not None:
        _listed = listed
        _dead &= listed  # once the controller no longer lists a dead replica, it need not be kept
    if died is not None:
        _dead |= {died}
    _live = _listed - _dead


class EpisodeRouter(RequestRouter):
    """Routes by the envelope's target or episode; keyless requests to the least loaded replica."""

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Record the new set of running replicas (and publish it to :func:`live_replicas`)."""
        super().update_replicas(replicas)
        _module()._note(listed=frozenset(r.replica_id.unique_id for r in replicas))

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """Drop a replica a call found dead (and publish that to :func:`live_replicas`)."""
        super().on_replica_actor_died(replica_id)
        _module()._note(died=replica_id.unique_id)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """One replica for a targeted or episode request; every candidate for the rest."""
        if not candidate_replicas:
            return []
        target, key = _route(pending_request)
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        chosen = target if target is not None else (owner(key, by_id) if key is not None else None)
        if chosen is None:
            return [candidate_replicas]
        if chosen not in by_id:
            # The holder is gone: any replica will do, since none but the holder may answer — the
            # one chosen sees it is not the holder and answers that the episode is lost.
            return [candidate_replicas]
        assert pending_request is not None
        pending_request.routing_context.should_backoff = True  # wait for it, never fall over
        return [[by_id[chosen]]]


def _module() -> Any:
    """This module as imported in this process.

    Serve ships :class:`EpisodeRouter` to the caller pickled by value, with globals of its own: it
    publishes through the module as imported, where :func:`live_replicas` reads.
    """
    return importlib.import_module(__name__)


def _route(pending: PendingRequest | None) -> tuple[str | None, str | None]:
    """The replica a call must reach (if named) and the episode to hash (if any).

    A forwarded call carries an :class:`~replay_sim.scale.wire.Envelope`; an HTTP request from
    Serve's proxy carries its ASGI scope, pickled: its URL and headers are read (not its body).
    """
    args: list[Any] = pending.args if pending is not None else []
    first = args[0] if args else None
    if isinstance(first, Envelope):
        return first.target, first.affinity.key
    scope = _proxied_scope(first)
    if scope is None:
        return None, None
    found = affinity(scope.get("method", ""), scope.get("path", ""), scope.get("headers", []))
    return found.replica, found.key


def _proxied_scope(argument: Any) -> dict[str, Any] | None:
    """The ASGI scope of a request Serve's HTTP proxy sends (a pickled request object), or None."""
    if not isinstance(argument, bytes | bytearray):
        return None
    try:
        request = pickle.loads(argument)
    except Exception:  # not the proxy's request object: route it as keyless
        return None
    scope = getattr(request, "asgi_scope", None)
    return scope if isinstance(scope, dict) else None
