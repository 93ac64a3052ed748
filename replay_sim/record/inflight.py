"""A recorded session's calls in flight: what each collects while its upstream answer is awaited.

A :class:`Call` gathers the notifications and server→client exchanges that belong to one
forwarded request. A 2026-era client cannot be asked anything mid-call, so when its call's server
asks a question, the call runs on as a :class:`Round`: each question ends the client's request
with an ``input_required`` result, and the client's retry brings the answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from replay_sim.protocol import INPUT_KEY

__all__ = ["Call", "Round"]

_ROUND_TIMEOUT_S = 600.0  # how long a 2026-era client has to retry with its answer


@dataclass
class Call:
    """A forwarded request waiting for its answer; collects the notifications that belong to it.

    ``ctx`` is the client's request, or None for a call the recorder makes itself (exploring):
    its notifications are recorded, never forwarded.
    """

    ctx: ServerRequestContext[Any, Any] | None
    notifications: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    latency_ms: float = 0.0
    answered_at: str | None = None  # when its answer came (a sandbox re-plays it at that less latency)
    round: Round | None = None  # a 2026-era client's call: its questions go out as input_required

    @property
    def reachable(self) -> bool:
        """Whether notifications can still go to the client's request (it has not ended)."""
        return not (self.round is not None and self.round.asked)


class Round:
    """A 2026-era client's call whose server asks it something: one ``input_required`` per question.

    Such a client cannot be asked mid-call. The upstream call goes on in the background; each
    question it asks ends the client's request with an ``input_required`` result, and the client's
    retry of the call (same ``requestState``) brings the answer the upstream is waiting for.
    """

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params  # the call's params: its retries must repeat them
        self.asked = False
        self.events, self._events = anyio.create_memory_object_stream[tuple[str, Any]](1)
        self.answers, self._answers = anyio.create_memory_object_stream[Any](1)

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Called for the upstream: put the question to the client, wait for its retry's answer."""
        self.asked = True  # the client's request has ended: later notifications cannot reach it
        await self.events.send(("question", {"method": method, **({"params": params} if params else {})}))
        try:
            with anyio.fail_after(_ROUND_TIMEOUT_S):
                responses = await self._answers.receive()
        except TimeoutError:
            message = f"the client did not retry with its answer to {method} within {_ROUND_TIMEOUT_S:g} s"
            raise MCPError(code=types.INTERNAL_ERROR, message=message) from None
        answer = responses.get(INPUT_KEY) if isinstance(responses, dict) else None
        if not isinstance(answer, dict):
            raise MCPError(code=types.INVALID_PARAMS, message=f"the client's retry did not answer {method}")
        return answer

    async def next(self) -> tuple[str, Any]:
        """Next for the client: ``("question", request)``, ``("done", call)`` or ``("failed", error)``."""
        return await self._events.receive()
