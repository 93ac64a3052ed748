"""The recording proxy: an MCP server that forwards to real servers and records what they answer.

::

    MCP client ──stdio or HTTP /mcp/<name>──► Recorder ──stdio or HTTP──► real server
                                                 │ server info, listings, calls (redacted)
                                                 ▼
                                            Store (SQLite)

Each downstream MCP session gets its own upstream connection (a fresh server process for a
command, a fresh HTTP session for a URL) and its own store session, so a server crashing under one
client leaves the others working. The proxy is a low-level SDK ``Server`` whose single middleware
answers every request itself, *raw*: params are rebuilt (the 2026 ``_meta`` envelope is never
forwarded to a handshake-era upstream) and results are handed back exactly as the upstream sent
them — and only after their row is committed. Progress and log notifications are forwarded to the
client and recorded with the call they belong to; so are the server's requests to the client
(sampling, elicitation, roots), with the client's answer: each upstream connection declares the
capabilities its client declared, so the server asks exactly what it would ask that client.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel
import mcp_types as types
from mcp.server.connection import allowed_log_levels
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types import LOG_LEVEL_META_KEY, SERVER_INFO_META_KEY
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

from replay_sim.canonical import answer_text
from replay_sim.errors import StoreError, UpstreamError
from replay_sim.explore import Explorer
from replay_sim.protocol import EPISODE_META_KEY, ask_client, episode_id
from replay_sim.redaction import RULES_META_KEY, Redactor
from replay_sim.schema import tool_schemas
from replay_sim.stdio_transport import native_stdio
from replay_sim.store import LISTING_METHODS, Origin, ServerRecord, Store
from replay_sim.upstream import FORWARDED_CAPABILITIES, Upstream, UpstreamSpec

__all__ = ["RECORDED_METHODS", "Recorder", "record_stdio", "recording"]

T = TypeVar("T")

RECORDED_METHODS = frozenset({"tools/call", "resources/read", "prompts/get", "completion/complete"})
"""Requests recorded as calls; listings go to :meth:`Store.put_listing`, the rest is only forwarded."""
_LIST_FIELDS = {
    "tools/list": "tools",
    "resources/list": "resources",
    "resources/templates/list": "resourceTemplates",
    "prompts/list": "prompts",
}
_RESERVED_META_PREFIX = "io.modelcontextprotocol/"
# 2026-era results of these methods must carry cache hints; a proxy's answers are never cacheable.
_CACHEABLE = frozenset({*_LIST_FIELDS, "resources/read", "server/discover"})


@dataclass
class _Call:
    """A forwarded request waiting for its answer; collects the notifications that belong to it.

    ``ctx`` is the client's request, or None for a call the recorder makes itself (exploring):
    its notifications are recorded, never forwarded.
    """

    ctx: ServerRequestContext[Any, Any] | None
    notifications: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    latency_ms: float = 0.0


class _Session:
    """One downstream MCP session: its upstream connection and its store session."""

    def __init__(self, proxy: _ServerProxy, upstream: Upstream, store_session: str, outbound: Any) -> None:
        self.proxy = proxy
        self.upstream = upstream
        self.store_session = store_session
        self.outbound = outbound  # the connection's standalone channel, if it has one
        self.inflight: dict[str, _Call] = {}
        self.pages: dict[str, dict[str, Any]] = {}
        upstream.on_notification = self.on_notification
        upstream.on_request = self.on_request

    async def close(self) -> None:
        await self.upstream.close()

    async def forward(self, ctx: ServerRequestContext[Any, Any]) -> dict[str, Any]:
        """Send one downstream request upstream, record it, and return the result to hand back."""
        method = ctx.method
        params = {k: v for k, v in (ctx.params or {}).items() if k != "_meta"}
        meta = dict((ctx.params or {}).get("_meta") or {})
        # Rebuild _meta: the 2026 envelope and our episode key are not the upstream's business.
        meta = {
            k: v
            for k, v in meta.items()
            if not k.startswith(_RESERVED_META_PREFIX) and k not in (EPISODE_META_KEY, "progressToken")
        }
        call = await self._exchange(method, params, meta, ctx)
        result, error = call.result, call.error
        if method in RECORDED_METHODS:
            await self._record(method, params, call, Origin.LIVE)
            if method == "tools/call" and result is not None and not result.get("isError"):
                await self._explore(params, result)
        elif method in LISTING_METHODS and result is not None:
            await self._record_listing(method, params, result)
        if error is not None:
            raise MCPError(code=error["code"], message=error["message"], data=error["data"])
        assert result is not None
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return self.proxy.modern_result(method, result)
        return result

    async def _exchange(
        self,
        method: str,
        params: dict[str, Any],
        meta: dict[str, Any],
        ctx: ServerRequestContext[Any, Any] | None,
    ) -> _Call:
        """Send one request upstream and wait for its answer (and the notifications before it)."""
        request_id = self.upstream.next_request_id()
        if method in RECORDED_METHODS:
            meta = {**meta, "progressToken": request_id}  # always ask, so the recording holds the progress
        call = _Call(ctx)
        self.inflight[request_id] = call
        started = time.perf_counter()
        try:
            call.result = await self.upstream.request(
                method, {**params, "_meta": meta} if meta else params, request_id=request_id
            )
        except MCPError as exc:
            call.error = {"code": exc.error.code, "message": exc.error.message, "data": exc.error.data}
        finally:
            call.latency_ms = (time.perf_counter() - started) * 1000
            # Notifications are handled in tasks spawned before the response was read; let them land.
            await anyio.lowlevel.checkpoint()
            del self.inflight[request_id]
        return call

    async def _record(self, method: str, params: dict[str, Any], call: _Call, origin: Origin) -> None:
        """Commit one answered call (redacted) to this session."""
        redact = self.proxy.redactor.redact
        await self.proxy.recorder.write(
            partial(
                self.proxy.recorder.store.record_call,
                self.proxy.name,
                method,
                redact(params),
                result=redact(call.result),
                error=redact(call.error),
                session=self.store_session,
                latency_ms=round(call.latency_ms, 3),
                origin=origin,
                notifications=redact(call.notifications),
            ),
            f"{method} {params.get('name') or params.get('uri') or ''}".strip(),
        )

    async def _explore(self, params: dict[str, Any], result: dict[str, Any]) -> None:
        """Ask the variants of a successful read-only call the explorer still wants answered.

        Runs before the client gets its answer, and only when no other call of this session is
        in flight, so every variant sees the state the original call saw. A failure here costs
        the exploration, never the client's answer.
        """
        explorer, name = self.proxy.explorer, params.get("name")
        arguments = params.get("arguments")
        if (
            explorer is None
            or name not in self.proxy.read_only
            or self.inflight
            or not isinstance(arguments, dict)
        ):
            return
        original = answer_text(result, None)
        try:
            for variant in explorer.variants(name, arguments):
                varied = {**params, "arguments": variant.arguments}
                call = await self._exchange("tools/call", varied, {}, None)
                await self._record("tools/call", varied, call, Origin.EXPLORE)
                explorer.observe(variant, original, answer_text(call.result, call.error))
        except (MCPError, UpstreamError):
            return

    async def _record_listing(self, method: str, params: dict[str, Any], result: dict[str, Any]) -> None:
        """Record a listing; cursor pages are merged and recorded once the last page arrives."""
        items = _LIST_FIELDS[method]
        if params.get("cursor") is None:
            merged = {k: v for k, v in result.items() if k != "nextCursor"}
        else:
            previous = self.pages.get(method)
            if previous is None:
                return  # a page of a listing whose first page we did not see
            merged = {**previous, items: [*previous.get(items, []), *result.get(items, [])]}
        if result.get("nextCursor") is not None:
            self.pages[method] = merged
            return
        self.pages.pop(method, None)
        store = self.proxy.recorder.store
        redacted = self.proxy.redactor.redact(merged, keys=False)
        await self.proxy.recorder.write(partial(store.put_listing, self.proxy.name, method, redacted), method)

    async def on_notification(self, method: str, params: dict[str, Any]) -> None:
        """Record an upstream notification with its call and forward it downstream."""
        if method == "notifications/progress":
            call = self.inflight.get(str(params.get("progressToken")))
            if call is None:
                return
            call.notifications.append({"method": method, "params": _without(params, "progressToken")})
            if call.ctx is not None:  # a no-op unless the client asked for progress on this request
                await call.ctx.session.report_progress(
                    params.get("progress", 0), params.get("total"), params.get("message")
                )
            return
        calls = list(self.inflight.values())
        if method == "notifications/message":
            # stdio carries no request id on log messages: they belong to whatever is in flight.
            for call in calls:
                call.notifications.append({"method": method, "params": params})
            if calls:
                clients = [c.ctx for c in calls if c.ctx is not None]
                if clients:
                    await self._log_to(clients[0], params)
                return
        if self.outbound is not None:
            await self.outbound.notify(method, params)

    async def on_request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Forward a server→client request to the client whose call is in flight; record the exchange.

        It is recorded among the call's notifications, in order, with the client's ``result`` (or
        ``error``): replay asks the client again and serves the call only if it answers the same.
        """
        calls = [c for c in self.inflight.values() if c.ctx is not None]
        if len(calls) != 1:
            which = "no client call is" if not calls else f"{len(calls)} client calls are"
            raise MCPError(
                code=types.INVALID_REQUEST,
                message=f"replay-sim cannot forward {method}: {which} in flight on this session",
            )
        call = calls[0]
        assert call.ctx is not None
        exchange: dict[str, Any] = {"method": method, "params": params}
        call.notifications.append(exchange)
        try:
            exchange["result"] = await ask_client(call.ctx, method, params)
        except MCPError as exc:
            exchange["error"] = {"code": exc.error.code, "message": exc.error.message, "data": exc.error.data}
            raise
        return exchange["result"]

    async def _log_to(self, ctx: ServerRequestContext[Any, Any], params: dict[str, Any]) -> None:
        level = params.get("level")
        request_meta = (ctx.params or {}).get("_meta") or {}
        if level not in allowed_log_levels(
            ctx.protocol_version, {LOG_LEVEL_META_KEY: request_meta.get(LOG_LEVEL_META_KEY)}
        ):
            return  # a 2026 client that did not opt in to logs on this request gets none
        notification = types.LoggingMessageNotification(
            params=types.LoggingMessageNotificationParams.model_validate(params, by_name=False)
        )
        await ctx.session.send_notification(notification, related_request_id=ctx.request_id)


