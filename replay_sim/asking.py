"""Asking the client something in the middle of its call: a server→client request (sampling,
elicitation, roots) sent on the stream of the client's own request.

The recorder forwards a real server's questions to its client this way, and the replay server asks
a recorded question again (:mod:`replay_sim.replay.core.conversation`).
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

__all__ = ["ask_client"]


class _AsSent(BaseModel):
    """Any JSON object, kept exactly as the client sent it."""

    model_config = ConfigDict(extra="allow")


_SERVER_REQUEST: TypeAdapter[Any] = TypeAdapter(types.ServerRequest)


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
