"""The replay app: MCP endpoints, the admin API and the dashboard in one ASGI app.

``/mcp/<server>`` is each recorded server's streamable HTTP endpoint (:mod:`~replay_sim.replay.router`);
``/api/...`` the admin API and ``/metrics`` Prometheus (:mod:`~replay_sim.replay.api`; OpenAPI at
``/docs``); ``/`` the dashboard (static files, no build step).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import AsyncIterator
from pathlib import Path

import anyio.to_thread
from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from replay_sim.listener import transport_security
from replay_sim.replay.api import admin_api
from replay_sim.replay.replay import Replay
from replay_sim.replay.router import ReplayApp

__all__ = ["create_app"]

STATIC = Path(__file__).parent / "static"


def create_app(replay: Replay, *, host: str = "127.0.0.1", freeze_gc: bool = False) -> ReplayApp:
    """Assemble the replay app: an MCP endpoint per recorded server, the admin API, the dashboard.

    Args:
        replay: The replay servers and their metrics.
        host: The interface the app will be bound to (decides DNS-rebinding protection).
        freeze_gc: Once warm, move every object alive to the collector's permanent generation
            (``gc.freeze``): a process-wide effect, for a process that exists to serve the replay.

    Returns:
        The ASGI app; its admin (FastAPI) lifespan runs every server's MCP session manager.
    """
    security = transport_security(host)
    managers = {
        name: StreamableHTTPSessionManager(app=replay.server(name), security_settings=security)
        for name in replay.names()
    }
    ready = False

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        nonlocal ready
        async with contextlib.AsyncExitStack() as stack:
            await replay.enter(stack)
            for manager in managers.values():
                await stack.enter_async_context(manager.run())
            await anyio.to_thread.run_sync(replay.resolver.warm)  # index and model: before "ready"
            if freeze_gc:
                # The model, index and caches live as long as the server: keep the garbage
                # collector from rescanning them on every full collection (costly under load).
                gc.freeze()
            ready = True
            try:
                yield
            finally:
                ready = False

    app = FastAPI(
        title="replay-sim",
        summary="Replays recorded MCP servers; admin API of the replay server.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.include_router(admin_api(replay, is_ready=lambda: ready))

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return ReplayApp(app, managers)
