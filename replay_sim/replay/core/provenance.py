"""What the client is told: a resolution rendered as the reply, with its provenance.

Every replayed reply carries ``_meta["replay-sim/match"]`` (DESIGN.md "Provenance"): the status
(the tier, or ``synthetic``), the score, the recording and the snapshot; the near misses of a miss
or a ``nearest`` answer, and the arguments in which a canonical or semantic hit's recording differs.
A miss is rendered the way its method fails on a real server, with a message saying what came closest.
An injected fault or delay says so (``"fault"``, ``"latency_ms"``). :func:`match_of` reads the record
back as a typed :class:`Match`.

How much a miss tells is :class:`MissDetail` (``serve --miss-detail``): a policy in training can
learn from the nearest recordings' arguments, so ``reason`` leaves them out and ``none`` says only
that no recording matches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from replay_sim.protocol import MATCH_META_KEY
from replay_sim.replay.options import MissDetail
from replay_sim.replay.shaping.faults import FaultKind
from replay_sim.resolve.resolution import Candidate, FieldDiff, Resolution, Tier
from replay_sim.store import Origin

__all__ = [
    "FAULT_STATUS",
    "Match",
    "Reply",
    "candidate_json",
    "differences_json",
    "fault_provenance",
    "fault_reply",
    "match_of",
    "miss_message",
    "provenance",
    "render",
    "status_of",
]

Reply = dict[str, Any] | MCPError
"""What a request gets: a result's wire JSON, or a JSON-RPC error."""

RESOURCE_NOT_FOUND = -32002  # the spec's code for resources/read of an unknown URI
FAULT_STATUS = "fault"
"""The provenance status of a call failed on purpose (``serve --faults``); ``"fault"`` says how."""


@dataclass(frozen=True, slots=True)
class Match:
    """How a replayed result was answered: its ``_meta["replay-sim/match"]`` record, typed.

    Attributes:
        status: ``exact``, ``canonical``, ``semantic``, ``nearest``, ``live``, ``sandbox``,
            ``synthetic``, ``miss`` or ``fault`` (an injected fault).
        score: The match score (1.0 exact, 0.0 for a miss or a fault).
        recording: The recording id that answered, or None.
        snapshot: The snapshot id served, or None.
        differences: The arguments in which a canonical or semantic hit's recording differs
            (``{"field", "recorded", "requested"}`` each).
        candidates: A miss's (or ``nearest`` answer's) near misses (``{"recording", "score",
            "differences"}`` each).
        fault: The injected fault's kind (``timeout``, ``error``, ``is_error``, ``disconnect``), or None.
        latency_ms: The delay injected before the answer (``serve --latency``), or None.
        confidence: The learned probability that the real server answers the same (a miss: its
            best candidate's), or None when no recording comes close.
    """

    status: str
    score: float
    recording: int | None = None
    snapshot: str | None = None
    differences: tuple[dict[str, Any], ...] = ()
    candidates: tuple[dict[str, Any], ...] = ()
    fault: str | None = None
    latency_ms: float | None = None
    confidence: float | None = None

    @property
    def hit(self) -> bool:
        """Whether a recording answered (exact, canonical, semantic, nearest, live or synthetic)."""
        return self.recording is not None and self.status not in ("miss", FAULT_STATUS)


def match_of(result: Any) -> Match | None:
    """The replay-sim provenance of a result, typed; None when it carries none.

    Args:
        result: A ``CallToolResult`` (or any SDK result model with ``meta``), its wire JSON (a dict
            with ``_meta``), a JSON-RPC error's ``data`` or an ``MCPError`` (an injected fault's),
            or the ``_meta["replay-sim/match"]`` record itself.
    """
    error = getattr(result, "error", None)
    if error is not None and hasattr(error, "data"):  # an MCPError
        result = error.data
    if isinstance(result, Mapping):
        record = result.get(MATCH_META_KEY)
        if record is None and isinstance(result.get("_meta"), Mapping):
            record = result["_meta"].get(MATCH_META_KEY)
        if record is None and "status" in result and "score" in result:
            record = result
    else:
        meta = getattr(result, "meta", None)
        record = meta.get(MATCH_META_KEY) if isinstance(meta, Mapping) else None
    if not isinstance(record, Mapping):
        return None
    latency = record.get("latency_ms")
    return Match(
        status=str(record.get("status")),
        score=float(record.get("score") or 0.0),
        recording=record.get("recording"),
        snapshot=record.get("snapshot"),
        differences=tuple(record.get("differences") or ()),
        candidates=tuple(record.get("candidates") or ()),
        fault=record.get("fault"),
        latency_ms=None if latency is None else float(latency),
        confidence=None if record.get("confidence") is None else float(record["confidence"]),
    )


def fault_provenance(kind: str, snapshot: str | None) -> dict[str, Any]:
    """The ``_meta["replay-sim/match"]`` record of a call failed on purpose."""
    return {"status": FAULT_STATUS, "score": 0.0, "recording": None, "snapshot": snapshot, "fault": kind}


