"""What an upstream sends of its own accord during a recorded session, routed to the calls in flight.

A server's notifications and its requests to the client (sampling, elicitation, roots) belong to
the call they arrive during: a :class:`Relay` adds them to that :class:`~replay_sim.record.inflight.Call`
(so they are recorded with it) and passes them on to the client — mid-call for a handshake-era
client, through the call's ``input_required`` :class:`~replay_sim.record.inflight.Round` for a
2026-era one. A :class:`~replay_sim.record.session.Session` hands its upstream these handlers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mcp_types as types
from mcp.server.connection import allowed_log_levels
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import LOG_LEVEL_META_KEY

from replay_sim.asking import ask_client
from replay_sim.protocol import error_json
from replay_sim.record.inflight import Call

__all__ = ["Relay"]


class Relay:
    """One session's upstream notifications and server→client requests, to the calls in flight.

    Args:
        inflight: The session's calls in flight, by upstream request id (the session's own dict).
        outbound: The connection's standalone channel, if it has one: notifications that belong
            to no call go there.
    """

    def __init__(self, inflight: dict[str, Call], outbound: Any) -> None:
        self.inflight = inflight
        self.outbound = outbound

    async def on_notification(self, method: str, params: dict[str, Any]) -> None:
        """Record an upstream notification with its call and forward it downstream."""
        if method == "notifications/progress":
            call = self.inflight.get(str(params.get("progressToken")))
            if call is None:
                return
            call.notifications.append({"method": method, "params": _without(params, "progressToken")})
            if call.ctx is not None and call.reachable:  # a no-op unless the client asked for progress
                await call.ctx.session.report_progress(
                    params.get("progress", 0), params.get("total"), params.get("message")
                )
            return
        calls = list(self.inflight.values())
        if method == "notifications/message":
            # stdio carries no request id on log messages: they belong to whatever is in flight.
            for call in calls:
                call.notifications.append({"method": method, "params": params})
            if calls:
                clients = [c.ctx for c in calls if c.ctx is not None and c.reachable]
                if clients:
                    await self._log_to(clients[0], params)
                return
        if self.outbound is not None:
            await self.outbound.notify(method, params)

    async def on_request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Forward a server→client request to the client whose call is in flight; record the exchange.

        It is recorded among the call's notifications, in order, with the client's ``result`` (or
        ``error``): replay asks the client again and serves the call only if it answers the same.
        """
        calls = [c for c in self.inflight.values() if c.ctx is not None]
        if len(calls) != 1:
            which = "no client call is" if not calls else f"{len(calls)} client calls are"
            raise MCPError(
                code=types.INVALID_REQUEST,
                message=f"replay-sim cannot forward {method}: {which} in flight on this session",
            )
        call = calls[0]
        assert call.ctx is not None
        exchange: dict[str, Any] = {"method": method, "params": params}
        call.notifications.append(exchange)
        try:
            if call.round is not None:
                exchange["result"] = await call.round.ask(method, params)
            else:
                exchange["result"] = await ask_client(call.ctx, method, params)
        except MCPError as exc:
            exchange["error"] = error_json(exc)
            raise
        return exchange["result"]

    async def _log_to(self, ctx: ServerRequestContext[Any, Any], params: dict[str, Any]) -> None:
        """Pass a server's log message on to a client's request, if it takes logs of that level."""
        level = params.get("level")
        request_meta = (ctx.params or {}).get("_meta") or {}
        if level not in allowed_log_levels(
            ctx.protocol_version, {LOG_LEVEL_META_KEY: request_meta.get(LOG_LEVEL_META_KEY)}
        ):
            return  # a 2026 client that did not opt in to logs on this request gets none
        notification = types.LoggingMessageNotification(
            params=types.LoggingMessageNotificationParams.model_validate(params, by_name=False)
        )
        await ctx.session.send_notification(notification, related_request_id=ctx.request_id)


def _without(mapping: Mapping[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k != key}
