"""The replay app: MCP endpoints, the admin API and the dashboard in one ASGI app.

``/mcp/<server>`` is each recorded server's streamable HTTP endpoint; ``/api/...`` the admin API
(health, readiness, stats, misses, recordings, episodes; OpenAPI at ``/docs``); ``/metrics``
Prometheus; ``/`` the dashboard (static files, no build step).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

from replay_sim.errors import ConfigError
from replay_sim.listener import base_url, listen, transport_security
from replay_sim.record.config import load_config
from replay_sim.redaction import RULES_META_KEY, Redactor
from replay_sim.replay.miss import MissPolicyName, MissSettings, Upstreams
from replay_sim.replay.replay import Replay
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Recording, Store
from replay_sim.store.snapshot import open_snapshot

__all__ = ["ReplayApp", "create_app", "open_replay", "recording_json", "serve"]

STATIC = Path(__file__).parent / "static"


def recording_json(rec: Recording, full: bool = False) -> dict[str, Any]:
    """A recording for the admin API: a summary, or (``full``) with its result, error and notifications."""
    out: dict[str, Any] = {
        "id": rec.id,
        "server": rec.server,
        "method": rec.method,
        "name": rec.name,
        "arguments": rec.arguments,
        "session": rec.session,
        "seq": rec.seq,
        "origin": rec.origin,
        "recorded_at": rec.recorded_at,
        "latency_ms": rec.latency_ms,
        "outcome": rec.failure or "ok",
    }
    if full:
        out |= {"key": rec.key, "params": rec.params, "result": rec.result, "error": rec.error}
        out["notifications"] = rec.notifications
    return out


class ReplayApp:
    """The ASGI entry point: ``/mcp/<server>`` goes straight to that server's session manager.

    The MCP endpoints are the hot path, so they skip the admin app's routing table and middleware;
    everything else (admin API, dashboard, docs, metrics, and the lifespan that starts the session
    managers) is the FastAPI app's, reachable as :attr:`admin`.
    """

    def __init__(self, admin: FastAPI, managers: dict[str, StreamableHTTPSessionManager]) -> None:
        self.admin = admin
        self.managers = managers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/mcp/"):
            await self.admin(scope, receive, send)
            return
        name = path[len("/mcp/") :].rstrip("/")
        manager = self.managers.get(name)
        if manager is None:
            known = ", ".join(sorted(self.managers)) or "none"
            response = JSONResponse(
                {"error": f"no recorded server {name!r}; serving: {known}"}, status_code=404
            )
            await response(scope, receive, send)
            return
        await manager.handle_request(scope, receive, send)


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
    state: dict[str, Any] = {"ready": False}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            await replay.enter(stack)
            for manager in managers.values():
                await stack.enter_async_context(manager.run())
            await anyio.to_thread.run_sync(replay.resolver.warm)  # index and model: before "ready"
            if freeze_gc:
                # The model, index and caches live as long as the server: keep the garbage
                # collector from rescanning them on every full collection (costly under load).
                gc.freeze()
            state["ready"] = True
            try:
                yield
            finally:
                state["ready"] = False

    app = FastAPI(
        title="replay-sim",
        summary="Replays recorded MCP servers; admin API of the replay server.",
        version="0.1.0",
        lifespan=lifespan,
    )

    @app.get("/api/health", tags=["admin"])
    def health() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/api/ready", tags=["admin"])
    def ready() -> JSONResponse:
        """Readiness: every MCP endpoint runs and the index and model are loaded (503 until then)."""
        body = {
            "ready": state["ready"],
            "servers": replay.names(),
            "problems": replay.problems(),
            "miss_policy": replay.miss_policy_name,
            "snapshot": replay.snapshot,
        }
        return JSONResponse(body, status_code=200 if state["ready"] else 503)

    @app.get("/api/servers", tags=["admin"])
    def servers() -> list[dict[str, Any]]:
        """The recorded servers served here, with their endpoints and listing sizes."""
        return [
            {
                "name": name,
                "endpoint": f"/mcp/{name}",
                "info": s.record.info,
                "protocol_version": s.record.protocol_version,
                "tools": sorted(s.tools),
                "prompts": sorted(s.prompts),
            }
            for name, s in sorted(replay.surfaces.items())
        ]

    @app.get("/api/stats", tags=["admin"])
    def stats() -> dict[str, Any]:
        """Replayed calls per server, tool and tier (counts, latency percentiles) and a timeline."""
        return {
            "uptime_s": round(time.time() - replay.metrics.started, 3),
            "miss_policy": replay.miss_policy_name,
            "snapshot": replay.snapshot,
            "calls": replay.metrics.stats(),
            "timeline": replay.metrics.timeline(),
        }

    @app.get("/api/misses", tags=["admin"])
    def misses(limit: int = Query(50, ge=1, le=1000), server: str | None = None) -> list[dict[str, Any]]:
        """Recent calls no recording answered with certainty, newest first, with their near misses."""
        return replay.metrics.recent_misses(limit, server)

    @app.get("/api/recordings", tags=["admin"])
    def recordings(
        server: str | None = None,
        method: str | None = None,
        name: str | None = None,
        session: str | None = None,
        after_id: int = Query(0, ge=0),
        limit: int = Query(100, ge=1, le=1000),
    ) -> list[dict[str, Any]]:
        """Browse recordings by server, method, tool name and session; page with ``after_id``."""
        found = replay.store.recordings(
            server, method=method, name=name, session=session, after_id=after_id, limit=limit
        )
        return [recording_json(r) for r in found]

    @app.get("/api/recordings/{recording_id}", tags=["admin"])
    def recording(recording_id: int) -> dict[str, Any]:
        """One recording in full: params, result or error, notifications."""
        found = replay.store.recording(recording_id)
        if found is None:
            raise HTTPException(404, f"no recording #{recording_id} in {replay.store.path}")
        return recording_json(found, full=True)

    @app.get("/api/episodes", tags=["admin"])
    def episodes() -> list[dict[str, Any]]:
        """Named episodes (``X-Replay-Episode``) and how many calls each has been served."""
        return replay.histories.named()

    @app.delete("/api/episodes/{episode}", tags=["admin"])
    def reset_episode(episode: str) -> dict[str, Any]:
        """Forget an episode's history, so its next calls replay from the start."""
        return {"episode": episode, "reset": replay.histories.reset(episode)}

    @app.get("/metrics", tags=["admin"], response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        """Prometheus metrics (text exposition format 0.0.4)."""
        return PlainTextResponse(replay.metrics.prometheus(), media_type="text/plain; version=0.0.4")

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return ReplayApp(app, managers)


def open_replay(
    db: str | Path | None = None,
    *,
    snapshot: str | Path | None = None,
    miss: str = MissPolicyName.ERROR,
    config: str | Path | None = None,
    llm_url: str | None = None,
    llm_model: str | None = None,
    llm_api_key: str | None = None,
    index_dir: str | Path | None = None,
    match_config: MatchConfig | None = None,
) -> Replay:
    """Open a store (or a verified snapshot) and build the replay servers over it.

    Args:
        db: The recording store (ignored with ``snapshot``).
        snapshot: A snapshot bundle; verified first, served read-only, its id cited in provenance.
        miss: Miss policy name.
        config: Recorder config naming the real servers (miss policy ``live``) and the redaction
            rules the recordings were made with (applied to incoming calls too).
        llm_url: OpenAI-compatible endpoint (miss policy ``synthesize``).
        llm_model: Model name for ``llm_url``.
        llm_api_key: Bearer token for ``llm_url``, if it needs one.
        index_dir: Where the vector index lives (default: the resolver's; a snapshot's own).
        match_config: Thresholds and per-tool overrides (a snapshot brings the one it was frozen with).

    Returns:
        The replay, ready for :func:`create_app` or :meth:`Replay.serve_stdio`.

    Raises:
        ConfigError: Inconsistent options (a writing miss policy on a read-only snapshot …).
        SnapshotError: The snapshot is missing or tampered with.
        StoreError: The store cannot be opened.
    """
    policy = MissPolicyName(miss)
    snapshot_id: str | None = None
    resolver_options: dict[str, Any] = {}
    if snapshot is not None:
        if policy in (MissPolicyName.LIVE, MissPolicyName.SYNTHESIZE):
            raise ConfigError(f"--miss {policy} records new answers, but snapshot {snapshot} is read-only")
        opened = open_snapshot(snapshot)
        if match_config is not None and match_config != opened.match_config:
            raise ConfigError(
                f"snapshot {snapshot} is served with the matching config it was frozen with; "
                "drop --match-config or freeze a new snapshot with it"
            )
        store_path, snapshot_id, match_config = opened.store_path, opened.id, opened.match_config
        store = Store(store_path, readonly=True)
        resolver_options["index_dir"] = Path(index_dir) if index_dir else opened.index_dir
    else:
        store = Store(db) if db is not None else Store()
        if index_dir is not None:
            resolver_options["index_dir"] = Path(index_dir)
    forward = None
    recorder_config = None if config is None else load_config(config)
    if policy == MissPolicyName.LIVE:
        if recorder_config is None:
            raise ConfigError("--miss live needs --config FILE, the recorder config naming the real servers")
        forward = Upstreams(recorder_config)
    settings = MissSettings(
        store=store, forward=forward, llm_url=llm_url, llm_model=llm_model, llm_api_key=llm_api_key
    )
    resolver = Resolver(store, config=match_config, **resolver_options)
    redactor = Redactor.from_rules(store.meta(RULES_META_KEY))  # the rules the recordings were made with
    if recorder_config is not None:  # and the secret values, which only the config knows
        secrets = [secret for spec in recorder_config.servers.values() for secret in spec.secrets()]
        redactor = redactor.merged(recorder_config.redactor.with_secrets(secrets))
    return Replay(
        store, resolver=resolver, miss=policy, settings=settings, snapshot=snapshot_id, redactor=redactor
    )


def serve(
    replay: Replay,
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    log_level: str = "info",
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the replay app with uvicorn until interrupted.

    Args:
        replay: The replay servers.
        host: Interface to bind.
        port: TCP port (0 picks a free one).
        log_level: uvicorn's log level.
        on_ready: Called with the base URL (the real port) once the socket listens.

    Raises:
        ConfigError: The address cannot be bound.
    """
    import uvicorn

    sock = listen(host, port)
    if on_ready is not None:
        on_ready(base_url(sock))
    with sock:
        app = create_app(replay, host=host, freeze_gc=True)
        uvicorn.Server(uvicorn.Config(app, log_level=log_level)).run(sockets=[sock])
