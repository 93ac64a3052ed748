"""The MCP vocabulary both sides of the product share, and what they say on the wire besides plain MCP.

The methods replay-sim records and replays, the listing methods and the item field of each;
replay-sim's additions — how a client names an episode, and provenance — and asking the client
something in the middle of its call (a server→client request: sampling, elicitation, roots). The
recorder groups a modern-era client's requests by episode and forwards a real server's
server→client requests; the replay server keeps history per episode, stamps every answer's
provenance and asks the client the recorded server→client requests again. So they live here.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

__all__ = [
    "CALL_METHODS",
    "EPISODE_HEADER",
    "EPISODE_META_KEY",
    "FORWARDED_CAPABILITIES",
    "INPUT_KEY",
    "LISTING_FIELDS",
    "LISTING_METHODS",
    "MATCH_META_KEY",
    "ask_client",
    "declared",
    "episode_id",
    "error_json",
    "is_client_request",
]

CALL_METHODS = frozenset({"tools/call", "resources/read", "prompts/get", "completion/complete"})
"""Requests recorded and replayed as calls; everything else is a listing or only forwarded."""
LISTING_FIELDS = {
    "tools/list": "tools",
    "resources/list": "resources",
    "resources/templates/list": "resourceTemplates",
    "prompts/list": "prompts",
}
"""The listing methods, each with the item field of its result."""
LISTING_METHODS = tuple(LISTING_FIELDS)
"""The listing methods a server advertises (recorded once per server, served as recorded)."""
INPUT_KEY = "0"
"""The key of the one question a 2026-era ``input_required`` result carries."""

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


FORWARDED_CAPABILITIES = ("sampling", "elicitation", "roots")
"""Client capabilities a server asks about with server→client requests, as the wire names them."""


def declared(ctx: ServerRequestContext[Any, Any]) -> dict[str, Any]:
    """What this request's client declared it can be asked (sampling, elicitation, roots), as wire JSON.

    A server asks a client only what it declared, and answers differently otherwise.
    """
    capabilities = ctx.session.client_capabilities
    if capabilities is None:
        return {}
    wire = capabilities.model_dump(by_alias=True, mode="json", exclude_none=True)
    return {k: v for k, v in wire.items() if k in FORWARDED_CAPABILITIES}


def error_json(exc: MCPError) -> dict[str, Any]:
    """A JSON-RPC error as it is recorded: ``code``, ``message`` and ``data``."""
    return {"code": exc.error.code, "message": exc.error.message, "data": exc.error.data}


class _AsSent(BaseModel):
    """Any JSON object, kept exactly as the client sent it."""

    model_config = ConfigDict(extra="allow")


_SERVER_REQUEST: TypeAdapter[Any] = TypeAdapter(types.ServerRequest)


def is_client_request(message: dict[str, Any]) -> bool:
    """Whether a recorded message of a call is a server→client request (it holds the client's answer).

    A call's recorded messages are what the server sent while it ran, in order: notifications
    (``method``, ``params``) and server→client requests, which also hold ``result`` or ``error``.
    """
    return "result" in message or "error" in message


async def ask_client(
    ctx: ServerRequestContext[Any, Any], method: str, params: dict[str, Any]
) -> dict[str, Any]:
    """Send a server→client request on the stream of the client's request ``ctx``.

    Returns:
        The client's result, wire JSON as it sent it.

    Raises:
        MCPError: The client answered with an error, cannot be asked (no back channel), or the
            request or its answer is not valid MCP.
    """
    try:
        request = _SERVER_REQUEST.validate_python(
            {"method": method, **({"params": params} if params else {})}
        )
        answer = await ctx.session.send_request(
            request, _AsSent, metadata=ServerMessageMetadata(related_request_id=ctx.request_id)
        )
    except ValidationError as exc:
        raise MCPError(
            code=types.INVALID_PARAMS, message=f"{method}: not valid MCP: {exc.errors()[:1]}"
        ) from exc
    return answer.model_dump(by_alias=True, mode="json")
