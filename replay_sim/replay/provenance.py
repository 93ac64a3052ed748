"""What the client is told: a resolution rendered as the reply, with its provenance.

Every replayed reply carries ``_meta["replay-sim/match"]`` (DESIGN.md "Provenance"): the status
(the tier, or ``synthetic``), the score, the recording and the snapshot; the near misses of a miss
or a ``nearest`` answer, and the arguments in which a canonical or semantic hit's recording differs.
A miss is rendered the way its method fails on a real server, with a message saying what came closest.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from replay_sim.protocol import MATCH_META_KEY
from replay_sim.resolve.resolution import Candidate, FieldDiff, Resolution, Tier
from replay_sim.store import Origin

__all__ = [
    "Reply",
    "candidate_json",
    "differences_json",
    "miss_message",
    "provenance",
    "render",
    "status_of",
]

Reply = dict[str, Any] | MCPError
"""What a request gets: a result's wire JSON, or a JSON-RPC error."""

RESOURCE_NOT_FOUND = -32002  # the spec's code for resources/read of an unknown URI


def status_of(resolution: Resolution) -> str:
    """The provenance status: the tier, except that a synthetic recording is never passed off as exact."""
    if resolution.recording is not None and resolution.recording.origin == Origin.SYNTHETIC:
        return Tier.SYNTHETIC.value
    return resolution.tier.value


def candidate_json(candidate: Candidate) -> dict[str, Any]:
    """A near miss as JSON: recording id, score and the arguments that differ."""
    return {
        "recording": candidate.recording_id,
        "score": round(float(candidate.score), 6),
        "differences": differences_json(candidate.differences),
    }


def differences_json(differences: list[FieldDiff]) -> list[dict[str, Any]]:
    """Arguments that differ between a recording and a call, as JSON."""
    return [{"field": d.name, "recorded": d.recorded, "requested": d.requested} for d in differences]


def miss_message(server: str, method: str, name: str, resolution: Resolution) -> str:
    """The human-readable text of a miss: what was asked and which recordings came closest."""
    what = {"tools/call": "tool", "prompts/get": "prompt", "resources/read": "resource"}.get(
        method, "reference"
    )
    lines = [f"replay-sim: no recording answers this {method} of {what} {name!r} on {server!r}."]
    if resolution.reason:
        lines.append(f"Reason: {resolution.reason}.")
    if not resolution.candidates:
        lines.append("No recording of this call comes close; record it, or serve with --miss live.")
    for c in resolution.candidates:
        diffs = "; ".join(
            f"{d.name}: recorded {d.recorded!r}, requested {d.requested!r}" for d in c.differences
        )
        lines.append(
            f"Nearest: recording #{c.recording_id} (score {c.score:.3f}){': ' + diffs if diffs else ''}"
        )
    return "\n".join(lines)


def provenance(resolution: Resolution, snapshot: str | None) -> dict[str, Any]:
    """The ``_meta["replay-sim/match"]`` record of a resolution.

    Args:
        resolution: How the call was resolved.
        snapshot: The id of the snapshot served, if one is.
    """
    match: dict[str, Any] = {
        "status": status_of(resolution),
        "score": round(float(resolution.score), 6),
        "recording": resolution.recording.id if resolution.recording else None,
        "snapshot": snapshot,
    }
    if not resolution.hit or resolution.tier == Tier.NEAREST:
        match["candidates"] = [candidate_json(c) for c in resolution.candidates]
    if resolution.differences:  # what a canonical or semantic hit's recording was asked otherwise
        match["differences"] = differences_json(resolution.differences)
    return match


def render(server: str, method: str, name: str, resolution: Resolution, snapshot: str | None) -> Reply:
    """The reply for a resolution: the recorded JSON plus provenance, the recorded error, or the miss.

    Args:
        server: Recorded server name.
        method: The MCP method called.
        name: The tool, prompt or resource the call asked for.
        resolution: How the call was resolved.
        snapshot: The id of the snapshot served, if one is.
    """
    match = provenance(resolution, snapshot)
    recording = resolution.recording
    if recording is not None and recording.error is not None:
        error = recording.error
        return MCPError(
            int(error.get("code", types.INTERNAL_ERROR)), str(error.get("message", "")), error.get("data")
        )
    if recording is not None and recording.result is not None:
        result = dict(recording.result)
        result["_meta"] = {**(result.get("_meta") or {}), MATCH_META_KEY: match}
        return result
    message = miss_message(server, method, name, resolution)
    if method == "tools/call":
        return {
            "content": [{"type": "text", "text": message}],
            "isError": True,
            "_meta": {MATCH_META_KEY: match},
        }
    if method == "completion/complete":
        return {"completion": {"values": [], "hasMore": False}, "_meta": {MATCH_META_KEY: match}}
    code = RESOURCE_NOT_FOUND if method == "resources/read" else types.INVALID_PARAMS
    return MCPError(code, message, {MATCH_META_KEY: match})
