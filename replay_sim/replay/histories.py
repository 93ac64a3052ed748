"""Episode histories: the :class:`~replay_sim.resolve.lineage.Trail` of each episode, per recorded server.

The resolver picks among several recordings of one call by comparing a recorded session's prefix
with the history of the episode asking. An *episode* is named by the client (``X-Replay-Episode``
header or ``_meta["replay-sim/episode"]``) so that several MCP sessions of one rollout share it;
otherwise it is the MCP connection itself: a handshake-era session, or the one client of a stdio
process in either era (:func:`one_client`). Modern-era (2026-07-28) HTTP requests carry no session,
so without an episode id they have no history — and a call whose answer depends on the server's
state cannot be answered faithfully without one: :func:`needs_history` says when, and why.

History is kept per recorded server, because recorded sessions are per server: a rollout that
talks to ``git`` and ``fetch`` has two histories under one episode id.
"""

from __future__ import annotations

import contextlib
import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from contextvars import ContextVar
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from replay_sim.protocol import EPISODE_META_KEY, episode_id
from replay_sim.replay.conversation import questions
from replay_sim.resolve.lineage import Trail
from replay_sim.resolve.resolution import Candidate, Problem, Resolution, Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Recording

__all__ = ["EPISODE_FIX", "Histories", "needs_history", "one_client", "scope"]

EPISODE_FIX = (
    "send an episode id with every request of the rollout: the X-Replay-Episode header or "
    f'_meta["{EPISODE_META_KEY}"] (or connect in the handshake era, whose Mcp-Session-Id keeps '
    "history per session)"
)
"""How a client gives its requests a history (the fix named by a sessionless miss)."""

_NO_HISTORY = "and this request has no episode id and no MCP session"

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
    """
    named = episode_id((ctx.params or {}).get("_meta"), getattr(ctx.request, "headers", None))
    if named is not None:
        return named
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        # One Connection object per MCP session (HTTP) or process (stdio); the SDK keeps it private.
        return getattr(ctx.session, "_connection", None)
    return _ONE_CLIENT.get()


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


def needs_history(
    resolver: Resolver, server: str, method: str, name: str, arguments: dict[str, Any], resolution: Resolution
) -> Resolution | None:
    """The miss for a call with no history whose answer depends on the server's state, else None.

    A request with no episode and no session is resolved as if from the initial state. That is a
    guess whenever the state matters: when the call changes state (later calls would have to be
    answered from the state it leaves), or when its recordings answer differently at different
    points of their sessions (or only after state changes). Calls whose recordings agree are
    answered as usual, and so are refusals (an unknown tool, invalid arguments).

    Args:
        resolver: The resolver that resolved the call (its state lookup and recorded schemas).
        server: Recorded server name.
        method: The MCP method called.
        name: The tool, prompt or resource the call asked for.
        arguments: The call's (redacted) arguments.
        resolution: How the call was resolved from the initial state.

    Returns:
        A miss naming the fix (:data:`EPISODE_FIX`), or None when the call can be answered without
        a history.
    """
    if resolution.problem in (Problem.UNKNOWN_TOOL, Problem.INVALID_ARGUMENTS):
        return None
    what = f"{method} {name!r}"
    recording = resolution.recording
    candidates = resolution.candidates
    if resolution.problem == Problem.OTHER_STATE:
        why = f"{what} was recorded only after state changes, {_NO_HISTORY} to say if this client made them"
    elif recording is None:
        schema = resolver.tool_schema(server, name) if method == "tools/call" else None
        if schema is None or not schema.changes_state(arguments):
            return None
        why = f"{what} may change the server's state, {_NO_HISTORY} to keep that change in"
    else:
        # Every recording of the call answered and of the one asked for (a canonical hit's differ).
        same = [*resolver.lookup.by_key(recording.key), *resolver.lookup.by_key(resolution.key)]
        group = list({r.id: r for r in same}.values())
        candidates = [Candidate(r.id, resolution.score) for r in group[:3]]
        if resolver.lookup.is_mutating(recording.key):
            why = f"{what} may change the server's state, {_NO_HISTORY} to keep that change in"
        elif _disagree(group):
            ids = ", ".join(f"#{r.id}" for r in group)
            why = (
                f"the recordings of {what} ({ids}) answer differently at different points of their "
                f"sessions, {_NO_HISTORY} to say which point this client is at"
            )
        else:
            return None
    return Resolution(
        Tier.MISS, 0.0, candidates=candidates, key=resolution.key,
        reason=f"{why}; to replay calls that depend on state, {EPISODE_FIX}",
    )  # fmt: skip


def _disagree(recordings: list[Recording]) -> bool:
    """Whether recordings of one call, made for clients asked and answering alike, got different answers.

    A server answers a client it could ask (sampling, elicitation) otherwise than one it could
    not, and after one answer otherwise than after another: those differences are the client's
    (:mod:`~replay_sim.replay.conversation` picks by them), not the state's. ``_meta`` aside.
    """
    answers: dict[str, tuple[Any, Any]] = {}
    for r in recordings:
        asked = json.dumps(questions(r.notifications), sort_keys=True) if r.notifications else ""
        result = {k: v for k, v in r.result.items() if k != "_meta"} if r.result is not None else None
        if answers.setdefault(asked, (result, r.error)) != (result, r.error):
            return True
    return False