class _ServerProxy:
    """The downstream face of one named upstream: a low-level ``Server`` and its sessions."""

    def __init__(self, recorder: Recorder, name: str, spec: UpstreamSpec) -> None:
        self.recorder = recorder
        self.name = name
        self.spec = spec
        self.redactor = recorder.redactor
        self.initialize_result: dict[str, Any] = {}
        self.server: Server[Any] = Server(name)
        self.server.middleware = [self._middleware]
        self._spare: Upstream | None = None  # the probe connection, handed to the first session
        self.explorer = Explorer() if spec.explore else None
        self.read_only: frozenset[str] = frozenset()  # tools whose readOnlyHint is true
        self._episodes: dict[str, _Session] = {}
        self._episode_lock = anyio.Lock()

    async def start(self) -> None:
        """Connect once (fail fast), record server info, keep the connection for the first session."""
        upstream = await self.recorder.open_upstream(self.spec)
        self._spare = upstream
        self.initialize_result = upstream.initialize_result
        init = self.initialize_result
        record = ServerRecord(
            self.name,
            self.redactor.redact(init.get("serverInfo") or {}, keys=False),
            self.redactor.redact(init.get("capabilities") or {}, keys=False),
            init.get("protocolVersion"),
            None if init.get("instructions") is None else self.redactor.text(init["instructions"]),
        )
        await self.recorder.write(partial(self.recorder.store.put_server, record), "server info")
        await self._record_listings(upstream, record.capabilities)

    async def _record_listings(self, upstream: Upstream, capabilities: dict[str, Any]) -> None:
        """Record every listing the capabilities advertise, all pages, before any client asks.

        A replay is only as complete as its listings: a client that never called ``prompts/list``
        while recording would otherwise leave the replayed server without prompts.
        """
        wanted: dict[str, tuple[str, ...]] = {
            "tools": ("tools/list",),
            "prompts": ("prompts/list",),
            "resources": ("resources/list", "resources/templates/list"),
        }
        for capability, methods in wanted.items():
            if capability not in capabilities:
                continue
            for method in methods:
                field = _LIST_FIELDS[method]
                merged: dict[str, Any] = {field: []}
                cursor: str | None = None
                try:
                    while True:
                        page = await upstream.request(method, {"cursor": cursor} if cursor else {})
                        items = [*merged[field], *page.get(field, [])]
                        merged = {**{k: v for k, v in page.items() if k != "nextCursor"}, field: items}
                        if not (cursor := page.get("nextCursor")):
                            break
                except MCPError:
                    continue  # e.g. no resource templates: the replay answers an empty listing
                if method == "tools/list":
                    self.read_only = frozenset(n for n, t in tool_schemas(merged).items() if t.read_only)
                redacted = self.redactor.redact(merged, keys=False)
                store = self.recorder.store
                await self.recorder.write(partial(store.put_listing, self.name, method, redacted), method)

    # -- the middleware that answers everything --------------------------------------------

    async def _middleware(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.request_id is None:  # a notification (initialized, cancelled): the SDK's business
            return await call_next(ctx)
        method = ctx.method
        if method == "initialize":
            requested = (ctx.params or {}).get("protocolVersion")
            negotiated = requested if requested in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION
            return {**self.initialize_result, "protocolVersion": negotiated}
        if method == "ping":
            return await call_next(ctx)
        if method == "server/discover":
            return self._discover_result()
        try:
            session = await self._session_for(ctx)
        except UpstreamError as exc:
            raise MCPError(code=types.INTERNAL_ERROR, message=str(exc)) from exc
        return await session.forward(ctx)

    def _discover_result(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "supportedVersions": list(MODERN_PROTOCOL_VERSIONS),
            "capabilities": self.initialize_result.get("capabilities") or {},
        }
        if self.initialize_result.get("instructions") is not None:
            result["instructions"] = self.initialize_result["instructions"]
        return self.modern_result("server/discover", result)

    def modern_result(self, method: str, result: dict[str, Any]) -> dict[str, Any]:
        """A 2026-era answer: the upstream's result plus what that era requires.

        That is ``resultType``, the ``serverInfo`` stamp and, for cacheable methods, cache hints
        saying "immediately stale, private" (a recording proxy must not be cached around).
        """
        out = {**result, "resultType": result.get("resultType") or "complete"}
        if method in _CACHEABLE:
            out.setdefault("ttlMs", 0)
            out.setdefault("cacheScope", "private")
        meta = out.get("_meta")
        if meta is None or (isinstance(meta, dict) and meta.get(SERVER_INFO_META_KEY) is None):
            out["_meta"] = {
                **(meta or {}),
                SERVER_INFO_META_KEY: self.initialize_result.get("serverInfo") or {},
            }
        return out

    # -- sessions -----------------------------------------------------------------------------

    async def _session_for(self, ctx: ServerRequestContext[Any, Any]) -> _Session:
        connection = getattr(ctx.session, "_connection", None)  # SDK 2.3: not exposed publicly
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS or connection is None:
            # The 2026 era has no sessions: an episode id (header or _meta) stands in for one.
            return await self._episode_session(ctx)
        state: dict[str, Any] = connection.state
        lock = state.setdefault("replay-sim/lock", anyio.Lock())
        async with lock:
            session = state.get("replay-sim/session")
            if session is None:
                # The upstream is told what this client can be asked (sampling, elicitation, roots):
                # a server asks a client only what it declared, and answers differently otherwise.
                declared = ctx.session.client_capabilities
                capabilities = (
                    {}
                    if declared is None
                    else declared.model_dump(by_alias=True, mode="json", exclude_none=True)
                )
                session = await self._new_session(getattr(connection, "outbound", None), capabilities)
                state["replay-sim/session"] = session
                connection.exit_stack.push_async_callback(self._end_session, session)
            return session

    async def _episode_session(self, ctx: ServerRequestContext[Any, Any]) -> _Session:
        episode = episode_id((ctx.params or {}).get("_meta"), getattr(ctx.request, "headers", None))
        key = episode or ""
        async with self._episode_lock:
            if key not in self._episodes:
                self._episodes[key] = await self._new_session(None)
            return self._episodes[key]

    async def _new_session(self, outbound: Any, capabilities: dict[str, Any] | None = None) -> _Session:
        wanted = {k: v for k, v in (capabilities or {}).items() if k in FORWARDED_CAPABILITIES}
        upstream = None
        if not wanted:  # the spare connection declared no capabilities
            upstream, self._spare = self._spare, None
        if upstream is None or not upstream.alive:
            upstream = await self.recorder.open_upstream(self.spec, wanted)
        store = self.recorder.store
        store_session = await self.recorder.write(partial(store.start_session, self.name), "session start")
        session = _Session(self, upstream, store_session, outbound)
        self.recorder.sessions.add(session)
        return session

    async def _end_session(self, session: _Session) -> None:
        self.recorder.sessions.discard(session)
        await session.close()


class Recorder:
    """Records one or more real MCP servers into a :class:`Store` while proxying clients to them.

    Use as an async context manager: entering connects to every upstream once (raising
    :class:`UpstreamError` if one does not start) and records its server info; then serve clients
    with :meth:`serve_stdio` or the ASGI app from :func:`replay_sim.recorder_http.http_app`.

    Args:
        store: Where recordings go.
        upstreams: Real servers by recorded server name.
        redactor: Redaction rules; the upstreams' env and header values are always added.
    """

    def __init__(
        self, store: Store, upstreams: Mapping[str, UpstreamSpec], redactor: Redactor | None = None
    ) -> None:
        if not upstreams:
            raise ValueError("a Recorder needs at least one upstream")
        self.store = store
        secrets = [s for spec in upstreams.values() for s in spec.secrets()]
        self.redactor = (redactor or Redactor()).with_secrets(secrets)
        self.proxies = {name: _ServerProxy(self, name, spec) for name, spec in upstreams.items()}
        self.sessions: set[_Session] = set()
        self._stack = AsyncExitStack()
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Recorder:
        await self._stack.__aenter__()
        try:
            # The store keeps the rules (not the secrets) so a replay redacts calls the same way.
            previous = self.store.meta(RULES_META_KEY)
            if previous is not None:
                self.redactor = self.redactor.merged(Redactor.from_rules(previous))
            self.store.set_meta(RULES_META_KEY, self.redactor.rules())
            self._tg = await self._stack.enter_async_context(anyio.create_task_group())
            self._stack.callback(self._tg.cancel_scope.cancel)
            self._stack.push_async_callback(self._close_sessions)
            errors: list[BaseException] = []

            async def start(proxy: _ServerProxy) -> None:
                try:
                    await proxy.start()
                except (UpstreamError, StoreError) as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as starting:
                for proxy in self.proxies.values():
                    starting.start_soon(start, proxy)
            if errors:
                raise errors[0]
        except BaseException:
            await self._stack.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.__aexit__(None, None, None)

    async def _close_sessions(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            for session in list(self.sessions):
                await session.close()
            for proxy in self.proxies.values():
                if proxy._spare is not None:
                    await proxy._spare.close()

    async def open_upstream(self, spec: UpstreamSpec, capabilities: dict[str, Any] | None = None) -> Upstream:
        """Start a new connection to ``spec`` in the recorder's task group.

        Args:
            spec: The real server.
            capabilities: Client capabilities to declare to it (see :class:`Upstream`).

        Raises:
            UpstreamError: The server did not start (names the command/URL and its stderr tail).
        """
        if self._tg is None:
            raise RuntimeError("enter the Recorder (async with) before opening upstreams")
        upstream = Upstream(spec, capabilities=capabilities)
        await self._tg.start(upstream.run)
        return upstream

    async def write(self, fn: Callable[[], T], what: str) -> T:
        """Run one store write (a commit) and return its value.

        The write runs on the event loop, not in a worker thread: a WAL commit with
        ``synchronous=NORMAL`` takes tens of microseconds, a thread hop costs more than that
        (measured: ~0.15-0.2 ms per call), and every answer waits for its commit anyway, so a
        locked store stalls answers either way.

        Raises:
            MCPError: The write failed; the client is told instead of getting an unrecorded result.
        """
        try:
            return fn()
        except StoreError as exc:
            raise MCPError(
                code=types.INTERNAL_ERROR,
                message=f"replay-sim could not record {what}, so it is not answered: {exc}",
            ) from exc

    def server(self, name: str) -> Server[Any]:
        """The downstream MCP server (low-level SDK ``Server``) proxying upstream ``name``."""
        try:
            return self.proxies[name].server
        except KeyError:
            raise KeyError(f"no upstream named {name!r}; configured: {', '.join(self.proxies)}") from None

    async def serve_stdio(self, name: str) -> None:
        """Serve upstream ``name`` to one client over this process's stdin/stdout until it hangs up."""
        server = self.server(name)
        async with native_stdio() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())


@asynccontextmanager
async def recording(
    store: Store | str | Path, upstreams: Mapping[str, UpstreamSpec], redactor: Redactor | None = None
) -> AsyncIterator[Recorder]:
    """Open the store (when given a path) and an entered :class:`Recorder` over it; close both after.

    Raises:
        UpstreamError: An upstream did not start.
        StoreError: The store cannot be opened.
    """
    owned = not isinstance(store, Store)
    opened = Store(store) if not isinstance(store, Store) else store
    try:
        async with Recorder(opened, upstreams, redactor) as recorder:
            yield recorder
    finally:
        if owned:
            opened.close()


async def record_stdio(
    upstream: UpstreamSpec,
    *,
    store: Store | str | Path,
    name: str | None = None,
    redactor: Redactor | None = None,
) -> None:
    """Record one upstream while serving a single client over stdin/stdout (until it hangs up).

    Args:
        upstream: The real server.
        store: A :class:`Store` or a database path.
        name: Recorded server name (default: derived from the command or URL).
        redactor: Redaction rules (the upstream's env/header values are always redacted).

    Raises:
        UpstreamError: The upstream did not start.
        StoreError: The store cannot be opened or written.
    """
    name = name or upstream.default_name()
    async with recording(store, {name: upstream}, redactor) as recorder:
        await recorder.serve_stdio(name)


def _without(mapping: Mapping[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k != key}
