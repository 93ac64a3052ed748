"""The admin API's episodes: create one, read what it was answered, end it.

- ``POST /api/episodes`` (optional JSON body ``{"id", "seed", "metadata"}``) creates an episode and
  answers its id, seed and URL per recorded server (``201``); a live id is ``409``, a malformed one
  ``400``, and past the cap of live episodes, the server's creation rate or the client's share of
  it ``503`` (:mod:`~replay_sim.replay.http.fairness`).
- ``GET /api/episodes`` lists the live episodes (most recently used first);
  ``GET /api/episodes/<id>`` says what one was answered: calls by tier, misses, faults, whether it
  diverged from every recording, its seed.
- ``DELETE /api/episodes/<id>`` ends one and frees its state (its last summary is the answer).

An unknown (or expired) episode is ``404``. Mounted by :func:`~replay_sim.replay.http.api.admin_api`,
behind its token when it has one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.params import Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from replay_sim.errors import EpisodeError
from replay_sim.protocol import EPISODE_ID_GRAMMAR, episode_path
from replay_sim.replay.core.episodes import Episode
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.http.fairness import ClientBuckets, client_of

__all__ = ["NewEpisode", "episodes_api"]


class NewEpisode(BaseModel):
    """The optional body of ``POST /api/episodes``."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, description=f"The episode id (default: a new one): {EPISODE_ID_GRAMMAR}.")
    seed: int | None = Field(
        None, ge=-(2**63) + 1, le=2**63 - 1, description="Draws its faults (default: from its id)."
    )
    metadata: Any = Field(None, description="JSON kept with the episode (at most 16 KiB).")


def episodes_api(
    replay: Replay, dependencies: Sequence[Depends] = (), clients: ClientBuckets | None = None
) -> APIRouter:
    """The episode endpoints over one replay.

    Args:
        replay: The replay whose episodes these are.
        dependencies: What every endpoint depends on (the admin token check).
        clients: Each client's share of the creation rate (None: only the server's bound).
    """
    api = APIRouter(tags=["episodes"], dependencies=list(dependencies))

    def described(request: Request, episode: Episode) -> dict[str, Any]:
        base = str(request.base_url).rstrip("/")
        urls = {name: base + episode_path(episode.id, name) for name in replay.names()}
        return {**replay.episodes.summary(episode), "urls": urls}

    def found(episode: str, live: Episode | None) -> Episode:
        if live is None:
            idle = replay.episodes.idle_timeout
            raise HTTPException(
                404,
                f"no live episode {episode!r}: never created, ended"
                + (f", or expired after {idle:g} s idle" if idle is not None else "")
                + " (create one with POST /api/episodes)",
            )
        return live

    @api.post("/api/episodes", status_code=201)
    def create(request: Request, body: NewEpisode | None = None) -> dict[str, Any]:
        """Create an episode; answers its id, seed and its URL on every recorded server."""
        body = body or NewEpisode.model_validate({})
        client = client_of(request.scope)
        try:
            if clients is not None:
                clients.check(client, body.id or "(new)")
            episode = replay.episodes.create(body.id, body.seed, body.metadata)
        except EpisodeError as exc:
            if exc.status == 503:
                raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from exc
            raise HTTPException(exc.status, str(exc)) from exc
        if clients is not None:
            clients.spend(client)
        return described(request, episode)

    @api.get("/api/episodes")
    def live(request: Request, limit: int = Query(100, ge=1, le=10_000)) -> JSONResponse:
        """The live episodes, most recently used first (``limit`` of them), and how many there are."""
        episodes = replay.episodes.live()
        shown = [described(request, e) for e in reversed(episodes[-limit:])]
        return JSONResponse(shown, headers={"X-Total-Count": str(len(episodes))})

    @api.get("/api/episodes/{episode}")
    def read(request: Request, episode: str) -> dict[str, Any]:
        """What an episode was answered: calls by tier, misses, faults, divergence, seed, URLs."""
        return described(request, found(episode, replay.episodes.get(episode)))

    @api.delete("/api/episodes/{episode}")
    def end(request: Request, episode: str) -> dict[str, Any]:
        """End an episode and free its state; answers its last summary."""
        ended = found(episode, replay.episodes.end(episode))
        return {**described(request, ended), "ended": True}

    return api
