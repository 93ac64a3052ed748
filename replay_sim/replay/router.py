"""The replay app's front door: ``/mcp/<server>`` straight to that server's MCP session manager.

The MCP endpoints are the hot path, so they skip the admin app's routing table and middleware;
every other request (admin API, dashboard, docs, metrics) and the lifespan go to the admin app.
Every request passes the Host/Origin check (:class:`~replay_sim.listener.HostGuard`) and the body
read timeout first; MCP requests then :class:`~replay_sim.replay.admission.Admission`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

from replay_sim.listener import HostCheck, HostGuard
from replay_sim.replay.admission import Admission, BodyTimeout, Limits

__all__ = ["ReplayApp"]


class ReplayApp:
    """The ASGI entry point: ``/mcp/<server>`` goes straight to that server's session manager.

    Everything else (admin API, dashboard, docs, metrics, and the lifespan that starts the session
    managers) is the FastAPI app's, reachable as :attr:`admin`.

    Args:
        admin: The admin app (built by :func:`~replay_sim.replay.app.create_app`).
        managers: Each recorded server's streamable HTTP session manager, by server name.
        admission: What the MCP endpoints take on (default: :class:`Limits`' defaults).
        hosts: Which Host and Origin headers are answered (default: a loopback server's).
    """

    def __init__(
        self,
        admin: FastAPI,
        managers: dict[str, StreamableHTTPSessionManager],
        admission: Admission | None = None,
        hosts: HostCheck | None = None,
    ) -> None:
        self.admin = admin
        self.managers = managers
        self.admission = admission or Admission(Limits())
        timeout = self.admission.limits.body_timeout
        routed = self._route if timeout is None else BodyTimeout(self._route, timeout)
        self._guarded = HostGuard(routed, hosts or HostCheck())

    def load(self) -> dict[str, Any]:
        """MCP requests in flight and open sessions per server, for the admin API and ``/metrics``."""
        return {
            "in_flight": self.admission.in_flight,
            # The SDK keeps no public count of its sessions; its registry is the truth.
            "sessions": {name: len(m._server_instances) for name, m in sorted(self.managers.items())},
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._guarded(scope, receive, send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
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
        await self.admission(manager.handle_request, scope, receive, send)
