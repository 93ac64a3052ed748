"""Whose connection a request came on: the history key the SDK path and the fast path share.

A handshake-era request's history is its connection's. The SDK keeps a connection object per MCP
session, but the fast path (:mod:`~replay_sim.replay.http.fastpath`) answers under the SDK, where
there is none; so both key a connection by what both can see: an HTTP session by its transport
(the router passes it on in the ASGI scope under :data:`SESSION_KEY`), the one client of a stdio
server by an object of its own (:func:`stdio_client`).

The HTTP door also tells a handler how to start its request's response stream at once
(:data:`STREAM_KEY`, :func:`stream_now`): an answer about to be held shows the client it has begun.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Hashable, Iterator
from typing import Any

from mcp.server.context import ServerRequestContext

__all__ = ["SESSION_KEY", "STREAM_KEY", "connection_key", "stdio_client", "stream_now"]

SESSION_KEY = "replay_sim.session"
"""The ASGI scope key under which the router passes on a handshake-era request's session (its transport)."""

STREAM_KEY = "replay_sim.stream_now"
"""The ASGI scope key of the callable that starts a request's response stream at once."""

_STDIO_CLIENT: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar(
    "replay_sim_stdio", default=None
)


class _StdioClient:
    """The one client of a stdio server (weakly referable)."""


@contextlib.contextmanager
def stdio_client() -> Iterator[Hashable]:
    """The history key of a stdio server's one client (either era), for the requests served inside."""
    client = _StdioClient()
    token = _STDIO_CLIENT.set(client)
    try:
        yield client
    finally:
        _STDIO_CLIENT.reset(token)


def connection_key(ctx: ServerRequestContext[Any, Any], found: Hashable) -> Hashable:
    """A connection's history key: an HTTP session's transport, a stdio server's client, else ``found``.

    Args:
        ctx: The request (its ASGI scope carries the router's :data:`SESSION_KEY`).
        found: The SDK connection the request came on (the key when neither applies: in process).
    """
    request = ctx.request
    session = getattr(request, "scope", {}).get(SESSION_KEY) if request is not None else None
    if session is not None:
        return session  # type: ignore[no-any-return]
    client = _STDIO_CLIENT.get()
    return found if client is None else client


async def stream_now(ctx: ServerRequestContext[Any, Any]) -> None:
    """Start the response stream of ``ctx``'s request now, if it is held back (else nothing)."""
    request = ctx.request
    start: Callable[[], Awaitable[None]] | None = (
        getattr(request, "scope", {}).get(STREAM_KEY) if request is not None else None
    )
    if start is not None:
        await start()
