"""Episode histories: the :class:`~replay_sim.resolve.lineage.Trail` of each episode, per recorded server.

The resolver picks among several recordings of one call by comparing a recorded session's prefix
with the history of the episode asking. An *episode* is named by the client (``X-Replay-Episode``
header or ``_meta["replay-sim/episode"]``) so that several MCP sessions of one rollout share it;
otherwise it is the MCP connection itself (a handshake-era session, a stdio process). Modern-era
(2026-07-28) requests carry no session, so without an episode id they have no history.

History is kept per recorded server, because recorded sessions are per server: a rollout that
talks to ``git`` and ``fetch`` has two histories under one episode id.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from replay_sim.resolve.lineage import Trail

__all__ = ["Histories"]

DEFAULT_MAX_EPISODES = 100_000


class Histories:
    """Histories of named episodes and of MCP connections, per recorded server.

    Named episodes live until evicted (least recently used beyond ``max_episodes``) or reset;
    connection histories live exactly as long as their connection object (weak references), so
    a closed MCP session frees its history without bookkeeping.

    Args:
        max_episodes: How many named (episode, server) histories to keep.
    """

    def __init__(self, max_episodes: int = DEFAULT_MAX_EPISODES) -> None:
        self.max_episodes = max_episodes
        self._named: OrderedDict[tuple[str, str], Trail] = OrderedDict()
        self._connections: weakref.WeakKeyDictionary[Any, dict[str, Trail]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def _history(self, server: str, scope: str | Hashable | None, create: bool) -> Trail | None:
        if scope is None:
            return None
        if isinstance(scope, str):
            key = (scope, server)
            found = self._named.get(key)
            if found is not None:
                self._named.move_to_end(key)
            elif create:
                found = self._named[key] = Trail()
                while len(self._named) > self.max_episodes:
                    self._named.popitem(last=False)
            return found
        per_server = self._connections.get(scope)
        if per_server is None:
            if not create:
                return None
            per_server = self._connections[scope] = {}
        found = per_server.get(server)
        if found is None and create:
            found = per_server[server] = Trail()
        return found

    def trail(self, server: str, scope: str | Hashable | None) -> Trail | None:
        """The trail of this episode on ``server`` (created empty), or None for a None scope.

        Args:
            server: Recorded server name.
            scope: An episode id (str), a connection object (held weakly), or None (no history).

        Returns:
            The live trail: the resolver reads it and advances it with each resolved call.
        """
        with self._lock:
            return self._history(server, scope, create=True)

    def reset(self, episode: str) -> bool:
        """Forget a named episode on every server; True when it existed."""
        with self._lock:
            doomed = [key for key in self._named if key[0] == episode]
            for key in doomed:
                del self._named[key]
            return bool(doomed)

    def named(self) -> list[dict[str, Any]]:
        """Every named episode history: ``{"episode", "server", "calls"}``, least recently used first."""
        with self._lock:
            return [{"episode": e, "server": s, "calls": len(h)} for (e, s), h in self._named.items()]
