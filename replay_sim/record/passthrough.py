"""The recorder's stdio pass-through: a client's calls forwarded and answered without the SDK server.

``replay-sim record -- CMD`` serves one client over stdio. Most of what it then does per call is
the MCP SDK's server machinery — validating the line into models, a dispatcher task, a request
context, a middleware chain, dumping the response — around the work that matters: forwarding the
call upstream and committing it before the client is answered. :class:`PassThrough` (a
:class:`~replay_sim.stdio_transport.Shortcut`) takes the plain calls of an established
handshake-era session off the line itself and hands them to the session's usual
:meth:`~replay_sim.record.session.Session.forward`, so they are forwarded, recorded (committed
first) and answered exactly as on the SDK path, with the same bytes.

A plain call is one the SDK path would only forward: ``tools/call``, ``resources/read``,
``prompts/get`` or ``completion/complete`` without a progress token (no progress to relay), once
the session exists, on an upstream that was declared no client capabilities (so its server has
nothing to ask the client), while not exploring. Log notifications its server sends during the
call are recorded with it and relayed to the client as the SDK path relays them. Everything else
— ``initialize``, listings, notifications, 2026-era requests — is the SDK's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

import mcp_types as types
import pydantic_core
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import handler_exception_to_error_data

from replay_sim.protocol import CALL_METHODS, FORWARDED_CAPABILITIES
from replay_sim.record.session import Session
from replay_sim.stdio_transport import Opening

__all__ = ["PassThrough"]

_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_RESERVED = "io.modelcontextprotocol/"


class PassThrough:
    """Plain calls of a stdio client's session, forwarded and answered without the SDK server.

    Args:
        proxy: The stdio client's :class:`~replay_sim.record.proxy.ServerProxy` (its sessions,
            whether it explores).
    """

    def __init__(self, proxy: Any) -> None:
        self.proxy = proxy
        self.opening = Opening()
        self.write: Callable[[bytes], Awaitable[bool]] | None = None
        """The stdio transport's writer: notifications and answers go out in turn with the server's lines."""

    def answer(self, line: bytes) -> Any:
        """The answer to a plain call's line, to come (an awaitable), or None: the SDK reads the line."""
        try:
            request = pydantic_core.from_json(line)
        except ValueError:
            return None
        if not isinstance(request, dict) or "id" not in request or not isinstance(request.get("method"), str):
            return None  # a notification, a response, or not a message
        params = request.get("params", {})
        meta = params.get("_meta") if isinstance(params, dict) else None
        modern = isinstance(meta, dict) and any(k.startswith(_RESERVED) for k in meta)
        if self.opening.request(request, modern) or not self.opening.ready(modern) or modern:
            return None
        session = self._session()
        if session is None or not _plain(request, params, meta):
            return None
        return self._relay(session, request)

    def sent(self, message: types.JSONRPCMessage) -> None:
        """Watch what the SDK server writes (its answer to ``initialize``)."""
        self.opening.sent(message)

    def opened(self, write: Callable[[bytes], Awaitable[bool]]) -> None:
        """Keep the transport's writer, for the notifications relayed to the client."""
        self.write = write

    def _session(self) -> Session | None:
        """The one client session, when its calls may pass through."""
        proxy = self.proxy
        if proxy.explorer is not None or len(proxy.sessions) != 1 or self.write is None:
            return None
        session: Session = next(iter(proxy.sessions))
        upstream = session.upstream
        if not upstream.alive or upstream.capabilities.keys() & FORWARDED_CAPABILITIES:
            return None
        return session

    async def _relay(self, session: Session, request: dict[str, Any]) -> bytes:
        """Forward and record one call (as :meth:`Session.forward` does), and its response line."""
        assert self.opening.version is not None and self.write is not None
        ctx = _Call(request, self.opening.version, self.write)
        try:
            result = await session.forward(cast(ServerRequestContext[Any, Any], ctx))
        except Exception as exc:  # as the SDK's dispatcher answers a handler's failure
            error = handler_exception_to_error_data(exc) or types.ErrorData(code=0, message=str(exc))
            response = types.JSONRPCError(jsonrpc="2.0", id=request["id"], error=error)
            return response.model_dump_json(by_alias=True, exclude_unset=True).encode()
        return b"".join(
            (
                b'{"jsonrpc":"2.0","id":',
                pydantic_core.to_json(request["id"]),
                b',"result":',
                pydantic_core.to_json(result),
                b"}",
            )
        )


def _plain(request: dict[str, Any], params: Any, meta: Any) -> bool:
    """Whether a handshake-era request is a plain call (see the module docstring), well-formed."""
    if request.keys() - _KEYS or request.get("jsonrpc") != "2.0" or request["method"] not in CALL_METHODS:
        return False
    if not (type(request["id"]) is int or type(request["id"]) is str) or not isinstance(params, dict):
        return False
    return meta is None or (isinstance(meta, dict) and "progressToken" not in meta)


class _Session:
    """What a :class:`Session` uses of the SDK's server session, for a passed-through call."""

    client_capabilities = None

    def __init__(self, write: Callable[[bytes], Awaitable[bool]]) -> None:
        self._write = write

    async def send_notification(self, notification: Any, related_request_id: Any = None) -> None:
        """Relay a notification to the client as the SDK's session writes it (before the call's answer)."""
        data = notification.model_dump(by_alias=True, mode="json", exclude_none=True)
        params = data.get("params")
        message = (
            types.JSONRPCNotification(jsonrpc="2.0", method=data["method"], params=dict(params))
            if params is not None
            else types.JSONRPCNotification(jsonrpc="2.0", method=data["method"])
        )
        await self._write(message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n")

    async def report_progress(self, *args: Any, **kwargs: Any) -> None:
        """No progress token was sent, so none is reported (as the SDK's session does)."""

    async def send_request(self, *args: Any, **kwargs: Any) -> Any:
        """The client declared nothing it can be asked."""
        raise MCPError(code=types.INVALID_REQUEST, message="the client declared no capability to be asked")


class _Call:
    """What a :class:`Session` uses of a client's request context, for a passed-through call."""

    def __init__(
        self, request: dict[str, Any], version: str, write: Callable[[bytes], Awaitable[bool]]
    ) -> None:
        self.method: str = request["method"]
        self.params: dict[str, Any] = request.get("params") or {}
        self.request_id = request["id"]
        self.protocol_version = version
        self.request = None
        self.session = _Session(write)
