"""Connections to real MCP servers (upstreams): stdio commands and streamable HTTP URLs.

An :class:`Upstream` (where its server is: an :class:`~replay_sim.record.config.UpstreamSpec`)
speaks the handshake era (``initialize``) to its server and forwards requests *raw*: params go out
as given and results come back as the exact JSON the server sent, because the recorder promises
byte-exact pass-through. That is why it drives the SDK's ``JSONRPCDispatcher`` directly instead of
``ClientSession.send_request`` (which validates results against the negotiated schema, strips
later-revision fields and would reject a server's quirks) or
``mcp.Client`` (whose response cache could answer without asking the server).

A stdio server's requests are written and answered raw
(:class:`~replay_sim.record.child.ChildStdio`): the request line and the answer's JSON, with no
model built on the way; the rest of its traffic goes through the SDK's dispatcher.

Every transport failure is translated into :class:`UpstreamError` here, and nowhere else. A request
the server leaves unanswered for its :attr:`~replay_sim.record.config.UpstreamSpec.timeout` (each
progress notification about it restarts the clock) is an :class:`UpstreamTimeout`: the client is
told, naming the server and the timeout, and nothing is recorded — it is not the server's answer.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import IO, Any

import anyio
import anyio.abc
import anyio.lowlevel
import mcp_types as types
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp_types.version import LATEST_HANDSHAKE_VERSION
from pydantic import TypeAdapter

from replay_sim.errors import UpstreamError
from replay_sim.protocol import error_json
from replay_sim.record.child import ChildStdio
from replay_sim.record.config import UpstreamSpec
from replay_sim.record.priority import Priority

__all__ = ["Exchange", "Upstream", "UpstreamTimeout"]

NotificationHandler = Callable[[str, dict[str, Any]], Awaitable[None]]
"""Called with ``(method, params)`` for every notification the server sends."""
RequestHandler = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
"""Answers a server→client request ``(method, params)`` with its result, or raises MCPError."""

_SAMPLING_RESULT: TypeAdapter[Any] = TypeAdapter(
    types.CreateMessageResult | types.CreateMessageResultWithTools
)
_ELICIT_RESULT: TypeAdapter[Any] = TypeAdapter(types.ElicitResult)
_ROOTS_RESULT: TypeAdapter[Any] = TypeAdapter(types.ListRootsResult)
_STDERR_TAIL = 2000
_CLIENT_INFO = types.Implementation(name="replay-sim-recorder", version="0.1.0")


class UpstreamTimeout(MCPError):
    """The server neither answered a request nor reported progress on it within its timeout."""


@dataclass(frozen=True, slots=True)
class Exchange:
    """One request's outcome as it is recorded: the result or the JSON-RPC error, and the round trip."""

    result: dict[str, Any] | None
    error: dict[str, Any] | None
    latency_ms: float


