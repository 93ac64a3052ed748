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

import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

from replay_sim.surface import Surface

__all__ = ["Initialize", "PassThrough", "hand_over"]

# The handler's unshaped answer, so the middleware can hand the client the recorded JSON itself
# rather than the SDK's re-dump (which reorders keys and drops fields its models do not know).
_raw_result: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "replay_raw", default=None
)


def _overlay(raw: dict[str, Any], shaped: dict[str, Any]) -> dict[str, Any]:
    """The recorded result, plus what the SDK's envelope added (``resultType``, ``_meta`` stamps)."""
    out = dict(raw)
    for key, value in shaped.items():
        if key == "_meta" and isinstance(value, dict):
            out["_meta"] = {**value, **(raw.get("_meta") or {})}
        elif key not in out:
            out[key] = value
    return out


class PassThrough:
    """Server middleware: serve the handler's raw result instead of the SDK's reshaped dump."""

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        holder: list[dict[str, Any]] = []
        token = _raw_result.set(holder)
        try:
            try:
                shaped = await call_next(ctx)
            except MCPError as exc:
                # The SDK rejects a recorded result its models cannot hold; the client gets it as recorded.
                if not holder or exc.code != types.INTERNAL_ERROR:
                    raise
                shaped = (
                    {"resultType": "complete"} if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS else {}
                )
        finally:
            _raw_result.reset(token)
        if holder and isinstance(shaped, dict):
            return _overlay(holder[0], shaped)
        return shaped


def hand_over(ctx: ServerRequestContext[Any, Any], result: dict[str, Any]) -> dict[str, Any]:
    """Hand the recorded result to :class:`PassThrough`; give the SDK what its per-era models need."""
    holder = _raw_result.get()
    if holder is not None:
        holder[:] = [result]
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and "resultType" not in result:
        return {"resultType": "complete", **result}
    return result


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