def fault_reply(
    server: str, name: str, fault: FaultKind, hold: float, snapshot: str | None
) -> tuple[Reply, str]:
    """The reply of a tool call failed on purpose (``serve --faults``), and the sentence saying so.

    Args:
        server: The recorded server called.
        name: The tool called.
        fault: The fault drawn for the call.
        hold: Seconds a ``timeout`` fault holds the call (said in its message).
        snapshot: The snapshot id cited in the provenance, if one is served.
    """
    match = {MATCH_META_KEY: fault_provenance(fault, snapshot)}
    said = f"replay-sim: injected fault ({fault}) on tool {name!r} of {server!r} (serve --faults)"
    reply: Reply
    if fault == FaultKind.IS_ERROR:
        reply = {"content": [{"type": "text", "text": said}], "isError": True, "_meta": match}
    elif fault == FaultKind.TIMEOUT:
        said = f"{said}: no answer within {hold:g} s"
        reply = MCPError(types.REQUEST_TIMEOUT, said, match)
    elif fault == FaultKind.DISCONNECT:
        said = f"{said}: connection dropped"
        reply = MCPError(types.CONNECTION_CLOSED, said, match)
    else:
        said = f"{said}: internal error"
        reply = MCPError(types.INTERNAL_ERROR, said, match)
    return reply, said


def status_of(resolution: Resolution) -> str:
    """The provenance status: the tier, except that a synthetic recording is never passed off as exact."""
    if resolution.recording is not None and resolution.recording.origin == Origin.SYNTHETIC:
        return Tier.SYNTHETIC.value
    return resolution.tier.value


def candidate_json(candidate: Candidate, detail: MissDetail = MissDetail.FULL) -> dict[str, Any]:
    """A near miss as JSON: recording id, score and the arguments that differ (``reason``: their names)."""
    differences = (
        differences_json(candidate.differences)
        if detail == MissDetail.FULL and not candidate.private
        else [{"field": d.name} for d in candidate.differences]
    )
    score = round(float(candidate.score), 6)
    return {"recording": candidate.recording_id, "score": score, "differences": differences}


def differences_json(differences: list[FieldDiff]) -> list[dict[str, Any]]:
    """Arguments that differ between a recording and a call, as JSON."""
    return [{"field": d.name, "recorded": d.recorded, "requested": d.requested} for d in differences]


def miss_message(
    server: str, method: str, name: str, resolution: Resolution, detail: MissDetail = MissDetail.FULL
) -> str:
    """The human-readable text of a miss: what was asked and (as ``detail`` allows) what came closest."""
    what = {"tools/call": "tool", "prompts/get": "prompt", "resources/read": "resource"}.get(
        method, "reference"
    )
    lines = [f"replay-sim: no recording answers this {method} of {what} {name!r} on {server!r}."]
    if detail == MissDetail.NONE:
        return lines[0]
    if resolution.reason:
        lines.append(f"Reason: {resolution.reason}.")
    if not resolution.candidates and resolution.sandbox is None:  # (a sandbox's miss says what to do)
        lines.append("No recording of this call comes close; record it, or serve with --miss live.")
    for c in resolution.candidates:
        diffs = "; ".join(
            f"{d.name}: recorded {d.recorded!r}, requested {d.requested!r}"
            if detail == MissDetail.FULL and not c.private  # another episode's arguments: never shown
            else f"{d.name} differs"
            for d in c.differences
        )
        lines.append(
            f"Nearest: recording #{c.recording_id} (score {c.score:.3f}){': ' + diffs if diffs else ''}"
        )
    return "\n".join(lines)


def provenance(
    resolution: Resolution, snapshot: str | None, detail: MissDetail = MissDetail.FULL
) -> dict[str, Any]:
    """The ``_meta["replay-sim/match"]`` record of a resolution.

    Args:
        resolution: How the call was resolved.
        snapshot: The id of the snapshot served, if one is.
        detail: How much its candidates tell (``none``: none are listed).
    """
    match: dict[str, Any] = {
        "status": status_of(resolution),
        "score": round(float(resolution.score), 6),
        "recording": resolution.recording.id if resolution.recording else None,
        "snapshot": snapshot,
    }
    if not resolution.hit or resolution.tier == Tier.NEAREST:
        shown = () if detail == MissDetail.NONE else resolution.candidates
        match["candidates"] = [candidate_json(c, detail) for c in shown]
    if resolution.differences:  # what a canonical or semantic hit's recording was asked otherwise
        match["differences"] = differences_json(resolution.differences)
    if resolution.sandbox is not None:  # which instance answered, how fast, after how much re-play
        match["sandbox"] = resolution.sandbox
    if resolution.confidence is not None:  # a miss: its best candidate's; and what drove it
        match["confidence"] = resolution.confidence
        match["drivers"] = [{"feature": f, "log_odds": w} for f, w in resolution.drivers]
    return match


def render(
    server: str,
    method: str,
    name: str,
    resolution: Resolution,
    snapshot: str | None,
    detail: MissDetail = MissDetail.FULL,
) -> Reply:
    """The reply for a resolution: the recorded JSON plus provenance, the recorded error, or the miss.

    Args:
        server: Recorded server name.
        method: The MCP method called.
        name: The tool, prompt or resource the call asked for.
        resolution: How the call was resolved.
        snapshot: The id of the snapshot served, if one is.
        detail: How much a miss tells (:class:`MissDetail`).
    """
    match = provenance(resolution, snapshot, detail)
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
    message = miss_message(server, method, name, resolution, detail)
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
