"""The replay app's front door: ``/mcp/<server>`` straight to that server's MCP session manager.

The MCP endpoints are the hot path, so they skip the admin app's routing table and middleware;
every other request (admin API, dashboard, docs, metrics) and the lifespan go to the admin app.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

__all__ = ["ReplayApp"]


class ReplayApp:
    """The ASGI entry point: ``/mcp/<server>`` goes straight to that server's session manager.

    Everything else (admin API, dashboard, docs, metrics, and the lifespan that starts the session
    managers) is the FastAPI app's, reachable as :attr:`admin`.

    Args:
        admin: The admin app (built by :func:`~replay_sim.replay.app.create_app`).
        managers: Each recorded server's streamable HTTP session manager, by server name.
    """

    def __init__(self, admin: FastAPI, managers: dict[str, StreamableHTTPSessionManager]) -> None:
        self.admin = admin
        self.managers = managers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/mcp/"):
            await self.admin(scope, receive, send)
            return
        name = path[len("/mcp/") :].rstrip("/")
        manager = self.managers.get(name)
        if manager is None:
            known = ", ".join(sorted(self.managers)) or "none"
            response = JSONResponse(
                {"error": f"no recorded server {name!r}; serving: {known}"}, status_code=404
            )
            await response(scope, receive, send)
            return
        await manager.handle_request(scope, receive, send)
