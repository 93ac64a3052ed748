"""The replay app: MCP endpoints, the admin API and the dashboard in one ASGI app.

``/mcp/<server>`` is each recorded server's streamable HTTP endpoint, and ``/episodes/<id>/mcp/<server>``
the same endpoint with its history scoped to one episode (:mod:`~replay_sim.replay.http.router`);
``/api/...`` the admin API and ``/metrics`` Prometheus (:mod:`~replay_sim.replay.http.api`; OpenAPI at
``/docs``); ``/`` the dashboard (static files, no build step).

Every request, MCP or admin, passes the same Host/Origin check (DNS-rebinding protection), on any
interface. Bound beyond loopback, the admin API needs a bearer token; the MCP endpoints do not
(rollout workers are configured by URL alone) — see the docs' "Security" (docs/security.md).
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from replay_sim.errors import ConfigError
from replay_sim.listener import HostCheck, is_loopback
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.core.sandboxcalls import SandboxCalls
from replay_sim.replay.http.admission import Admission
from replay_sim.replay.http.api import admin_api, admin_token
from replay_sim.replay.http.errors import json_errors
from replay_sim.replay.http.fairness import ClientBuckets
from replay_sim.replay.http.fastpath import FastPath
from replay_sim.replay.http.router import ReplayApp
from replay_sim.replay.observe.readiness import Readiness
from replay_sim.replay.options import Limits

__all__ = ["create_app"]

STATIC = Path(__file__).parent / "static"


def create_app(
    replay: Replay,
    *,
    host: str = "127.0.0.1",
    freeze_gc: bool = False,
    allowed_hosts: Iterable[str] = (),
    token: str | None = None,
    limits: Limits | None = None,
) -> ReplayApp:
    """Assemble the replay app: an MCP endpoint per recorded server, the admin API, the dashboard.

    Args:
        replay: The replay servers and their metrics.
        host: The interface the app will be bound to (decides which Host headers are accepted,
            and whether the admin API needs a token).
        freeze_gc: Once warm, move every object alive to the collector's permanent generation
            (``gc.freeze``): a process-wide effect, for a process that exists to serve the replay.
        allowed_hosts: More names clients reach the server by (``*``: any; see
            :class:`~replay_sim.listener.HostCheck`).
        token: The admin API's bearer token; required when ``host`` is not a loopback interface.
        limits: Sessions, episodes, concurrency and body read time (default: :class:`Limits`'
            defaults); the episode bounds are applied to ``replay``'s episodes.

    Returns:
        The ASGI app; its admin (FastAPI) lifespan runs every server's MCP session manager and
        starts the warm-up; its :attr:`~replay_sim.replay.http.router.ReplayApp.readiness` says when
        every tier answers at its usual speed (``GET /api/ready``).

    Raises:
        ConfigError: ``host`` is beyond loopback and there is no ``token``, or ``token`` is blank.
    """
    token = admin_token(token)
    if token is None and not is_loopback(host):
        raise ConfigError(
            f"the replay server bound to {host} (beyond loopback) needs an admin token: "
            "pass --token TOKEN or set REPLAY_SIM_TOKEN"
        )
    limits = limits or Limits()
    replay.episodes.max_live = limits.max_episodes
    replay.episodes.idle_timeout = limits.episode_idle_timeout
    replay.episodes.rate, replay.episodes.burst = limits.episode_rate, limits.episode_burst
    clients = ClientBuckets(limits.episode_rate, limits.episode_burst, limits.episode_client_share)
    hangups = replay.injector.faults.drops
    if hangups:  # a dropped connection is uvicorn's error otherwise: here it is on purpose
        logging.getLogger("uvicorn.error").addFilter(_quiet_hangups)
    # Host and Origin are checked in front of every request (ReplayApp), so the SDK's own check
    # (on loopback only) is left off.
    managers = {
        name: StreamableHTTPSessionManager(
            app=replay.server(name),
            session_idle_timeout=limits.session_idle_timeout,
            max_sessions=limits.max_sessions,
        )
        for name in replay.names()
    }
    replay.metrics.label_only(_recorded_names(replay))
    resolver = replay.resolver
    readiness = Readiness(resolver.warmup, lambda: resolver.model_loaded, lambda: resolver.prepared_tools)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            await replay.enter(stack)
            for manager in managers.values():
                await stack.enter_async_context(manager.run())
            # The index loads in the background: exact hits are answered at once.
            # Once loaded, they live as long as the server: keep the garbage collector from
            # rescanning them on every full collection (costly under load).
            replay.resolver.warm(wait=False, then=gc.freeze if freeze_gc else None)
            readiness.serving(True)
            try:
                yield
            finally:
                readiness.serving(False)
                replay.resolver.warmup.stop()  # a failed warm-up is not tried again on a closing store

    app = FastAPI(
        title="replay-sim",
        summary="Replays recorded MCP servers; admin API of the replay server.",
        version="0.1.0",
        lifespan=lifespan,
    )
    json_errors(app)  # every admin API error is JSON with its status, a corrupt row's included
    # Exact and canonical hits on established sessions skip the SDK (same bytes, prepared once), and
    # so do misses an episode's warm sandbox instance answers.
    calls = SandboxCalls(replay, replay.prepared) if hasattr(replay.policy, "warm") else None
    servers = {name: replay.server(name) for name in managers}
    fast = FastPath(replay.prepared, servers, replay.surfaces, calls)
    front = ReplayApp(
        app,
        managers,
        Admission(limits),
        HostCheck(host, allowed_hosts),
        replay.episodes,
        hangups,
        fast,
        readiness,
        clients,
        replay.session_ended,
    )
    app.include_router(admin_api(replay, readiness, token=token, load=front.load, clients=clients))

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return front


def _quiet_hangups(record: logging.LogRecord) -> bool:
    """Leave out uvicorn's complaint about a response left unfinished: disconnect faults do it on purpose."""
    return record.msg != "ASGI callable returned without completing response."


def _recorded_names(replay: Replay) -> set[tuple[str, str, str]]:
    """Every ``(server, method, name)`` recorded or listed: the names metrics label by themselves."""
    names = replay.store.names()  # the calls' index has them: no row is read (stats() reads them all)
    for server, surface in replay.surfaces.items():
        names |= {(server, "tools/call", tool) for tool in surface.tools}
        names |= {(server, "prompts/get", prompt) for prompt in surface.prompts}
        listed = (surface.listings.get("resources/list") or {}).get("resources") or []
        uris = {str(r["uri"]) for r in listed if isinstance(r, dict) and r.get("uri")}
        names |= {(server, "resources/read", uri) for uri in uris}
    return names
