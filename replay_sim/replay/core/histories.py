"""Whose history a request extends, and the histories themselves, per recorded server.

The resolver picks among several recordings of one call by comparing a recorded session's prefix
with the history of the episode asking. An *episode* is named by the client — in an episode URL
(``/episodes/<id>/mcp/<server>``), the ``X-Replay-Episode`` header or ``_meta["replay-sim/episode"]``
— so that several MCP sessions of one rollout share it (:mod:`~replay_sim.replay.core.episodes` keeps
them); otherwise it is the MCP connection itself: a handshake-era session, or the one client of a
stdio process in either era (:func:`one_client`). Modern-era (2026-07-28) HTTP requests carry no
session, so without an episode id they have no history — and a call whose answer depends on the
server's state cannot be answered faithfully without one: :func:`needs_history` says when, and why.

History is kept per recorded server, because recorded sessions are per server: a rollout that
talks to ``git`` and ``fetch`` has two trails under one episode id.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import weakref
from collections.abc import Hashable, Iterator
from contextvars import ContextVar
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from replay_sim.protocol import EPISODE_HEADER, EPISODE_META_KEY, agreed_episode
from replay_sim.replay.core.episodes import Episode, Episodes, History
from replay_sim.resolve.lineage import Trail
from replay_sim.resolve.resolution import Resolution
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.sessionless import state_dependence

__all__ = ["EPISODE_FIX", "URL_EPISODE", "Histories", "needs_history", "one_client", "scope"]

EPISODE_FIX = (
    "name an episode in every request of the rollout: serve it from an episode URL, "
    "/episodes/<id>/mcp/<server> (POST /api/episodes creates one), or send the X-Replay-Episode "
    f'header or _meta["{EPISODE_META_KEY}"] (or connect in the handshake era, whose Mcp-Session-Id '
    "keeps history per session)"
)
"""How a client gives its requests a history (the fix named by a sessionless miss)."""
URL_EPISODE = "replay_sim.episode"
"""The ASGI scope key under which the router passes on the id of an episode URL."""

_ONE_CLIENT: ContextVar[Hashable | None] = ContextVar("replay_sim_one_client", default=None)


class _Client:
    """The one client of a stream transport (weakly referable, unlike a bare ``object()``)."""


@contextlib.contextmanager
def one_client() -> Iterator[None]:
    """Scope every request served inside to one client: a stdio process serves exactly one.

    Handshake-era requests have their connection for that; a 2026-era client sends each request
    on its own, so its stream (not the SDK) is what ties them together.
    """
    token = _ONE_CLIENT.set(_Client())
    try:
        yield
    finally:
        _ONE_CLIENT.reset(token)


def scope(ctx: ServerRequestContext[Any, Any]) -> str | Hashable | None:
    """Whose history a request extends: its episode id, else its MCP session or stdio client, else None.

    None is a 2026-era HTTP request without an episode id: nothing ties it to the requests before it.

    Raises:
        EpisodeError: The request names a malformed episode id, or two different ones.
    """
    request = ctx.request
    url = getattr(request, "scope", {}).get(URL_EPISODE) if request is not None else None
    headers = getattr(request, "headers", None)
    header = headers.get(EPISODE_HEADER) if headers is not None else None
    named = agreed_episode(url, header, (ctx.params or {}).get("_meta"))
    if named is not None:
        return named
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        # One Connection object per MCP session (HTTP) or process (stdio); the SDK keeps it private.
        return getattr(ctx.session, "_connection", None)
    return _ONE_CLIENT.get()


class Histories:
    """Histories of named episodes and of MCP connections, per recorded server.

    Named episodes live in :attr:`episodes` (bounded; see :class:`~replay_sim.replay.core.episodes.Episodes`);
    connection histories live exactly as long as their connection object (weak references), so
    a closed MCP session frees its history without bookkeeping.

    Args:
        episodes: The named episodes (default: an :class:`Episodes` with its default bounds).
    """

    def __init__(self, episodes: Episodes | None = None) -> None:
        self.episodes = episodes or Episodes()
        self._connections: weakref.WeakKeyDictionary[Any, History] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def history(self, scope: str | Hashable | None) -> History | None:
        """The history of a scope (created on first use), or None for a None scope.

        Args:
            scope: An episode id (str), a connection object (held weakly), or None (no history).

        Raises:
            EpisodeError: A new episode past the cap of live episodes (status 503).
        """
        if scope is None:
            return None
        if isinstance(scope, str):
            return self.episodes.open(scope)
        with self._lock:
            found = self._connections.get(scope)
            if found is None:
                found = self._connections[scope] = History()
            return found

    def find(self, scope: str | Hashable) -> History | None:
        """The live history of a scope (an episode id or a connection), or None; creates nothing."""
        if isinstance(scope, str):
            return self.episodes.get(scope)
        with self._lock:
            return self._connections.get(scope)

    def trail(self, server: str, scope: str | Hashable | None) -> Trail | None:
        """The trail of this scope on ``server`` (created empty), or None for a None scope.

        Returns:
            The live trail: the resolver reads it and advances it with each resolved call.
        """
        history = self.history(scope)
        return None if history is None else history.trail(server)

    def reset(self, episode: str) -> bool:
        """End a named episode on every server; True when it was live."""
        return self.episodes.end(episode) is not None

    def named(self) -> list[Episode]:
        """Every live named episode, least recently used first."""
        return self.episodes.live()


def needs_history(
    resolver: Resolver, server: str, method: str, name: str, arguments: dict[str, Any], resolution: Resolution
) -> Resolution | None:
    """The miss for a call with no history whose answer may depend on the server's state, else None.

    The rule is :func:`~replay_sim.resolve.sessionless.state_dependence`'s (answered only when the
    recordings show the answer does not depend on state); the miss names the fix (:data:`EPISODE_FIX`).

    Args:
        resolver: The resolver that resolved the call (its state lookup and recorded schemas).
        server: Recorded server name.
        method: The MCP method called.
        name: The tool, prompt or resource the call asked for.
        arguments: The call's (redacted) arguments.
        resolution: How the call was resolved from the initial state.

    Returns:
        A miss naming the fix, or None when the call can be answered without a history.
    """
    miss = state_dependence(resolver, server, method, name, arguments, resolution)
    if miss is None:
        return None
    return dataclasses.replace(
        miss, reason=f"{miss.reason}; to replay calls that depend on state, {EPISODE_FIX}"
    )
