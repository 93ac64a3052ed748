"""The HTTP door's raw fast path under the SDK: replayed calls answered from prepared bytes.

A POST of ``tools/call``, ``resources/read`` or ``prompts/get`` that the SDK would take as it is —
on an established handshake-era session (an ``Mcp-Session-Id`` its session manager knows), or a
2026-era request passing the SDK's per-request checks (envelope, routing headers, ``Mcp-Param-*``
headers) — is answered here with one ``application/json`` response when
:class:`~replay_sim.replay.core.prepared.Prepared` has its answer: no JSON-RPC models, no task hops, no
stream. Every check is the SDK's, done cheaply; a request that any check would refuse, or that the
SDK would answer otherwise, or whose answer needs more than the recorded result, goes on to the
SDK untouched (:meth:`FastPath.__call__` returns False having sent nothing).
The checks are the SDK's, done cheaply (:mod:`~replay_sim.replay.core.checks`); the stdio door's
fast path is :mod:`~replay_sim.replay.stdio.fastpath`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import pydantic_core
from mcp.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import (
    InboundModernRoute,
    classify_inbound_request,
    find_duplicated_routing_header,
    validate_mcp_param_headers,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
from starlette.types import Message, Receive, Scope, Send

from replay_sim import untrusted
from replay_sim.replay.core.checks import RequestChecks, handshake_meta
from replay_sim.replay.core.prepared import Prepared, Style, envelope
from replay_sim.replay.core.sandboxcalls import SandboxCalls
from replay_sim.replay.core.surface import Surface
from replay_sim.replay.http.instanced import InstanceAnswers
from replay_sim.replay.http.responses import prefers_json

__all__ = ["FastPath"]


class FastPath(RequestChecks):
    """Answers the replayed calls it can from prepared bytes; hands everything else to the SDK.

    Args:
        prepared: The replay's prepared answers.
        servers: Each recorded server's SDK server (which requests it serves at all).
        surfaces: Each recorded server's surface (its tools' input schemas).
        calls: Misses a bound, warm sandbox instance answers (None: the SDK path asks every one).

    Attributes:
        instances: The sandbox answers it writes, and the handshake-era ones in flight (None: none).
    """

    def __init__(
        self,
        prepared: Prepared,
        servers: Mapping[str, Server[Any]],
        surfaces: Mapping[str, Surface],
        calls: SandboxCalls | None = None,
    ) -> None:
        super().__init__(prepared, servers)
        self.surfaces = surfaces
        self.instances = None if calls is None else InstanceAnswers(calls)
        self._annotated: dict[tuple[str, str], Any] = {}

    async def __call__(
        self,
        name: str,
        manager: StreamableHTTPSessionManager,
        episode: str | None,
        scope: Scope,
        messages: list[Message],
        send: Send,
        receive: Receive | None = None,
        handover: Callable[[], Awaitable[None]] | None = None,
    ) -> bool:
        """Answer one MCP POST from prepared bytes, or by its episode's warm sandbox instance, if it can.

        Args:
            name: The recorded server the request is for.
            manager: That server's session manager (whose sessions are established).
            episode: The episode the request names (URL, header or ``_meta``; already agreed).
            scope: The request's ASGI scope.
            messages: The request's body messages, already read.
            send: Where the response goes.
            receive: The request's own ``receive`` (past its body: a client closing the connection).
            handover: Runs the SDK path on the request (None: no sandbox answers are taken here).

        Returns:
            True when the request was answered; False when nothing was sent and the SDK answers it.
        """
        last = messages[-1]
        if last["type"] != "http.request" or last.get("more_body", False) or "user" in scope:
            return False
        headers: dict[str, str] = {}
        for key, value in scope["headers"]:
            headers[key.decode("latin-1")] = value.decode("latin-1")
        acceptable, json_first = _forms(headers.get("content-type", ""), headers.get("accept", ""))
        length = headers.get("content-length")
        if not acceptable or not (
            length is None or (length.isdigit() and int(length) <= manager.max_request_body_size)
        ):
            return False
        body = b"".join(m.get("body", b"") for m in messages)
        version = headers.get("mcp-protocol-version")
        sandboxed = None
        if self.instances is not None and handover is not None and receive is not None:
            sandboxed = _Sandboxed(self.instances, scope, receive, handover)
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            return await self._modern(name, episode, scope, headers, body, send, sandboxed)
        if not json_first:
            return False  # the SDK streams it, as this client prefers
        return await self._handshake(name, manager, episode, headers, body, version, send, sandboxed)

    async def _handshake(
        self,
        name: str,
        manager: StreamableHTTPSessionManager,
        episode: str | None,
        headers: dict[str, str],
        body: bytes,
        version: str | None,
        send: Send,
        sandboxed: _Sandboxed | None = None,
    ) -> bool:
        session_id = headers.get("mcp-session-id")
        transport = manager._server_instances.get(session_id) if session_id is not None else None
        if transport is None or transport.is_terminated or session_id in manager._session_owners:
            return False
        idle = transport.idle_scope
        if idle is not None and idle.cancel_called:
            return False
        try:
            request = pydantic_core.from_json(body)
        except ValueError:
            return False
        params = self.request_params(name, request)
        if params is None or not handshake_meta(params.get("_meta")):
            return False
        scope_key: Hashable = episode if episode is not None else transport
        served = version or LATEST_HANDSHAKE_VERSION
        method, id_ = request["method"], request["id"]
        # A warm instance's call first: the cache's answer is resolved once, there or by Prepared.
        taken = None if sandboxed is None else sandboxed.instances.calls.take(name, method, params, scope_key)
        result = None
        if taken is None:
            result = self.prepared.answer(name, method, params, scope_key, served, Style.PYDANTIC)
            if result is None:
                return False
        assert session_id is not None
        extra = [(b"mcp-session-id", session_id.encode("latin-1"))]

        async def respond(send: Send, body: bytes) -> None:
            await _respond(send, body, extra)

        # As the transport itself does: a request in flight holds the session open.
        async with _in_flight(transport):
            if result is not None:
                await respond(send, envelope(id_, result, Style.PYDANTIC))
            else:
                assert sandboxed is not None and taken is not None
                await sandboxed.instances(
                    taken, id_, served, Style.PYDANTIC, sandboxed.scope, send, respond, sandboxed.handover,
                    transport=transport,
                )  # fmt: skip
        return True

    async def _modern(
        self,
        name: str,
        episode: str | None,
        scope: Scope,
        headers: dict[str, str],
        body: bytes,
        send: Send,
        sandboxed: _Sandboxed | None = None,
    ) -> bool:
        try:
            request = untrusted.loads(body)
        except ValueError:
            return False
        params = self.request_params(name, request)
        if params is None:
            return False
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        if find_duplicated_routing_header(raw) is not None:
            return False
        route = classify_inbound_request(request, headers=headers)
        if not isinstance(route, InboundModernRoute):
            return False
        method, version = request["method"], route.protocol_version
        if not self.envelope_valid(method, version, params["_meta"]) or not self._param_headers_agree(
            name, method, params, headers
        ):
            return False
        taken = None if sandboxed is None else sandboxed.instances.calls.take(name, method, params, episode)
        if taken is None:
            result = self.prepared.answer(name, method, params, episode, version, Style.JSON)
            if result is None:
                return False
            await _respond(send, envelope(request["id"], result, Style.JSON), [])
            return True
        assert sandboxed is not None

        async def respond(send: Send, body: bytes) -> None:
            await _respond(send, body, [])

        await sandboxed.instances(
            taken, request["id"], version, Style.JSON, scope, send, respond, sandboxed.handover,
            disconnect=sandboxed.receive,
        )  # fmt: skip
        return True

    def _param_headers_agree(
        self, name: str, method: str, params: dict[str, Any], headers: dict[str, str]
    ) -> bool:
        """The SDK's ``Mcp-Param-*`` check of a 2026-era ``tools/call`` (only annotated schemas check any)."""
        if method != "tools/call":
            return True
        tool = str(params["name"])
        schema = self._annotated.get((name, tool), False)
        if schema is False:
            listed = self.surfaces[name].tools.get(tool)
            found = None if listed is None else listed.get("inputSchema")
            schema = self._annotated[(name, tool)] = found if "x-mcp-header" in json.dumps(found) else None
        if schema is None:
            return True
        return validate_mcp_param_headers(schema, params.get("arguments") or {}, headers) is None


