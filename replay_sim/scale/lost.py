"""The answers a client gets when its episode or MCP session cannot be served where it must be.

A replica holds its episodes' histories in memory; when it dies they die with it. Answering a later
call of such an episode from another replica's empty history would be a silent lie, so the client
gets an HTTP error whose JSON-RPC error names the lost episode or session, the replica that held
it, and what to do (restart the rollout). The MCP SDK client surfaces it as an ``MCPError``.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Message

from replay_sim import untrusted
from replay_sim.protocol import LOST_CODE
from replay_sim.scale.affinity import MAX_PEEK_BYTES, Affinity

__all__ = ["CONFLICT_CODE", "LOST_CODE", "conflict", "error_messages", "lost", "unavailable"]

CONFLICT_CODE = -32011
"""JSON-RPC error code of an episode held on another replica than the request's MCP session."""
UNAVAILABLE_CODE = -32012
"""JSON-RPC error code of a request no replica could take (none running)."""


def lost(affinity: Affinity, replica: str | None, body: bytes) -> list[Message]:
    """410 Gone: the replica holding this request's episode or session is gone, and its history too."""
    held = f"replay replica {replica}" if replica else "a replay replica"
    if affinity.episode is not None:
        fix = "restart this rollout under a new episode id"
    else:
        fix = "start a new MCP session (initialize again) and restart this rollout"
    message = (
        f"{affinity.describe()} was held by {held}, which is gone: its history is lost and no "
        f"other replica may answer it; {fix}"
    )
    return error_messages(410, LOST_CODE, message, body, {"episode": affinity.episode, "replica": replica})


def conflict(affinity: Affinity, holder: str, replica: str, body: bytes) -> list[Message]:
    """409 Conflict: the episode lives on one replica, the request's MCP session on another."""
    message = (
        f"{affinity.describe()} is held by replay replica {holder}, but MCP session {affinity.session!r} "
        f"lives on replica {replica}: name the episode on the session's initialize request too "
        "(X-Replay-Episode header or the /episodes/<id>/mcp/<server> URL), so both start on one replica"
    )
    return error_messages(409, CONFLICT_CODE, message, body, {"episode": affinity.episode, "replica": holder})


def unavailable(reason: str, body: bytes) -> list[Message]:
    """503: no replica could take the request."""
    return error_messages(
        503, UNAVAILABLE_CODE, f"no replay replica could serve this request: {reason}", body
    )


def error_messages(
    status: int, code: int, message: str, body: bytes, data: dict[str, Any] | None = None
) -> list[Message]:
    """An HTTP error response carrying a JSON-RPC error for the request's id, as ASGI messages."""
    payload = json.dumps(
        {"jsonrpc": "2.0", "id": _request_id(body), "error": {"code": code, "message": message, "data": data}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    return [
        {"type": "http.response.start", "status": status, "headers": headers},
        {"type": "http.response.body", "body": payload, "more_body": False},
    ]


def _request_id(body: bytes) -> Any:
    """The JSON-RPC id of the request in ``body``, or None."""
    if not body or len(body) > MAX_PEEK_BYTES:
        return None
    try:
        message = untrusted.loads(body)
    except ValueError:
        return None
    return message.get("id") if isinstance(message, dict) else None
