"""The recorder's stdio pass-through: a client's calls forwarded and answered without the SDK server.

``replay-sim record -- CMD`` serves one client over stdio. Most of what it would do per call is
the MCP SDK's machinery — validating the line into models, a dispatcher task, a request context, a
middleware chain, dumping the response — around the work that matters: forwarding the call
upstream and committing it before the client is answered. :class:`PassThrough` (a
:class:`~replay_sim.stdio_transport.Shortcut`) takes the plain calls of an established
handshake-era session off the line itself.

A plain call is one the SDK path would only forward: ``tools/call``, ``resources/read``,
``prompts/get`` or ``completion/complete`` without a progress token (no progress to relay), once
the session exists, on an upstream that was declared no client capabilities (so its server has
nothing to ask the client), while not exploring. Everything else — ``initialize``, listings,
notifications, 2026-era requests — is the SDK's.

To a stdio server, a plain call goes as a line written at once, from the line the client wrote
(the request the session's own forwarding would write: :func:`~replay_sim.record.session.split_params`,
:func:`~replay_sim.record.session.upstream_params`). While the server works on it, the row's request
half is prepared (redacted params, name, arguments, key). Its answer is taken as the server's
output is read, with no task woken: the row is committed (with the other answers of the same read,
in one transaction) and only then is the answer written to the client, with the SDK path's bytes.
A call whose server sent anything else before answering (log or progress notifications, which the
SDK's dispatcher handles in tasks) is finished in a task once those have landed, so they are
recorded with it and relayed before its answer, as on the SDK path. A call its server leaves
unanswered for the upstream's timeout (progress extends it) gets the SDK path's timeout error and
is not recorded; a server that goes away answers its calls with the SDK path's error, recorded.
A call to a URL upstream goes through the session's usual
:meth:`~replay_sim.record.session.Session.forward`, answered with the same bytes.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, cast

import anyio
import anyio.lowlevel
import mcp_types as types
import pydantic_core
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import handler_exception_to_error_data

from replay_sim.errors import StoreError
from replay_sim.protocol import CALL_METHODS, FORWARDED_CAPABILITIES, error_json
from replay_sim.record.child import ChildStdio, outcome, request_line
from replay_sim.record.inflight import Call
from replay_sim.record.proxy import unrecorded
from replay_sim.record.session import Session, recorded_what, split_params, upstream_params
from replay_sim.stdio_transport import Opening, Writer, request_of
from replay_sim.store import Origin, utc_now
from replay_sim.store.writer import PreparedCall

__all__ = ["PassThrough"]

_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_RESERVED = "io.modelcontextprotocol/"


class _Sent:
    """A plain call written to a stdio server: what its row and its answer need."""

    __slots__ = (
        "answer",
        "call",
        "deadline",
        "delivered",
        "id",
        "method",
        "params",
        "prepared",
        "request_id",
        "session",
        "started",
    )

    def __init__(self, session: Session, request: dict[str, Any], call: Call, request_id: str) -> None:
        self.session = session
        self.id: int | str = request["id"]
        self.method: str = request["method"]
        self.params: dict[str, Any] = {}  # redacted, once prepared
        self.prepared: PreparedCall | None = None
        self.call = call
        self.request_id = request_id
        self.delivered = 0  # the server's other lines handed to the SDK when the call was written
        self.started = time.perf_counter()
        self.deadline = float("inf")  # progress about the call extends it (Upstream.deadlines)
        self.answer: dict[str, Any] | None = None


class PassThrough:
    """Plain calls of a stdio client's session, forwarded and answered without the SDK server.

    Args:
        proxy: The stdio client's :class:`~replay_sim.record.proxy.ServerProxy` (its sessions,
            whether it explores).
    """

    def __init__(self, proxy: Any) -> None:
        self.proxy = proxy
        self.opening = Opening()
        self.write: Writer | None = None
        """The stdio transport's writer: answers go out in turn with the server's lines."""
        self._client: _Session | None = None  # what a call's session uses of the client's
        self._sent: dict[str, _Sent] = {}  # calls written to a stdio server, with a deadline
        self._answered: list[_Sent] = []  # answers of the read under way, committed together
        self._watching = False

    def answer(self, line: bytes) -> Any:
        """True: a plain call's line is taken (answered later); an awaitable answer; None: the SDK's."""
        request = request_of(line)
        if request is None:
            return None
        params = request.get("params", {})
        meta = params.get("_meta") if isinstance(params, dict) else None
        modern = isinstance(meta, dict) and any(k.startswith(_RESERVED) for k in meta)
        if self.opening.request(request, modern) or not self.opening.ready(modern) or modern:
            return None
        session = self._session()
        if session is None or not _plain(request, params, meta):
            return None
        child = session.upstream.child
        if child is not None and self._send(session, child, request):
            return True
        return self._relay(session, request)

    def sent(self, message: types.JSONRPCMessage) -> None:
        """Watch what the SDK server writes (its answer to ``initialize``)."""
        self.opening.sent(message)

    def opened(self, write: Writer) -> None:
        """Keep the transport's writer, for answers and the notifications relayed to the client."""
        self.write = write
        self._client = _Session(write)

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

    # -- to a stdio server: written at once, answered as its output is read ---------------------

    def _send(self, session: Session, child: ChildStdio, request: dict[str, Any]) -> bool:
        """Write a plain call to the session's stdio server; False when it cannot be written at once."""
        assert self.opening.version is not None and self._client is not None
        method = request["method"]
        params, meta = split_params(request.get("params"))
        upstream = session.upstream
        request_id = upstream.next_request_id()
        line = request_line(request_id, method, upstream_params(method, params, meta, request_id))
        call = Call(_context(request, self.opening.version, self._client))
        sent = _Sent(session, request, call, request_id)
        sent.delivered = child.delivered
        if not child.send(request_id, line, partial(self._take, sent)):
            return False
        session.inflight[request_id] = sent.call  # its notifications are recorded with it
        child.on_read = self._commit_answered
        timeout = upstream.spec.timeout
        if timeout is not None:
            sent.deadline = anyio.current_time() + timeout
            upstream.deadlines[request_id] = sent
            self._sent[request_id] = sent
            if not self._watching:
                self._watching = True
                self.proxy.spawn(self._watch, timeout)
        # While the server works on it: the row's request half.
        try:
            sent.params = self.proxy.redactor.redact(params)
            sent.prepared = session.prepare(method, sent.params)
        except Exception:  # left to the commit, which fails this call alone as the SDK path does
            sent.params, sent.prepared = params, None
        return True

    def _take(self, sent: _Sent, answer: dict[str, Any] | None) -> None:
        """The server's answer to a call (None: its output ended first), as its output is read."""
        sent.call.latency_ms = (time.perf_counter() - sent.started) * 1000
        sent.call.answered_at = utc_now()
        sent.answer = answer
        self._sent.pop(sent.request_id, None)
        sent.session.upstream.deadlines.pop(sent.request_id, None)
        child = sent.session.upstream.child
        if answer is not None and child is not None and child.delivered == sent.delivered:
            del sent.session.inflight[sent.request_id]
            self._answered.append(sent)  # committed once the answers of this read are all in
            return
        try:
            self.proxy.spawn(self._settle, sent)
        except RuntimeError:  # the recorder is stopping: nobody is left to answer
            sent.session.inflight.pop(sent.request_id, None)

    async def _settle(self, sent: _Sent) -> None:
        """Finish a call once the notifications its server sent before answering have been handled."""
        await anyio.lowlevel.checkpoint()  # they are handled in tasks started before the answer was read
        sent.session.inflight.pop(sent.request_id, None)
        self._commit([sent])

    def _commit_answered(self) -> None:
        answered, self._answered = self._answered, []
        if answered:
            self._commit(answered)

    def _commit(self, answered: list[_Sent]) -> None:
        """Commit answered calls in one transaction, then answer each client call (the SDK path's bytes)."""
        rows: list[dict[str, Any]] = []
        lines: list[bytes | None] = []
        for sent in answered:
            call = sent.call
            try:
                if sent.answer is None:
                    call.error = error_json(sent.session.upstream.closed(sent.method))
                else:
                    try:
                        call.result = outcome(sent.method, sent.answer)
                    except MCPError as exc:
                        call.error = error_json(exc)
                rows.append(sent.session.row(sent.method, sent.params, call, Origin.LIVE, sent.prepared))
                lines.append(None)
            except Exception as exc:  # as the SDK's dispatcher answers a handler's failure
                lines.append(_error_line(sent.id, exc))
        committed = iter(self.proxy.commits.commit(rows))
        for sent, line in zip(answered, lines, strict=True):
            if line is None:
                line = self._answer_line(sent, next(committed))
            assert self.write is not None
            self.write.send(line + b"\n")

    def _answer_line(self, sent: _Sent, committed: int | StoreError) -> bytes:
        """The client's answer to a committed call, or the error saying it could not be recorded."""
        call = sent.call
        if isinstance(committed, StoreError):
            # What the SDK path names: the call as the client sent it.
            return _error_line(
                sent.id, unrecorded(recorded_what(sent.method, _client_params(sent)), committed)
            )
        if call.error is not None:
            error = call.error
            return _error_line(
                sent.id, MCPError(code=error["code"], message=error["message"], data=error["data"])
            )
        try:
            return _result_line(sent.id, call.result)
        except Exception as exc:
            return _error_line(sent.id, exc)

    async def _watch(self, timeout: float) -> None:
        """Answer the calls a stdio server leaves unanswered for its timeout with the SDK path's error."""
        while True:
            now = anyio.current_time()
            for sent in [s for s in self._sent.values() if s.deadline <= now]:
                self._expire(sent)
            # A call written later has a later deadline than one sleeping now: nothing is missed.
            await anyio.sleep_until(min((s.deadline for s in self._sent.values()), default=now + timeout))

    def _expire(self, sent: _Sent) -> None:
        """A call left unanswered: the server is told, the client gets the timeout error, nothing recorded."""
        del self._sent[sent.request_id]
        upstream = sent.session.upstream
        upstream.deadlines.pop(sent.request_id, None)
        sent.session.inflight.pop(sent.request_id, None)
        if upstream.child is not None:
            upstream.child.forget(sent.request_id)
        assert self.write is not None
        self.write.send(_error_line(sent.id, upstream.timed_out(sent.method)) + b"\n")

    # -- to any other upstream: through the session's forwarding ----------------------------------

    async def _relay(self, session: Session, request: dict[str, Any]) -> bytes:
        """Forward and record one call (as :meth:`Session.forward` does), and its response line."""
        assert self.opening.version is not None and self._client is not None
        ctx = _context(request, self.opening.version, self._client)
        try:
            result = await session.forward(ctx)
        except Exception as exc:  # as the SDK's dispatcher answers a handler's failure
            return _error_line(request["id"], exc)
        return _result_line(request["id"], result)