@dataclass(frozen=True, slots=True)
class _Sandboxed:
    """What answering a request by its episode's sandbox instance needs beyond the fast path's own."""

    instances: InstanceAnswers
    scope: Scope
    receive: Receive
    handover: Callable[[], Awaitable[None]]


@contextlib.asynccontextmanager
async def _in_flight(transport: Any) -> AsyncIterator[None]:
    """A session's request in flight: its session is held open (as the SDK's transport holds it)."""
    idle, timeout = transport.idle_scope, transport._idle_timeout
    if idle is None or timeout is None:
        yield
        return
    transport._requests_in_flight += 1
    idle.deadline = math.inf
    try:
        yield
    finally:
        transport._requests_in_flight -= 1
        if not transport._requests_in_flight:
            idle.deadline = anyio.current_time() + timeout


@functools.lru_cache(maxsize=256)
def _forms(content_type: str, accept: str) -> tuple[bool, bool]:
    """Whether the transport's checks of Content-Type and Accept pass, and whether JSON is preferred.

    Clients send the same headers with every request, so the verdicts are kept.
    """
    if not content_type.lower().startswith("application/json"):
        return False, False
    if not any(part.strip() == "application/json" for part in content_type.split(";")[0].split(",")):
        return False, False
    accepted = [t.strip().split(";")[0].strip().lower() for t in accept.split(",")]
    wildcard = "*/*" in accepted
    if not (wildcard or "application/json" in accepted or "application/*" in accepted):
        return False, False
    if not (wildcard or "text/event-stream" in accepted or "text/*" in accepted):
        return False, False
    return True, prefers_json(accept)


async def _respond(send: Send, body: bytes, extra: list[tuple[bytes, bytes]]) -> None:
    headers = [(b"content-type", b"application/json"), *extra, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
