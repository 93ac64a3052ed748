"""The recording proxy: an MCP server that forwards to real servers and records what they answer.

::

    MCP client ──stdio or HTTP /mcp/<name>──► Recorder ──stdio or HTTP──► real server
                                                 │ server info, listings, calls (redacted)
                                                 ▼
                                            Store (SQLite)

Each downstream MCP session gets its own upstream connection (a fresh server process for a
command, a fresh HTTP session for a URL) and its own store session, so a server crashing under one
client leaves the others working. Each upstream is served by a
:class:`~replay_sim.record.proxy.ServerProxy`, a low-level SDK ``Server`` whose single middleware
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
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from mcp.server.lowlevel import Server

from replay_sim.errors import ConfigError, StoreError, UpstreamError
from replay_sim.record.config import UpstreamSpec
from replay_sim.record.passthrough import PassThrough
from replay_sim.record.proxy import ServerProxy
from replay_sim.record.upstream import Upstream
from replay_sim.redaction import RULES_META_KEY, Redactor
from replay_sim.stdio_transport import native_stdio
from replay_sim.store import Store

__all__ = ["Recorder", "record_stdio", "recording"]


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
        self.proxies = {
            name: ServerProxy(
                name,
                spec,
                store=store,
                redactor=self.redactor,
                connect=self.open_upstream,
                spawn=self.spawn,
            )
            for name, spec in upstreams.items()
        }
        self._stack = AsyncExitStack()
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Recorder:
        await self._stack.__aenter__()
        try:
            # The store keeps the rules (not the secrets) so a replay redacts calls the same way.
            previous = self.store.meta(RULES_META_KEY)
            if previous is not None:
                self.redactor = self.redactor.merged(Redactor.from_rules(previous))
                for proxy in self.proxies.values():  # they record with the rules the store keeps
                    proxy.redactor = self.redactor
            self.store.set_meta(RULES_META_KEY, self.redactor.rules())
            self._tg = await self._stack.enter_async_context(anyio.create_task_group())
            self._stack.callback(self._tg.cancel_scope.cancel)
            self._stack.push_async_callback(self._close_proxies)
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

    async def _close_proxies(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            for proxy in self.proxies.values():
                await proxy.close()

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

    def server(self, name: str) -> Server[Any]:
        """The downstream MCP server (low-level SDK ``Server``) proxying upstream ``name``.

        Raises:
            ConfigError: No upstream of that name (the message names the configured ones), as
                :meth:`Replay.server <replay_sim.Replay.server>` raises for a server never recorded.
        """
        proxy = self.proxies.get(name)
        if proxy is None:
            known = ", ".join(self.proxies)
            raise ConfigError(f"no upstream named {name!r} in this recorder (configured: {known})")
        return proxy.server

    async def serve_stdio(self, name: str) -> None:
        """Serve upstream ``name`` to one client over this process's stdin/stdout until it hangs up.

        The client's plain calls pass through without the SDK server once its session is
        established (:class:`~replay_sim.record.passthrough.PassThrough`).
        """
        server = self.server(name)
        relay = PassThrough(self.proxies[name])
        async with native_stdio(shortcut=relay) as (read_stream, write_stream):
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