class Upstream:
    """One live handshake-era connection to a real MCP server.

    Start it in a task group (``await task_group.start(upstream.run)``) so its transport lives in
    one long-running task; then call :meth:`request` from any task, and :meth:`close` to stop it.

    Args:
        spec: Where the server is.
        on_notification: Receives every server notification as wire ``(method, params)``.
        capabilities: Client capabilities to declare, as wire JSON: what the downstream client
            declared it can be asked (:func:`replay_sim.protocol.declared`); the server's
            requests for them go to :attr:`on_request`.
        max_line: A stdio server's longest line on stdout in bytes: a longer one ends it (None: no cap).
        priority: A stdio server's CPU priority from its start (None: the normal one).
    """

    def __init__(
        self,
        spec: UpstreamSpec,
        on_notification: NotificationHandler | None = None,
        capabilities: Mapping[str, Any] | None = None,
        max_line: int | None = None,
        priority: Priority | None = None,
    ) -> None:
        self.spec = spec
        self.max_line = max_line
        self.priority = priority
        self.on_notification = on_notification
        self.on_request: RequestHandler | None = None
        self.capabilities = dict(capabilities or {})
        self.initialize_result: dict[str, Any] = {}
        self.protocol_version = LATEST_HANDSHAKE_VERSION
        self._dispatcher: JSONRPCDispatcher[Any] | None = None
        self._child: ChildStdio | None = None  # a stdio server: requests go raw
        self._stderr: IO[str] | None = None
        self._closing = anyio.Event()
        self._done = anyio.Event()
        self._broken = False
        self._next_id = 0
        self.deadlines: dict[str, Any] = {}
        """Requests' deadlines by request id (anything with a ``deadline``): progress about one extends it."""

    # -- lifecycle --------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Connect, initialise, report started, then hold the connection until :meth:`close`.

        Raises:
            UpstreamError: Before ``started``: the server could not be launched, reached or
                initialised (names the command/URL and the end of its stderr).
        """
        started = False
        failure: UpstreamError | None = None
        try:
            async with AsyncExitStack() as stack:
                try:
                    session = await self._open(stack)
                    # The deadline covers the handshake only: the transports' task groups are
                    # entered above, outside any cancel scope they would outlive.
                    with anyio.fail_after(self.spec.startup_timeout):
                        await self._initialize(session)
                except Exception as exc:
                    # Described now, while stderr is still readable; raised once the transport
                    # is down, so it is not wrapped into the transport's exception group.
                    failure = self._startup_error(exc)
                    failure.__cause__ = exc
                else:
                    started = True
                    task_status.started()
                    await self._closing.wait()
        except Exception as exc:
            if not started and failure is None:
                failure = self._startup_error(exc)
            # After start-up a broken transport must not tear down the caller's task group;
            # pending and later requests fail with CONNECTION_CLOSED instead.
        finally:
            self._done.set()
            if self._stderr is not None:
                self._stderr.close()
        if failure is not None:
            raise failure

    def _startup_error(self, exc: BaseException) -> UpstreamError:
        if isinstance(exc, MCPError):
            return self._error(f"did not initialise ({exc.error.message})")
        if isinstance(exc, TimeoutError):
            return self._error(f"did not answer initialize within {self.spec.startup_timeout:g}s")
        if isinstance(exc, OSError):
            return self._error(f"cannot be started: {exc.strerror or exc}")
        return self._error(f"cannot be reached: {_describe_exception(exc)}")

    async def _open(self, stack: AsyncExitStack) -> ClientSession:
        if self.spec.url is not None:
            http = create_mcp_http_client(headers=dict(self.spec.headers))
            await stack.enter_async_context(http)
            read, write = await stack.enter_async_context(
                streamable_http_client(self.spec.url, http_client=http)
            )
        else:
            stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
            self._stderr = stack.enter_context(stderr)  # closed by the exit stack
            params = StdioServerParameters(
                command=self.spec.command or "",
                args=list(self.spec.args),
                env=dict(self.spec.env) or None,
                cwd=self.spec.cwd,
            )
            child = ChildStdio(params, errlog=self._stderr, max_line=self.max_line, priority=self.priority)
            read, write = await stack.enter_async_context(child.open())
            self._child = child
        dispatcher: JSONRPCDispatcher[Any] = JSONRPCDispatcher(read, write)
        session = ClientSession(
            dispatcher=dispatcher,
            message_handler=self._on_message,
            client_info=_CLIENT_INFO,
            sampling_callback=self._sampling,
            elicitation_callback=self._elicitation,
            list_roots_callback=self._roots,
        )
        await stack.enter_async_context(session)
        self._dispatcher = dispatcher
        return session

    async def _initialize(self, session: ClientSession) -> None:
        assert self._dispatcher is not None
        # Initialise raw, so server info and capabilities are recorded exactly as sent.
        init_params = types.InitializeRequestParams(
            protocol_version=LATEST_HANDSHAKE_VERSION,
            capabilities=types.ClientCapabilities.model_validate(self.capabilities),
            client_info=_CLIENT_INFO,
        ).model_dump(by_alias=True, mode="json", exclude_none=True)
        raw = await self._dispatcher.send_raw_request("initialize", init_params, {"cancel_on_abandon": False})
        session.adopt(types.InitializeResult.model_validate(raw))
        self.initialize_result = raw
        self.protocol_version = session.protocol_version or LATEST_HANDSHAKE_VERSION
        await session.send_notification(types.InitializedNotification())

    async def close(self) -> None:
        """Stop the connection (the server process is ended) and wait until it is down."""
        self._closing.set()
        await self._done.wait()

    @property
    def alive(self) -> bool:
        """Whether the connection is still usable."""
        return not (self._done.is_set() or self._broken) and self._dispatcher is not None

    @property
    def child(self) -> ChildStdio | None:
        """A stdio server's process and lines, for requests written raw; None for a URL."""
        return self._child

    # -- traffic ----------------------------------------------------------------------------

    def next_request_id(self) -> str:
        """A fresh request id, also usable as the request's progress token."""
        self._next_id += 1
        return f"rs-{self._next_id}"

    async def request(
        self, method: str, params: Mapping[str, Any] | None, *, request_id: str | None = None
    ) -> dict[str, Any]:
        """Send one request and return the server's result exactly as received.

        Args:
            method: The MCP method.
            params: Wire params, forwarded as given.
            request_id: The JSON-RPC id to use (see :meth:`next_request_id`).

        Returns:
            The result object as the server sent it.

        Raises:
            MCPError: The server answered with a JSON-RPC error, or the connection broke (code
                ``CONNECTION_CLOSED``, message naming the server and its stderr tail).
            UpstreamTimeout: No answer (nor progress) within the spec's timeout.
        """
        if self._dispatcher is None:
            raise MCPError(
                code=types.CONNECTION_CLOSED, message=f"upstream {self.spec.describe()} is not connected"
            )
        timeout = self.spec.timeout
        try:
            if timeout is None:
                return await self._send(method, params, request_id)
            # Our own deadline rather than the dispatcher's: progress about the request extends it.
            # Cancelling the request sends the server a courtesy notifications/cancelled.
            with anyio.CancelScope(deadline=anyio.current_time() + timeout) as scope:
                if request_id is not None:
                    self.deadlines[request_id] = scope
                try:
                    return await self._send(method, params, request_id)
                finally:
                    self.deadlines.pop(request_id or "", None)
            raise self.timed_out(method)
        except MCPError as exc:
            if exc.error.code != types.CONNECTION_CLOSED:
                raise
            raise self.closed(method) from exc

    def timed_out(self, method: str) -> UpstreamTimeout:
        """The error of a ``method`` request left unanswered for the spec's timeout."""
        return UpstreamTimeout(
            code=types.REQUEST_TIMEOUT,
            message=(
                f"upstream {self.spec.describe()} did not answer {method} within {self.spec.timeout:g}s "
                "(nor report progress on it); the call was not recorded. Give it longer with "
                "`replay-sim record --timeout SECONDS`, or `timeout = SECONDS` for this server in "
                "the recorder config (0: no limit)"
            ),
        )

    def closed(self, method: str) -> MCPError:
        """The error of a ``method`` request whose connection closed first (naming the server's stderr)."""
        self._broken = True
        detail = f"upstream {self.spec.describe()} closed the connection during {method}"
        if tail := self.stderr_tail():
            detail += f"; its stderr ends: {' | '.join(tail.splitlines())}"
        return MCPError(code=types.CONNECTION_CLOSED, message=detail)

    async def _send(
        self, method: str, params: Mapping[str, Any] | None, request_id: str | None
    ) -> dict[str, Any]:
        """One request and its result: raw to a stdio server, else through the SDK's dispatcher."""
        assert self._dispatcher is not None
        if self._child is None or request_id is None:
            opts: dict[str, Any] = {"headers": {MCP_PROTOCOL_VERSION_HEADER: self.protocol_version}}
            if request_id is not None:
                opts["request_id"] = request_id
            return await self._dispatcher.send_raw_request(method, params, opts)  # type: ignore[arg-type]
        return await self._child.call(request_id, method, params)

    async def exchange(self, method: str, params: Mapping[str, Any], *, request_id: str) -> Exchange:
        """Send one request (see :meth:`request`); its result or error as recorded, and its latency.

        The notifications the server sent before its answer have been handled when this returns.

        Raises:
            UpstreamTimeout: No answer to record (see :meth:`request`).
        """
        result = error = None
        delivered = -1 if self._child is None else self._child.delivered
        started = time.perf_counter()
        try:
            result = await self.request(method, params, request_id=request_id)
        except UpstreamTimeout:
            raise
        except MCPError as exc:
            error = error_json(exc)
        latency_ms = (time.perf_counter() - started) * 1000
        if self._child is None or self._child.delivered != delivered:
            # Notifications are handled in tasks spawned before the response was read; let them land.
            await anyio.lowlevel.checkpoint()
        return Exchange(result, error, latency_ms)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            return  # transport faults surface as failed requests
        wire = message.model_dump(by_alias=True, mode="json", exclude_none=True)
        if wire.get("method") == "notifications/progress":
            scope = self.deadlines.get(str((wire.get("params") or {}).get("progressToken")))
            if scope is not None and self.spec.timeout is not None:  # still working on it
                scope.deadline = anyio.current_time() + self.spec.timeout
        if self.on_notification is None:
            return
        await self.on_notification(wire["method"], wire.get("params") or {})

    # -- server→client requests ------------------------------------------------------------

    async def _sampling(self, context: ClientRequestContext, params: types.CreateMessageRequestParams) -> Any:
        return await self._server_request("sampling/createMessage", params, _SAMPLING_RESULT)

    async def _elicitation(self, context: ClientRequestContext, params: types.ElicitRequestParams) -> Any:
        return await self._server_request("elicitation/create", params, _ELICIT_RESULT)

    async def _roots(self, context: ClientRequestContext) -> Any:
        return await self._server_request("roots/list", None, _ROOTS_RESULT)

    async def _server_request(self, method: str, params: Any, result: TypeAdapter[Any]) -> Any:
        """Hand a server→client request to :attr:`on_request`; its error goes back to the server."""
        if self.on_request is None:
            return types.ErrorData(code=types.INVALID_REQUEST, message=f"{method} is not supported")
        wire = {} if params is None else params.model_dump(by_alias=True, mode="json", exclude_none=True)
        try:
            return result.validate_python(await self.on_request(method, wire), by_name=False)
        except MCPError as exc:
            return exc.error

    # -- diagnostics ------------------------------------------------------------------------

    def stderr_tail(self) -> str:
        """The last characters the server wrote to stderr (stdio upstreams), stripped."""
        if self._stderr is None or self._stderr.closed:
            return ""
        try:
            self._stderr.flush()
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - _STDERR_TAIL * 4))
            return self._stderr.read()[-_STDERR_TAIL:].strip()
        except (OSError, ValueError):
            return ""

    def _error(self, what: str) -> UpstreamError:
        kind = "URL" if self.spec.url is not None else "command"
        message = f"upstream {kind} {self.spec.describe()} {what}"
        if tail := self.stderr_tail():
            message += f"; its stderr ends: {' | '.join(tail.splitlines())}"
        elif self.spec.url is None:
            message += " (it wrote nothing to stderr)"
        return UpstreamError(message)


def _describe_exception(exc: BaseException) -> str:
    """One line for an exception, unwrapping single-member exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
