"""The admin API of the replay server: health, readiness, stats, misses, coverage, calibration, recordings,
episodes, metrics.

Mounted under ``/api`` (and ``/metrics``) by :func:`~replay_sim.replay.http.app.create_app`; its OpenAPI
description is served at ``/docs``. With a token, everything but health and readiness needs
``Authorization: Bearer <token>``. Answers that can be large are rendered in the worker thread
and bounded (a few kilobytes of arguments per miss or recording summary, 1 MiB of misses), so
an admin read never holds up the MCP endpoints' event loop.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from replay_sim.errors import ConfigError
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.http.confidence_view import calibration
from replay_sim.replay.http.coverage import coverage
from replay_sim.replay.http.episodes_api import episodes_api
from replay_sim.replay.http.fairness import ClientBuckets
from replay_sim.replay.observe.metrics import sandbox_prometheus, truncated
from replay_sim.replay.observe.readiness import Readiness
from replay_sim.store import Recording

__all__ = ["admin_api", "admin_token", "recording_json", "tool_effects"]

SQLITE_MAX_ID = 2**63 - 1
"""The largest id SQLite can hold: larger ones are refused (422) rather than failing in SQLite."""
MISSES_MAX_BYTES = 1 << 20
"""The most ``/api/misses`` answers with at once."""
_BEARER = HTTPBearer(
    auto_error=False, description="The admin token (replay-sim serve --token or REPLAY_SIM_TOKEN)."
)
_Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]


def recording_json(rec: Recording, full: bool = False) -> dict[str, Any]:
    """A recording for the admin API: a summary, or (``full``) with its result, error and notifications.

    ``outcome`` is ``ok`` or how the recorded call failed (see :attr:`Recording.failure`).
    """
    out: dict[str, Any] = {
        "id": rec.id,
        "server": rec.server,
        "method": rec.method,
        "name": rec.name,
        "arguments": rec.arguments if full else truncated(rec.arguments),
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


def _json(value: Any) -> Response:
    return Response(json.dumps(value, ensure_ascii=False).encode(), media_type="application/json")


def tool_effects(replay: Replay) -> dict[str, dict[str, Any]]:
    """Each served server's tools with their effect (none / changes / unknown) and its evidence."""
    return {
        name: {tool: v.as_dict() for tool, v in replay.resolver.lookup.effects(name).items()}
        for name in replay.names()
    }


def admin_token(token: str | None) -> str | None:
    """The admin API's bearer token as given, refused when blank.

    ``--token "$UNSET"`` gives an empty token, which every request would match (it sends none):
    the admin API would be open while ``serve`` says a token is required.

    Raises:
        ConfigError: The token is empty or only whitespace.
    """
    if token is not None and not token.strip():
        raise ConfigError(
            "the admin token is empty (--token '' or REPLAY_SIM_TOKEN='', an unset variable?): "
            "give a non-empty token, or none to have one generated beyond loopback"
        )
    return token


