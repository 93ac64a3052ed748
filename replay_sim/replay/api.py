"""The admin API of the replay server: health, readiness, stats, misses, recordings, episodes, metrics.

Mounted under ``/api`` (and ``/metrics``) by :func:`~replay_sim.replay.app.create_app`; its OpenAPI
description is served at ``/docs``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse, PlainTextResponse

from replay_sim.replay.replay import Replay
from replay_sim.store import Recording

__all__ = ["admin_api", "recording_json", "tool_effects"]


def recording_json(rec: Recording, full: bool = False) -> dict[str, Any]:
    """A recording for the admin API: a summary, or (``full``) with its result, error and notifications.

    ``outcome`` is ``ok`` or how the recorded call failed (see :attr:`Recording.failure`).
    """
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


def tool_effects(replay: Replay) -> dict[str, dict[str, Any]]:
    """Each served server's tools with their effect (none / changes / unknown) and its evidence."""
    return {
        name: {tool: v.as_dict() for tool, v in replay.resolver.lookup.effects(name).items()}
        for name in replay.names()
    }


def admin_api(replay: Replay, is_ready: Callable[[], bool]) -> APIRouter:
    """The admin endpoints over one replay.

    Args:
        replay: The replay servers, their store, histories and metrics.
        is_ready: Whether every MCP endpoint runs and the index and model are loaded.

    Returns:
        A router for the admin app.
    """
    api = APIRouter(tags=["admin"])

    @api.get("/api/health")
    def health() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @api.get("/api/ready")
    def ready() -> JSONResponse:
        """Readiness: every MCP endpoint runs and the index and model are loaded (503 until then)."""
        ok = is_ready()
        body = {
            "ready": ok,
            "servers": replay.names(),
            "problems": replay.problems(),
            "miss_policy": replay.miss_policy_name,
            "snapshot": replay.snapshot,
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    @api.get("/api/servers")
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

    @api.get("/api/stats")
    def stats() -> dict[str, Any]:
        """Replayed calls per server, tool and tier (counts, latency percentiles) and a timeline."""
        return {
            "uptime_s": round(time.time() - replay.metrics.started, 3),
            "miss_policy": replay.miss_policy_name,
            "snapshot": replay.snapshot,
            "calls": replay.metrics.stats(),
            "timeline": replay.metrics.timeline(),
            "effects": tool_effects(replay),
        }

    @api.get("/api/misses")
    def misses(limit: int = Query(50, ge=1, le=1000), server: str | None = None) -> list[dict[str, Any]]:
        """Recent calls no recording answered with certainty, newest first, with their near misses."""
        return replay.metrics.recent_misses(limit, server)

    @api.get("/api/recordings")
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

    @api.get("/api/recordings/{recording_id}")
    def recording(recording_id: int) -> dict[str, Any]:
        """One recording in full: params, result or error, notifications."""
        found = replay.store.recording(recording_id)
        if found is None:
            raise HTTPException(404, f"no recording #{recording_id} in {replay.store.path}")
        return recording_json(found, full=True)

    @api.get("/api/episodes")
    def episodes() -> list[dict[str, Any]]:
        """Named episodes (``X-Replay-Episode``) and how many calls each has been served."""
        return replay.histories.named()

    @api.delete("/api/episodes/{episode}")
    def reset_episode(episode: str) -> dict[str, Any]:
        """Forget an episode's history, so its next calls replay from the start."""
        return {"episode": episode, "reset": replay.histories.reset(episode)}

    @api.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        """Prometheus metrics (text exposition format 0.0.4)."""
        return PlainTextResponse(replay.metrics.prometheus(), media_type="text/plain; version=0.0.4")

    return api
