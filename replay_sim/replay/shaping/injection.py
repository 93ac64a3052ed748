"""Injecting latency and faults into a replay's answers (what :mod:`.faults` configures).

:class:`Injector` draws each tool call's fault (the core renders it the way the fault fails on the
wire, :func:`~replay_sim.replay.core.provenance.fault_reply`), and holds an answer as long as asked
— the injected latency, or a timeout fault's hold — stamping ``"latency_ms"`` into its provenance,
or has a dropped call's connection closed by the router (:class:`~.faults.Hangup`). Waiting goes
through an injected ``sleep``, so tests run on a fake clock. It imports nothing of the core: the
core uses it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from replay_sim.protocol import MATCH_META_KEY
from replay_sim.replay.observe.metrics import Metrics
from replay_sim.replay.shaping.faults import FaultKind, Faults, Hangup, Latency

__all__ = ["Injector", "Positioned"]

_HANGUP_WAIT = 5.0  # seconds a dropped call waits for the router to close its connection


class Positioned(Protocol):
    """Where a call stands in its episode (or MCP session): the calls made so far, per server."""

    calls: dict[str, int]


class Injector:
    """Latency and faults for one replay.

    Args:
        latency: How long answers are held.
        faults: Which tool calls fail, and how.
        basis: The snapshot id (or the store's identity) faults are drawn from.
        snapshot: The snapshot id cited in provenance, if one is served.
        metrics: Where injected faults and delays are counted.
        sleep: How to wait (default ``anyio.sleep``).
    """

    def __init__(
        self,
        latency: Latency,
        faults: Faults,
        *,
        basis: str,
        snapshot: str | None,
        metrics: Metrics,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self.latency = latency
        self.faults = faults
        self.basis = basis
        self.snapshot = snapshot
        self.metrics = metrics
        self.sleep = sleep or anyio.sleep

    def draw(
        self, history: Positioned | None, server: str, method: str, params: dict[str, Any]
    ) -> FaultKind | None:
        """The fault of this call (:meth:`Faults.draw`; tool calls only), or None.

        Its index is the number of calls its episode (or MCP session) made on ``server`` before;
        a call with neither is call 0 of seed 0.
        """
        if method != "tools/call" or not self.faults:
            return None
        seed: int = getattr(history, "seed", 0)  # a named episode's; a connection has none
        index = 0 if history is None else history.calls.get(server, 0)
        return self.faults.draw(self.basis, seed, server, str(params.get("name", "")), index)

    async def deliver(
        self,
        ctx: ServerRequestContext[Any, Any],
        reply: dict[str, Any] | MCPError,
        fault: FaultKind | None,
        recorded_ms: float | None,
    ) -> None:
        """Hold ``reply`` as long as asked, or have its connection dropped (a ``disconnect`` fault).

        Args:
            ctx: The client's request (its ASGI scope carries the router's :class:`Hangup`).
            reply: What the call is answered; its provenance gets ``latency_ms``.
            fault: The fault injected, if any.
            recorded_ms: The answering recording's latency (None: no recording answered).
        """
        if fault == FaultKind.DISCONNECT:
            request = ctx.request
            hangup = getattr(request, "scope", {}).get(Hangup.KEY) if request is not None else None
            if isinstance(hangup, Hangup):  # the router closes the connection: this reply goes nowhere
                hangup.asked.set()
                with anyio.move_on_after(_HANGUP_WAIT):
                    await hangup.done.wait()
            return  # elsewhere (stdio, in-process) the client gets the connection-closed error
        if fault == FaultKind.TIMEOUT:
            delay = self.faults.hold
        elif fault is None:
            delay = self.latency.seconds(recorded_ms)
        else:
            delay = 0.0
        if delay <= 0:
            return
        holder = (reply.error.data if isinstance(reply, MCPError) else reply.get("_meta")) or {}
        match = holder.get(MATCH_META_KEY) if isinstance(holder, dict) else None
        if isinstance(match, dict):
            match["latency_ms"] = round(delay * 1000, 3)
        self.metrics.delayed(delay)
        await self.sleep(delay)