def admin_api(
    replay: Replay,
    readiness: Readiness,
    *,
    token: str | None = None,
    load: Callable[[], dict[str, Any]] | None = None,
    clients: ClientBuckets | None = None,
) -> APIRouter:
    """The admin endpoints over one replay.

    Args:
        replay: The replay servers, their store, histories and metrics.
        readiness: Whether every MCP endpoint runs and the index is loaded, and why not.
        token: When set, every endpoint but health and readiness needs ``Authorization: Bearer <token>``.
        load: MCP requests in flight and open sessions per server (``ReplayApp.load``).
        clients: Each client's share of the episode creation rate (None: no per-client bound).

    Returns:
        A router for the admin app.
    """
    api = APIRouter(tags=["admin"])

    def authorised(credentials: _Credentials) -> None:
        if token is None:
            return
        given = b"" if credentials is None else credentials.credentials.encode()
        if not hmac.compare_digest(given, token.encode()):
            raise HTTPException(
                401,
                "the admin API needs 'Authorization: Bearer <token>' (replay-sim serve --token or "
                "REPLAY_SIM_TOKEN; the dashboard takes it as /#token=<token>)",
                headers={"WWW-Authenticate": "Bearer"},
            )

    guarded = APIRouter(tags=["admin"], dependencies=[Depends(authorised)] if token is not None else [])

    @api.get("/api/health")
    def health() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @api.get("/api/ready")
    def ready() -> JSONResponse:
        """Readiness: every MCP endpoint runs and the index is loaded (503 until then).

        ``waiting_for`` says what is still loading (or failed to load, and is being tried again);
        ``embedding_model`` whether the model semantic matches need is loaded yet (the first call
        that embeds a query loads it), ``tools_prepared`` for how many tools the matching state
        of the canonical and semantic tiers is built (each tool's first call needing it builds it);
        ``sandboxes_confined`` whether sandbox instances run contained (None: no sandboxes; False:
        ``--unconfined-sandboxes``).
        """
        ok = readiness.ready
        confined = getattr(replay.policy, "confined", None)  # the sandbox policy's (a cheap look)
        body = {
            "ready": ok,
            "waiting_for": readiness.problems(),
            "embedding_model": readiness.model(),
            "tools_prepared": readiness.tools(),
            "servers": replay.names(),
            "problems": replay.problems(),
            "miss_policy": replay.miss_policy_name,
            "snapshot": replay.snapshot,
            "sandboxes_confined": confined()
            if callable(confined := getattr(replay.policy, "confined", None))
            else None,
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    @guarded.get("/api/servers")
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

    @guarded.get("/api/stats")
    def stats() -> dict[str, Any]:
        """Replayed calls per server, tool and tier (counts, latency percentiles), a timeline, the load."""
        return {
            "uptime_s": round(time.time() - replay.metrics.started, 3),
            "miss_policy": replay.miss_policy_name,
            "snapshot": replay.snapshot,
            "calls": replay.metrics.stats(),
            "timeline": replay.metrics.timeline(),
            "effects": tool_effects(replay),
            "load": None if load is None else load(),
            "sandbox": replay.sandbox_stats(),
        }

    @guarded.get("/api/misses", response_model=list[dict[str, Any]])
    def misses(limit: int = Query(50, ge=1, le=1000), server: str | None = None) -> Response:
        """Recent calls no recording answered with certainty, newest first, with their near misses.

        Each miss keeps a few kilobytes of its arguments (longer values cut, marked with their
        size); the answer holds the newest misses that fit in 1 MiB.
        """
        return Response(
            replay.metrics.misses_json(limit, server, MISSES_MAX_BYTES), media_type="application/json"
        )

    @guarded.get("/api/coverage")
    def coverage_view(limit: int = Query(20, ge=1, le=200)) -> Response:
        """Per tool: recorded calls, replayed calls by tier and hit rate, kept misses; and the most
        missed calls (kept across restarts) with their nearest recordings and whether
        ``replay-sim backfill`` can take them."""
        return _json(coverage(replay, limit))

    @guarded.get("/api/calibration")
    def calibration_view() -> dict[str, Any]:
        """The served confidence model: its source, operating points, weights and reliability diagram
        (its leave-one-out examples cross-validated by server, with the expected calibration error)."""
        return calibration(replay)

    @guarded.get("/api/recordings", response_model=list[dict[str, Any]])
    def recordings(
        server: str | None = None,
        method: str | None = None,
        name: str | None = None,
        session: str | None = None,
        after_id: int = Query(0, ge=0, le=SQLITE_MAX_ID),
        limit: int = Query(100, ge=1, le=1000),
    ) -> Response:
        """Browse recordings by server, method, tool name and session; page with ``after_id``.

        Summaries: long argument values are cut (marked with their size); open one for all of it.
        """
        found = replay.store.recordings(
            server, method=method, name=name, session=session, after_id=after_id, limit=limit
        )
        return _json([recording_json(r) for r in found])

    @guarded.get("/api/recordings/{recording_id}")
    def recording(recording_id: int = Path(ge=0, le=SQLITE_MAX_ID)) -> dict[str, Any]:
        """One recording in full: params, result or error, notifications."""
        found = replay.store.recording(recording_id)
        if found is None:
            raise HTTPException(404, f"no recording #{recording_id} in {replay.store.path}")
        return recording_json(found, full=True)

    api.include_router(episodes_api(replay, dependencies=guarded.dependencies, clients=clients))

    @guarded.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        """Prometheus metrics (text exposition format 0.0.4)."""
        text = replay.metrics.prometheus() + ("" if load is None else _load_metrics(load()))
        sandboxes = replay.sandbox_stats()
        if sandboxes is not None:
            text += sandbox_prometheus(sandboxes)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    api.include_router(guarded)
    return api


def _load_metrics(load: dict[str, Any]) -> str:
    lines = [
        "# HELP replay_sim_requests_in_flight MCP requests being handled.",
        "# TYPE replay_sim_requests_in_flight gauge",
        f"replay_sim_requests_in_flight {load['in_flight']}",
        "# HELP replay_sim_requests_reading_body MCP requests whose body is still arriving (no slot held).",
        "# TYPE replay_sim_requests_reading_body gauge",
        f"replay_sim_requests_reading_body {load.get('reading', 0)}",
        "# HELP replay_sim_sessions_waiting Requests that would open a session, waiting for a slot.",
        "# TYPE replay_sim_sessions_waiting gauge",
        f"replay_sim_sessions_waiting {load['waiting']}",
        "# HELP replay_sim_open_sessions Open MCP sessions, by server.",
        "# TYPE replay_sim_open_sessions gauge",
    ]
    for name, n in load["sessions"].items():
        label = name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        lines.append(f'replay_sim_open_sessions{{server="{label}"}} {n}')
    if "episodes" in load:
        lines += [
            "# HELP replay_sim_live_episodes Live named episodes.",
            "# TYPE replay_sim_live_episodes gauge",
            f"replay_sim_live_episodes {load['episodes']}",
            "# HELP replay_sim_episodes_expired_total Episodes expired after --episode-idle-timeout.",
            "# TYPE replay_sim_episodes_expired_total counter",
            f"replay_sim_episodes_expired_total {load['episodes_expired']}",
            "# HELP replay_sim_episodes_refused_total New episodes refused at --max-episodes or the rate.",
            "# TYPE replay_sim_episodes_refused_total counter",
            f"replay_sim_episodes_refused_total {load['episodes_refused']}",
            "# HELP replay_sim_episodes_refused_per_client_total New episodes refused at a client's share.",
            "# TYPE replay_sim_episodes_refused_per_client_total counter",
            f"replay_sim_episodes_refused_per_client_total {load.get('episodes_refused_per_client', 0)}",
        ]
    return "\n".join(lines) + "\n"
