"""Forwarding single calls to the real servers of a recorder config (the replay's ``live`` miss policy).

The replay side never imports this module: the CLI builds a :class:`Forwarder` and injects it into
the replay as its ``forward`` callable and the connections to hold open while serving.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from mcp.shared.exceptions import MCPError

from replay_sim.errors import UpstreamError
from replay_sim.record.config import RecorderConfig
from replay_sim.record.upstream import Upstream

__all__ = ["Forwarder"]

_KEPT_NOTIFICATIONS = ("notifications/progress", "notifications/message")


class Forwarder:
    """Sends calls to the real servers of a recorder config and returns their answers as recorded.

    Connections open on first use and live in this object's task group: use it as an async context
    manager around serving. Calls to one upstream are sent one at a time, so the notifications that
    arrive while a call is in flight belong to that call (stdio log messages carry no request id).
    Params, answers and notifications are redacted with the config's rules before they are returned.

    Args:
        config: The recorder config (upstreams by recorded server name, redaction rules).
    """

    def __init__(self, config: RecorderConfig) -> None:
        self.config = config
        self._upstreams: dict[str, tuple[Upstream, anyio.Lock, list[dict[str, Any]]]] = {}
        self._open_lock = anyio.Lock()
        self._stack = AsyncExitStack()
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Forwarder:
        self._tg = await self._stack.enter_async_context(anyio.create_task_group())
        return self

    async def __aexit__(self, *exc: object) -> None:
        for upstream, _, _ in self._upstreams.values():
            await upstream.close()
        self._upstreams.clear()
        await self._stack.aclose()

    async def _open(self, server: str) -> tuple[Upstream, anyio.Lock, list[dict[str, Any]]]:
        async with self._open_lock:
            found = self._upstreams.get(server)
            if found is not None and found[0].alive:
                return found
            spec = self.config.servers.get(server)
            if spec is None:
                known = ", ".join(sorted(self.config.servers)) or "none"
                raise UpstreamError(
                    f"live: no upstream for server {server!r} in the recorder config ({known})"
                )
            if self._tg is None:
                raise RuntimeError("enter the Forwarder (async with) before forwarding")
            notes: list[dict[str, Any]] = []

            async def collect(method: str, params: dict[str, Any]) -> None:
                if method in _KEPT_NOTIFICATIONS:
                    kept = {k: v for k, v in params.items() if k != "progressToken"}
                    notes.append({"method": method, "params": kept})

            upstream = Upstream(spec, on_notification=collect)
            await self._tg.start(upstream.run)
            found = self._upstreams[server] = (upstream, anyio.Lock(), notes)
            return found

    async def __call__(self, server: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Forward one call to the real server ``server``.

        Returns:
            ``{"params", "result", "error", "notifications", "latency_ms"}``, wire JSON, redacted.

        Raises:
            UpstreamError: No upstream of that name, or it could not be reached or broke mid-call.
        """
        upstream, lock, notes = await self._open(server)
        redactor = self.config.redactor.with_secrets(upstream.spec.secrets())
        async with lock:
            notes.clear()
            request_id = upstream.next_request_id()
            out = {**params, "_meta": {"progressToken": request_id}}
            try:
                answer = await upstream.exchange(method, out, request_id=request_id)
            except MCPError as exc:  # timed out
                raise UpstreamError(f"live: {exc.error.message}") from exc
            if answer.error is not None and answer.error["code"] == types.CONNECTION_CLOSED:
                raise UpstreamError(f"live: {answer.error['message']}")
            return {
                "params": redactor.redact(params),
                "result": redactor.redact(answer.result),
                "error": redactor.redact(answer.error),
                "notifications": redactor.redact(list(notes)),
                "latency_ms": round(answer.latency_ms, 3),
            }
