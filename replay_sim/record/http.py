"""The recorder's streamable HTTP face: one MCP endpoint per upstream at ``/mcp/<server>``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from replay_sim.httpserver import HttpOptions, uvicorn_server
from replay_sim.listener import HostCheck, HostGuard, base_url, listen
from replay_sim.protocol import EPISODE_HEADER, EPISODE_META_KEY
from replay_sim.record.config import UpstreamSpec
from replay_sim.record.recorder import Recorder, recording
from replay_sim.redaction import Redactor
from replay_sim.store import Store

__all__ = ["http_app", "record_http"]


def http_app(
    recorder: Recorder,
    *,
    host: str = "127.0.0.1",
    session_idle_timeout: float | None = 1800,
    allowed_hosts: Iterable[str] = (),
) -> HostGuard:
    """An ASGI app serving every upstream of an entered ``recorder`` at ``/mcp/<server>``.

    Args:
        recorder: An entered :class:`Recorder` (its upstreams are connected).
        host: The interface the app is served on (decides which Host headers are accepted).
        session_idle_timeout: Seconds after which an idle client session (and its upstream) ends.
        allowed_hosts: More names clients reach the recorder by (see :class:`HostCheck`).

    Returns:
        An ASGI app (DNS-rebinding protection around a Starlette app whose lifespan runs the
        session managers).
    """
    managers: list[StreamableHTTPSessionManager] = []
    routes: list[Route] = []
    for name in recorder.proxies:
        manager = StreamableHTTPSessionManager(
            app=recorder.server(name), session_idle_timeout=session_idle_timeout
        )
        managers.append(manager)
        routes.append(Route(f"/mcp/{name}", endpoint=StreamableHTTPASGIApp(manager)))
    routes.append(
        Route("/episodes/{episode}/mcp/{server}", _not_an_episode_url, methods=["GET", "POST", "DELETE"])
    )

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            for manager in managers:
                await stack.enter_async_context(manager.run())
            yield

    return HostGuard(Starlette(routes=routes, lifespan=lifespan), HostCheck(host, allowed_hosts))


async def _not_an_episode_url(request: Request) -> JSONResponse:
    """404 for an episode URL, saying what the recorder serves instead (episode URLs are the replay's)."""
    server = request.path_params["server"]
    message = (
        f"the recorder serves /mcp/{server}, not episode URLs (/episodes/<id>/mcp/<server> is the "
        f"replay's): record a rollout on /mcp/{server}, and name its episode with the "
        f'{EPISODE_HEADER} header or _meta["{EPISODE_META_KEY}"]'
    )
    error = {"code": -32600, "message": message}
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, status_code=404)


async def record_http(
    upstreams: Mapping[str, UpstreamSpec],
    *,
    store: Store | str | Path,
    host: str = "127.0.0.1",
    port: int = 8765,
    redactor: Redactor | None = None,
    on_ready: Callable[[str], None] | None = None,
    allowed_hosts: Iterable[str] = (),
    options: HttpOptions | None = None,
) -> None:
    """Record upstreams while serving clients over streamable HTTP until interrupted (SIGINT/SIGTERM).

    Args:
        upstreams: Real servers by recorded server name; each is served at ``/mcp/<name>``.
        store: A :class:`Store` or a database path.
        host: Interface to listen on.
        port: TCP port (0 picks a free one).
        redactor: Redaction rules (env/header values of the upstreams are always redacted).
        on_ready: Called with the base URL once the recorder is ready: the upstreams connected,
            the endpoints running and the socket accepting.
        allowed_hosts: More names clients reach the recorder by (see :class:`HostCheck`).
        options: Keep-alive, header deadline and logging (default: :class:`HttpOptions`' defaults).

    Raises:
        UpstreamError: An upstream did not start.
        StoreError: The store cannot be opened or written.
    """
    async with recording(store, upstreams, redactor) as recorder:
        sock = listen(host, port)
        url = base_url(sock)
        app = http_app(recorder, host=host, allowed_hosts=allowed_hosts)
        started = None if on_ready is None else (lambda: on_ready(url))
        with sock:
            await uvicorn_server(app, options or HttpOptions(), on_started=started).serve(sockets=[sock])
