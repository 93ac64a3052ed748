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
capabilities its client declared, so the server asks exactly what it would ask that client. One
client session's forwarding and recording is a :class:`~replay_sim.record.session.Session`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.abc
import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types import SERVER_INFO_META_KEY
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

from replay_sim.errors import StoreError, UpstreamError
from replay_sim.protocol import CALL_METHODS, LISTING_FIELDS, declared, episode_id
from replay_sim.record.explore import Explorer
from replay_sim.record.session import Session
from replay_sim.record.upstream import Upstream, UpstreamSpec
from replay_sim.redaction import RULES_META_KEY, Redactor
from replay_sim.schema import tool_schemas
from replay_sim.stdio_transport import native_stdio
from replay_sim.store import ServerRecord, Store

__all__ = ["CALL_METHODS", "Recorder", "record_stdio", "recording"]

T = TypeVar("T")

# 2026-era results of these methods must carry cache hints; a proxy's answers are never cacheable.
_CACHEABLE = frozenset({*LISTING_FIELDS, "resources/read", "server/discover"})


class ServerProxy:
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
        self._episodes: dict[str, Session] = {}
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
                field = LISTING_FIELDS[method]
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

    async def _session_for(self, ctx: ServerRequestContext[Any, Any]) -> Session:
        connection = getattr(ctx.session, "_connection", None)  # SDK 2.3: not exposed publicly
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS or connection is None:
            # The 2026 era has no sessions: an episode id (header or _meta) stands in for one.
            return await self._episode_session(ctx)
        state: dict[str, Any] = connection.state
        lock = state.setdefault("replay-sim/lock", anyio.Lock())
        async with lock:
            session = state.get("replay-sim/session")
            if session is None:
                session = await self._new_session(getattr(connection, "outbound", None), declared(ctx))
                state["replay-sim/session"] = session
                connection.exit_stack.push_async_callback(self._end_session, session)
            return session

    async def _episode_session(self, ctx: ServerRequestContext[Any, Any]) -> Session:
        episode = episode_id((ctx.params or {}).get("_meta"), getattr(ctx.request, "headers", None))
        key = episode or ""
        async with self._episode_lock:
            if key not in self._episodes:  # what its first request declares
                self._episodes[key] = await self._new_session(None, declared(ctx))
            return self._episodes[key]

    async def _new_session(self, outbound: Any, capabilities: dict[str, Any]) -> Session:
        upstream = None
        if not capabilities:  # the spare connection declared none
            upstream, self._spare = self._spare, None
        if upstream is None or not upstream.alive:
            upstream = await self.recorder.open_upstream(self.spec, capabilities)
        store = self.recorder.store
        store_session = await self.recorder.write(partial(store.start_session, self.name), "session start")
        session = Session(self, upstream, store_session, outbound)
        self.recorder.sessions.add(session)
        return session

    async def _end_session(self, session: Session) -> None:
        self.recorder.sessions.discard(session)
        await session.close()


class Recorder:
    """Records one or more real MCP servers into a :class:`Store` while proxying clients to them.

    Use as an async context manager: entering connects to every upstream once (raising
    :class:`UpstreamError` if one does not start) and records its server info; then serve clients
    with :meth:`serve_stdio` or the ASGI app from :func:`replay_sim.record.http.http_app`.

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
        self.proxies = {name: ServerProxy(self, name, spec) for name, spec in upstreams.items()}
        self.sessions: set[Session] = set()
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

            async def start(proxy: ServerProxy) -> None:
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

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in the recorder's task group (it must not raise)."""
        if self._tg is None:
            raise RuntimeError("enter the Recorder (async with) before spawning")
        self._tg.start_soon(fn, *args)

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
