"""The HTTP fast path's sandbox answers: asked of the episode's warm instance, written as one JSON body.

:class:`InstanceAnswers` asks a call :class:`~replay_sim.replay.core.sandboxcalls.SandboxCalls` took
and writes its answer as the SDK path would, with the call bounded and cancelled as the SDK path
bounds and cancels it:

- a 2026-era request is cancelled when its client closes the connection (the era's cancellation);
  a call still running when the SDK would start streaming (its ping interval) is handed over to the
  SDK path, which streams and pings while it runs;
- a handshake-era request is cancelled by the client's ``notifications/cancelled`` naming it, or
  when its MCP session ends (``DELETE``) — the router tells :meth:`InstanceAnswers.cancel` and
  :meth:`InstanceAnswers.ended` — and answered ``Request cancelled`` as the SDK answers;
- a cancelled call ends its instance, as the policy ends any call cut short
  (:mod:`~replay_sim.replay.policies.sandbox`);
- an answer only the SDK path can deliver is handed over with its outcome
  (:mod:`~replay_sim.replay.core.handover`): the call is never asked twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from functools import partial
from typing import Any

import anyio
from mcp.server._streamable_http_modern import _SSE_PING_INTERVAL
from mcp.server.streamable_http import REQUEST_CANCELLED
from mcp_types import ErrorData, JSONRPCError
from starlette.types import Receive, Scope, Send

from replay_sim.errors import EpisodeLost, StoreError
from replay_sim.replay.core.handover import HANDED_OVER, Handed
from replay_sim.replay.core.prepared import Style, envelope
from replay_sim.replay.core.sandboxcalls import SandboxCalls, Taken

__all__ = ["InstanceAnswers"]


class _Cancelled(Exception):
    """The call was cancelled (its request, or its session, ended)."""


class InstanceAnswers:
    """Sandbox answers on the HTTP fast path, and the handshake-era calls in flight (to cancel).

    Args:
        calls: What takes, asks and settles the calls.
    """

    def __init__(self, calls: SandboxCalls) -> None:
        self.calls = calls
        self._flying: dict[tuple[int, Hashable], anyio.CancelScope] = {}

    def cancel(self, transport: object, request_id: Any) -> None:
        """Cancel the call of a session's request (the client's ``notifications/cancelled``), if in flight."""
        if type(request_id) is int or type(request_id) is str:
            scope = self._flying.get((id(transport), request_id))
            if scope is not None:
                scope.cancel()

    def ended(self, transport: object) -> None:
        """Cancel every call in flight of a session that ended."""
        for (owner, _), scope in list(self._flying.items()):
            if owner == id(transport):
                scope.cancel()

    async def __call__(
        self,
        taken: Taken,
        request_id: int | str,
        version: str,
        style: Style,
        scope: Scope,
        send: Send,
        respond: Callable[[Send, bytes], Awaitable[None]],
        handover: Callable[[], Awaitable[None]],
        *,
        disconnect: Receive | None = None,
        transport: object = None,
    ) -> None:
        """Ask ``taken`` of its instance and write the answer (or hand it over, or say it was cancelled).

        Args:
            taken: The call.
            request_id: Its JSON-RPC id.
            version: The protocol version it is served at.
            style: The wire's serialiser.
            scope: The request's ASGI scope (where a handed-over call travels).
            send: Where the response goes.
            respond: Writes one JSON body.
            handover: Runs the SDK path on the request.
            disconnect: The request's own ``receive`` for a 2026-era request (its client closing
                the connection cancels the call); None for a handshake-era one.
            transport: A handshake-era request's session transport (whose end cancels the call).
        """
        handed = Handed()
        call = anyio.CancelScope()
        key = None if transport is None else (id(transport), request_id)
        if key is not None:
            self._flying[key] = call
        deliver = partial(
            self._deliver, taken, handed, request_id, version, style, scope, send, respond, handover
        )
        try:
            if disconnect is None:  # handshake era: asked right here, cancelled only through `call`
                await self._ask(taken, handed, call)
                await deliver()
                return
            async with anyio.create_task_group() as tg:
                # The call in a task; this one watches its client until the call ends (which stops the
                # watch) or the SDK would start streaming (then the SDK path streams and pings).
                watching = anyio.CancelScope()
                tg.start_soon(self._ask, taken, handed, call, watching)
                with watching, anyio.move_on_after(_SSE_PING_INTERVAL):
                    while (await disconnect())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()  # its client left: the call is cancelled, nothing answered
                    return
                await deliver()
                tg.cancel_scope.cancel()  # a call still running when the SDK path ended (its client left)
        finally:
            if key is not None:
                self._flying.pop(key, None)

    async def _deliver(
        self,
        taken: Taken,
        handed: Handed,
        request_id: int | str,
        version: str,
        style: Style,
        scope: Scope,
        send: Send,
        respond: Callable[[Send, bytes], Awaitable[None]],
        handover: Callable[[], Awaitable[None]],
    ) -> None:
        """Write the call's answer, or that it was cancelled; or hand it (or the call) to the SDK path."""
        if isinstance(handed.error, _Cancelled):
            await respond(send, _cancelled(request_id))
            return
        if handed.done.is_set() and handed.error is None:
            body = self.calls.settle(taken, handed.answer, version, style)
            if body is not None:
                self.calls.count("fast")
                await respond(send, envelope(request_id, body, style))
                return
        self.calls.count("handed")
        scope[HANDED_OVER] = handed  # an answer (or a call) only the SDK path delivers
        await handover()

    async def _ask(
        self, taken: Taken, handed: Handed, call: anyio.CancelScope, ended: anyio.CancelScope | None = None
    ) -> None:
        """Ask the call (cancelled through ``call``); cancel ``ended`` once it has an outcome."""
        try:
            with call:
                handed.settle(await self.calls.answer(taken))
        except (EpisodeLost, StoreError) as exc:  # the SDK path answers them as JSON-RPC errors
            handed.settle(error=exc)
        finally:
            if not handed.done.is_set():
                handed.settle(error=_Cancelled())
            if ended is not None:
                ended.cancel()


def _cancelled(request_id: int | str) -> bytes:
    """The SDK's handshake-era answer to a request cancelled while its session lives."""
    error = ErrorData(code=REQUEST_CANCELLED, message="Request cancelled")
    return (
        JSONRPCError(jsonrpc="2.0", id=request_id, error=error)
        .model_dump_json(by_alias=True, exclude_unset=True)
        .encode()
    )
