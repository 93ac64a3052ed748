"""replay-sim's additions to MCP on the wire: how a client names an episode, and provenance.

Both sides of the product speak them — the recorder groups a modern-era client's requests by
episode, the replay server keeps history per episode and stamps every answer's provenance — so
they live here, not in either.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EPISODE_HEADER", "EPISODE_META_KEY", "MATCH_META_KEY", "episode_id"]

MATCH_META_KEY = "replay-sim/match"
"""``_meta`` key of the provenance on every replayed result (DESIGN.md "Provenance")."""
EPISODE_HEADER = "x-replay-episode"
"""HTTP header naming the episode a request belongs to (several MCP sessions may share one)."""
EPISODE_META_KEY = "replay-sim/episode"
"""``_meta`` key naming the episode, for clients that cannot set headers (stdio, 2026-era)."""


def episode_id(meta: Any, headers: Any) -> str | None:
    """The client-chosen episode id of a request, if it sent one.

    Args:
        meta: The request's ``_meta`` object (a mapping), or None.
        headers: The HTTP request headers (case-insensitive mapping), or None on stdio.

    Returns:
        ``_meta["replay-sim/episode"]`` when present, else the ``X-Replay-Episode`` header, else None.
    """
    if isinstance(meta, dict) and meta.get(EPISODE_META_KEY) not in (None, ""):
        return str(meta[EPISODE_META_KEY])
    if headers is not None:
        value = headers.get(EPISODE_HEADER)
        if value:
            return str(value)
    return None
