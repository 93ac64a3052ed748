"""The raw fast path under the SDK: replayed calls answered from prepared bytes, over HTTP and stdio.

A POST of ``tools/call``, ``resources/read`` or ``prompts/get`` that the SDK would take as it is —
on an established handshake-era session (an ``Mcp-Session-Id`` its session manager knows), or a
2026-era request passing the SDK's per-request checks (envelope, routing headers, ``Mcp-Param-*``
headers) — is answered here with one ``application/json`` response when
:class:`~replay_sim.replay.core.prepared.Prepared` has its answer: no JSON-RPC models, no task hops, no
stream. Every check is the SDK's, done cheaply; a request that any check would refuse, or that the
SDK would answer otherwise, or whose answer needs more than the recorded result, goes on to the
SDK untouched (:meth:`FastPath.__call__` returns False having sent nothing).

Over stdio, :class:`StdioFastPath` answers request lines the same way before the SDK's stream
sees them, once the connection's era is settled: the client's first request (which decides it
for the SDK) and everything the SDK must see go on to the SDK. A line repeating one it answered
(but for its id) is answered again from what that answer depended on, checked per call
(:meth:`Prepared.again <replay_sim.replay.core.prepared.Prepared.again>`), without parsing or resolving it.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Hashable, Mapping
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
from mcp_types import methods as sdk_methods
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
from pydantic import ValidationError
from starlette.types import Message, Scope, Send

from replay_sim import untrusted
from replay_sim.errors import EpisodeError
from replay_sim.protocol import agreed_episode, plain_call_params
from replay_sim.replay.core.prepared import FAST_METHODS, Again, Prepared, Style, envelope
from replay_sim.replay.core.surface import Surface
from replay_sim.replay.http.responses import prefers_json
from replay_sim.stdio_transport import Opening, Repeated, request_of

__all__ = ["FastPath", "StdioFastPath"]


_RESERVED = "io.modelcontextprotocol/"
_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_MINIMAL = {"tools/call": {"name": ""}, "resources/read": {"uri": ""}, "prompts/get": {"name": ""}}
_ENVELOPES = 256  # distinct 2026-era envelopes whose verdict is kept
_REPEATS = 1024  # stdio request lines kept to be answered again (each up to _REPEATED_LINE bytes)
_REPEATED_LINE = 16 << 10


class _Checks:
    """The SDK's checks of a replayed request, done cheaply (shared by both wires)."""

    def __init__(self, prepared: Prepared, servers: Mapping[str, Server[Any]]) -> None:
        self.prepared = prepared
        self.served = {
            name: frozenset(m for m in FAST_METHODS if server.get_request_handler(m) is not None)
            for name, server in servers.items()
        }
        self._envelopes: dict[tuple[str, str, bytes], bool] = {}

    def _request_params(self, name: str, request: Any) -> dict[str, Any] | None:
        """The params of a well-formed request this path may answer for ``name``, else None."""
        if not isinstance(request, dict) or request.keys() - _KEYS or request.get("jsonrpc") != "2.0":
            return None
        id_, method, params = request.get("id"), request.get("method"), request.get("params")
        if not (type(id_) is int or type(id_) is str) or not isinstance(method, str):
            return None
        if method not in self.served.get(name, ()):
            return None
        return params if plain_call_params(method, params) else None

    def _envelope_valid(self, method: str, version: str, meta: dict[str, Any]) -> bool:
        """Whether the SDK accepts a 2026-era request's ``_meta`` (validated once per distinct envelope)."""
        if not _progress_token_valid(meta):
            return False
        envelope_keys = {k: v for k, v in meta.items() if k.startswith(_RESERVED)}
        key = (method, version, pydantic_core.to_json(envelope_keys))
        verdict = self._envelopes.get(key)
        if verdict is None:
            try:
                sdk_methods.validate_client_request(
                    method, version, {**_MINIMAL[method], "_meta": envelope_keys}
                )
                verdict = True
            except (ValidationError, KeyError):
                verdict = False
            if len(self._envelopes) >= _ENVELOPES:
                self._envelopes.clear()
            self._envelopes[key] = verdict
        return verdict


