"""The downstream face of one recorded server: an MCP ``Server`` that answers every request itself.

A :class:`ServerProxy` is what a client of the recorder talks to for one upstream. Its single
middleware answers every request *raw*: ``initialize``, ``ping`` and ``server/discover`` from what
the upstream said at start-up, everything else through the client's
:class:`~replay_sim.record.session.Session` (its own upstream connection and store session). It
does not know the :class:`~replay_sim.record.recorder.Recorder` that owns it: the recorder hands it
the store, the redaction rules, and how to connect and run background tasks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

import anyio
import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types import SERVER_INFO_META_KEY
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

from replay_sim.errors import StoreError, UpstreamError
from replay_sim.protocol import LISTING_FIELDS, declared, episode_id
from replay_sim.record.commits import GroupCommit
from replay_sim.record.config import UpstreamSpec
from replay_sim.record.explore import Explorer
from replay_sim.record.session import Session
from replay_sim.record.upstream import Upstream
from replay_sim.redaction import Redactor
from replay_sim.schema import tool_schemas
from replay_sim.store import ServerRecord, Store

__all__ = ["Connect", "ServerProxy", "unrecorded"]

T = TypeVar("T")

Connect = Callable[[UpstreamSpec, dict[str, Any] | None], Awaitable[Upstream]]
"""Opens a started connection to an upstream, declaring the given client capabilities."""

# 2026-era results of these methods must carry cache hints; a proxy's answers are never cacheable.
_CACHEABLE = frozenset({*LISTING_FIELDS, "resources/read", "server/discover"})


class ServerProxy:
    """The downstream face of one named upstream: a low-level ``Server`` and its sessions.

    Args:
        name: The recorded server name.
        spec: How to reach the real server.
        store: Where recordings go.
        redactor: Redaction rules applied to everything written.
        connect: Opens a connection to the upstream (the recorder's :meth:`~Recorder.open_upstream`).
        spawn: Runs a background task that outlives the request starting it.
    """

    def __init__(
        self,
        name: str,
        spec: UpstreamSpec,
        *,
        store: Store,
        redactor: Redactor,
        connect: Connect,
        spawn: Callable[..., None],
    ) -> None:
        self.name = name
        self.spec = spec
        self.store = store
        self.redactor = redactor
        self._connect = connect
        self._spawn = spawn
        self.initialize_result: dict[str, Any] = {}
        self.server: Server[Any] = Server(name)
        self.server.middleware = [self._middleware]
        self._spare: Upstream | None = None  # the probe connection, handed to the first session
        self.explorer = Explorer() if spec.explore else None
        self.read_only: frozenset[str] = frozenset()  # tools whose readOnlyHint is true
        self.sessions: set[Session] = set()
        self.commits = GroupCommit(store, busy=lambda: any(s.inflight for s in self.sessions))
        self._episodes: dict[str, Session] = {}
        self._episode_lock = anyio.Lock()

    async def start(self) -> None:
        """Connect once (fail fast), record server info, keep the connection for the first session."""
        upstream = await self._connect(self.spec, None)
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
        await self.write(partial(self.store.put_server, record), "server info")
        await self._record_listings(upstream, record.capabilities)
        if self.explorer is not None:  # what earlier runs asked and settled is in the store
            await self.write(partial(self.explorer.resume, self.store, self.name), "exploration ledger")

    async def close(self) -> None:
        """End every session's upstream connection, and the spare one."""
        for session in list(self.sessions):
            await session.close()
        if self._spare is not None:
            await self._spare.close()

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
                await self.write(partial(self.store.put_listing, self.name, method, redacted), method)

    # -- what a session needs (replay_sim.record.session.SessionHost) -------------------------

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
            raise unrecorded(what, exc) from exc

    async def record(self, what: str, **call: Any) -> int:
        """Commit one call (:meth:`Store.record_call`'s arguments) and return its id, as :meth:`write`.

        Calls of several sessions answered at once share one transaction (:class:`GroupCommit`);
        each returns only once its row is committed.

        Raises:
            MCPError: The call could not be recorded; the client is told instead of getting its answer.
        """
        try:
            return await self.commits.record(call)
        except StoreError as exc:
            raise unrecorded(what, exc) from exc

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in the background, in the recorder's task group (it must not raise)."""
        self._spawn(fn, *args)

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
            upstream = await self._connect(self.spec, capabilities)
        store_session = await self.write(partial(self.store.start_session, self.name), "session start")
        session = Session(self, upstream, store_session, outbound)
        self.sessions.add(session)
        return session

    async def _end_session(self, session: Session) -> None:
        self.sessions.discard(session)
        await session.close()


def unrecorded(what: str, exc: StoreError) -> MCPError:
    """The error a client gets instead of an answer that could not be recorded."""
    return MCPError(
        code=types.INTERNAL_ERROR, message=f"replay-sim could not record {what}, so it is not answered: {exc}"
    )