def _plain(request: dict[str, Any], params: Any, meta: Any) -> bool:
    """Whether a handshake-era request is a plain call (see the module docstring), well-formed."""
    if request.keys() - _KEYS or request.get("jsonrpc") != "2.0" or request["method"] not in CALL_METHODS:
        return False
    if not (type(request["id"]) is int or type(request["id"]) is str) or not isinstance(params, dict):
        return False
    return meta is None or (isinstance(meta, dict) and "progressToken" not in meta)


def _client_params(sent: _Sent) -> dict[str, Any]:
    params = sent.call.ctx.params if sent.call.ctx is not None else None
    return split_params(params)[0]


def _result_line(id_: int | str, result: Any) -> bytes:
    """A JSON-RPC result line (no newline) as the SDK's server writes it."""
    return b"".join(
        (
            b'{"jsonrpc":"2.0","id":',
            pydantic_core.to_json(id_),
            b',"result":',
            pydantic_core.to_json(result),
            b"}",
        )
    )


def _error_line(id_: int | str, exc: Exception) -> bytes:
    """The JSON-RPC error line (no newline) the SDK's dispatcher writes for a handler's failure."""
    error = handler_exception_to_error_data(exc) or types.ErrorData(code=0, message=str(exc))
    response = types.JSONRPCError(jsonrpc="2.0", id=id_, error=error)
    return response.model_dump_json(by_alias=True, exclude_unset=True).encode()


def _context(request: dict[str, Any], version: str, client: _Session) -> ServerRequestContext[Any, Any]:
    return cast(ServerRequestContext[Any, Any], _Call(request, version, client))


class _Session:
    """What a :class:`Session` uses of the SDK's server session, for a passed-through call."""

    client_capabilities = None

    def __init__(self, write: Writer) -> None:
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

    __slots__ = ("method", "params", "protocol_version", "request", "request_id", "session")

    def __init__(self, request: dict[str, Any], version: str, client: _Session) -> None:
        self.method: str = request["method"]
        self.params: dict[str, Any] = request.get("params") or {}
        self.request_id = request["id"]
        self.protocol_version = version
        self.request = None
        self.session = client
