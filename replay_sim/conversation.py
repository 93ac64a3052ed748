"""Re-enacting what a server sent while a recorded call ran: notifications and questions to the client.

A recording keeps, in order, the messages the real server sent during the call: progress and log
notifications, and server→client requests (sampling, elicitation, roots) with the client's answer.
Replaying the call sends them again on the request's stream. A recorded answer holds only if the
client answers each question as it did when recorded — the real server's result depended on it —
so the first different answer ends the re-enactment and says how it differed.

A server asks a client only what the client declared it can answer, so one call may have been
recorded both with a question (for a client that could be asked) and without (for one that could
not); :func:`suited` picks the recording made for a client like the one replaying.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mcp_types as types
from mcp.server.connection import allowed_log_levels
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from replay_sim.canonical import answer_text
from replay_sim.protocol import ask_client, is_client_request
from replay_sim.store import Recording
from replay_sim.upstream import FORWARDED_CAPABILITIES

__all__ = ["declared", "reenact", "suited"]

_CAPABILITY = {
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
}

_SHOWN_CHARS = 160


def declared(ctx: ServerRequestContext[Any, Any]) -> frozenset[str]:
    """The client capabilities a server may ask about that this request's client declared."""
    capabilities = ctx.session.client_capabilities
    if capabilities is None:
        return frozenset()
    return frozenset(c for c in FORWARDED_CAPABILITIES if getattr(capabilities, c, None) is not None)


def asked(recording: Recording) -> frozenset[str]:
    """The client capabilities the server's recorded questions during the call needed."""
    return frozenset(
        _CAPABILITY.get(str(m.get("method")), str(m.get("method")))
        for m in recording.notifications
        if is_client_request(m)
    )


def suited(recordings: Sequence[Recording], client: frozenset[str]) -> Recording | None:
    """The first of a call's recordings (from one state) made for a client declaring ``client``.

    A recording that asked for a capability was made for a client that declared it; and where
    some recording of the call asked for it, the server asks every client that declares it, so
    one that did not ask was made for a client that did not. None when no recording fits.
    """
    ever = frozenset().union(*(asked(r) for r in recordings))
    wanted = client & ever
    return next((r for r in recordings if asked(r) == wanted), None)


async def reenact(ctx: ServerRequestContext[Any, Any], messages: list[dict[str, Any]]) -> str | None:
    """Send a recorded call's messages on this request's stream, in order.

    Returns:
        None when the client answered every recorded question as recorded; else why not.
    """
    raw_meta = (ctx.params or {}).get("_meta")
    levels = allowed_log_levels(ctx.protocol_version, raw_meta if isinstance(raw_meta, dict) else None)
    for message in messages:
        method, params = str(message.get("method")), message.get("params") or {}
        if is_client_request(message):
            recorded = answer_text(message.get("result"), message.get("error"))
            try:
                result, error = await ask_client(ctx, method, params), None
            except MCPError as exc:
                result, error = (
                    None,
                    {"code": exc.error.code, "message": exc.error.message, "data": exc.error.data},
                )
            given = answer_text(result, error)
            if given != recorded:
                return (
                    f"the client answered {method} otherwise than when the call was recorded "
                    f"(recorded {recorded[:_SHOWN_CHARS]}, now {given[:_SHOWN_CHARS]})"
                )
        elif method == "notifications/progress":
            # report_progress addresses the current request's progress token (a no-op without one).
            await ctx.session.report_progress(
                params.get("progress", 0), params.get("total"), params.get("message")
            )
        elif method == "notifications/message" and params.get("level") in levels:
            notification = types.LoggingMessageNotification(
                params=types.LoggingMessageNotificationParams.model_validate(params)
            )
            await ctx.session.send_notification(notification, related_request_id=ctx.request_id)
    return None