class FastPath(_Checks):
    """Answers the replayed calls it can from prepared bytes; hands everything else to the SDK.

    Args:
        prepared: The replay's prepared answers.
        servers: Each recorded server's SDK server (which requests it serves at all).
        surfaces: Each recorded server's surface (its tools' input schemas).
    """

    def __init__(
        self, prepared: Prepared, servers: Mapping[str, Server[Any]], surfaces: Mapping[str, Surface]
    ) -> None:
        super().__init__(prepared, servers)
        self.surfaces = surfaces
        self._annotated: dict[tuple[str, str], Any] = {}

    async def __call__(
        self,
        name: str,
        manager: StreamableHTTPSessionManager,
        episode: str | None,
        scope: Scope,
        messages: list[Message],
        send: Send,
    ) -> bool:
        """Answer one MCP POST from prepared bytes if it can.

        Args:
            name: The recorded server the request is for.
            manager: That server's session manager (whose sessions are established).
            episode: The episode the request names (URL, header or ``_meta``; already agreed).
            scope: The request's ASGI scope.
            messages: The request's body messages, already read.
            send: Where the response goes.

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
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            return await self._modern(name, episode, scope, headers, body, send)
        if not json_first:
            return False  # the SDK streams it, as this client prefers
        return await self._handshake(name, manager, episode, headers, body, version, send)

    async def _handshake(
        self,
        name: str,
        manager: StreamableHTTPSessionManager,
        episode: str | None,
        headers: dict[str, str],
        body: bytes,
        version: str | None,
        send: Send,
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
        params = self._request_params(name, request)
        if params is None or not _handshake_meta(params.get("_meta")):
            return False
        scope_key: Hashable = episode if episode is not None else transport
        served = version or LATEST_HANDSHAKE_VERSION
        result = self.prepared.answer(name, request["method"], params, scope_key, served, Style.PYDANTIC)
        if result is None:
            return False
        answer = envelope(request["id"], result, Style.PYDANTIC)
        assert session_id is not None
        extra = [(b"mcp-session-id", session_id.encode("latin-1"))]
        timeout = transport._idle_timeout
        if idle is None or timeout is None:
            await _respond(send, answer, extra)
            return True
        # As the transport itself does: a request in flight holds the session open.
        transport._requests_in_flight += 1
        idle.deadline = math.inf
        try:
            await _respond(send, answer, extra)
        finally:
            transport._requests_in_flight -= 1
            if not transport._requests_in_flight:
                idle.deadline = anyio.current_time() + timeout
        return True

    async def _modern(
        self, name: str, episode: str | None, scope: Scope, headers: dict[str, str], body: bytes, send: Send
    ) -> bool:
        try:
            request = untrusted.loads(body)
        except ValueError:
            return False
        params = self._request_params(name, request)
        if params is None:
            return False
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        if find_duplicated_routing_header(raw) is not None:
            return False
        route = classify_inbound_request(request, headers=headers)
        if not isinstance(route, InboundModernRoute):
            return False
        method, version = request["method"], route.protocol_version
        if not self._envelope_valid(method, version, params["_meta"]) or not self._param_headers_agree(
            name, method, params, headers
        ):
            return False
        result = self.prepared.answer(name, method, params, episode, version, Style.JSON)
        if result is None:
            return False
        await _respond(send, envelope(request["id"], result, Style.JSON), [])
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


class StdioFastPath(_Checks):
    """The fast path of a stdio server: request lines answered from prepared bytes before the SDK reads them.

    A :class:`~replay_sim.stdio_transport.Shortcut` for :func:`~replay_sim.stdio_transport.native_stdio`.

    Args:
        prepared: The replay's prepared answers.
        name: The recorded server served.
        server: Its SDK server.
        client: The history key of the one client of the process.
    """

    def __init__(self, prepared: Prepared, name: str, server: Server[Any], client: Hashable) -> None:
        super().__init__(prepared, {name: server})
        self.name = name
        self.client = client
        self.opening = Opening()
        self._repeats: dict[bytes, tuple[Again, Hashable]] = {}  # template -> its call, its scope

    def answer(self, line: bytes) -> bytes | None:
        """The response line to a request line, or None: the SDK reads the line.

        A line repeating one answered before but for its id (a client calling a tool again) is
        answered from what that answer depended on, without parsing or resolving it, when
        :meth:`Prepared.again <replay_sim.replay.core.prepared.Prepared.again>` finds it unchanged.
        """
        repeated = Repeated.split(line) if len(line) <= _REPEATED_LINE else None
        if repeated is not None:
            found = self._repeats.get(repeated.template)
            if found is not None:
                result = self.prepared.again(*found)
                if result is not None:
                    return envelope(repeated.id, result, Style.PYDANTIC)
        request = request_of(line)
        if request is None:
            return None
        params = request.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        modern = isinstance(meta, dict) and "io.modelcontextprotocol/protocolVersion" in meta
        if self.opening.request(request, modern) or not self.opening.ready(modern):
            return None
        params = self._request_params(self.name, request)
        if params is None:
            return None
        if modern:
            route = classify_inbound_request(request)
            if not isinstance(route, InboundModernRoute):
                return None
            version = route.protocol_version
            if not self._envelope_valid(request["method"], version, params["_meta"]):
                return None
        elif not _handshake_meta(meta):
            return None
        else:
            assert self.opening.version is not None
            version = self.opening.version
        try:
            episode = agreed_episode(None, None, meta)
        except EpisodeError:
            return None
        scope: Hashable = episode if episode is not None else self.client
        answered = self.prepared.answer_again(
            self.name, request["method"], params, scope, version, Style.PYDANTIC
        )
        if answered is None:
            return None
        result, again = answered
        if repeated is not None:
            self._repeats.pop(repeated.template, None)  # what it kept no longer holds
            if again is not None and repeated.holds(request):
                if len(self._repeats) >= _REPEATS:
                    del self._repeats[next(iter(self._repeats))]
                self._repeats[repeated.template] = (again, scope)
        return envelope(request["id"], result, Style.PYDANTIC)

    def sent(self, message: Any) -> None:
        """Watch what the server writes (its answer to ``initialize``)."""
        self.opening.sent(message)

    def opened(self, write: Any) -> None:
        """Answers go back as lines of the transport's own (nothing else is written)."""


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


def _progress_token_valid(meta: dict[str, Any]) -> bool:
    token = meta.get("progressToken")
    return token is None or isinstance(token, int | str)


def _handshake_meta(meta: Any) -> bool:
    """Whether a handshake-era request's ``_meta`` is one the SDK accepts as it is."""
    if meta is None:
        return True
    if not isinstance(meta, dict) or any(k.startswith(_RESERVED) for k in meta):
        return False
    return _progress_token_valid(meta)


async def _respond(send: Send, body: bytes, extra: list[tuple[bytes, bytes]]) -> None:
    headers = [(b"content-type", b"application/json"), *extra, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
