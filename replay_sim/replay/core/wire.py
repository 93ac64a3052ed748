"""Replayed answers on the wire: the recorded JSON itself, not the SDK's re-dump of it.

The SDK shapes every handler result through its per-era models, which reorders keys and drops
fields the models do not know. A replay must hand the client exactly what the real server said,
so handlers pass the recorded JSON through a context variable to :class:`PassThrough`, a server
middleware that answers with it (plus whatever the SDK's envelope adds). :class:`Initialize`
answers ``initialize`` with the recorded server identity.
"""

from __future__ import annotations

import contextvars
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

from replay_sim.replay.core.surface import Surface

__all__ = ["Initialize", "PassThrough", "hand_over", "overlay", "stand_in"]

# The handler's unshaped answer, so the middleware can hand the client the recorded JSON itself
# rather than the SDK's re-dump (which reorders keys and drops fields its models do not know).
_raw_result: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "replay_raw", default=None
)


def overlay(raw: dict[str, Any], shaped: dict[str, Any]) -> dict[str, Any]:
    """The recorded result, plus what the SDK's envelope added (``resultType``, ``_meta`` stamps)."""
    out = dict(raw)
    for key, value in shaped.items():
        if key == "_meta" and isinstance(value, dict):
            out["_meta"] = {**value, **(raw.get("_meta") or {})}
        elif key not in out:
            out[key] = value
    return out


# What the SDK is given to shape instead of the recorded result: the smallest valid result of each
# method. Shaping the recorded result itself would cost a model validation per call, and could
# fail on a result the real server sent but the SDK's models reject.
_STAND_INS: dict[str, dict[str, Any]] = {
    "tools/call": {"content": []},
    "resources/read": {"contents": []},
    "prompts/get": {"messages": []},
    "completion/complete": {"completion": {"values": []}},
    "tools/list": {"tools": []},
    "resources/list": {"resources": []},
    "resources/templates/list": {"resourceTemplates": []},
    "prompts/list": {"prompts": []},
}


class PassThrough:
    """Server middleware: serve the handler's raw result, with what the SDK's envelope adds."""

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        holder: list[dict[str, Any]] = []
        token = _raw_result.set(holder)
        try:
            shaped = await call_next(ctx)
        finally:
            _raw_result.reset(token)
        if holder and isinstance(shaped, dict):
            return overlay(holder[0], shaped)
        return shaped


def hand_over(ctx: ServerRequestContext[Any, Any], result: dict[str, Any]) -> dict[str, Any]:
    """Hand the recorded result to :class:`PassThrough`; give the SDK a stand-in to shape.

    Returns:
        What the handler returns to the SDK (the recorded result itself outside a
        :class:`PassThrough` chain, e.g. in an in-process test of a bare handler).
    """
    holder = _raw_result.get()
    if holder is None:
        return result
    holder[:] = [result]
    return stand_in(ctx.method, ctx.protocol_version)


def stand_in(method: str, version: str) -> dict[str, Any]:
    """What the SDK is given to shape instead of a replayed result of ``method`` at ``version``."""
    shaped = dict(_STAND_INS.get(method, {}))
    if version in MODERN_PROTOCOL_VERSIONS:
        shaped["resultType"] = "complete"
    return shaped


class Initialize:
    """Server middleware answering ``initialize`` with the recorded identity and capabilities."""

    def __init__(self, surface: Surface) -> None:
        self.surface = surface

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method != "initialize":
            return await call_next(ctx)
        requested = (ctx.params or {}).get("protocolVersion")
        version = requested if requested in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION
        record = self.surface.record
        result: dict[str, Any] = {
            "protocolVersion": version,
            "capabilities": record.capabilities,
            "serverInfo": record.info,
        }
        if record.instructions:
            result["instructions"] = record.instructions
        return result
