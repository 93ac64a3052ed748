"""A call a fast path had answered by a sandbox instance, handed over to the SDK path to deliver.

A door's fast path asks a bound, warm sandbox instance a call itself
(:mod:`~replay_sim.replay.core.sandboxcalls`) and writes the answer when nothing but the result is to
be sent. When more is — notifications to re-enact, a JSON-RPC error, a call still running when the
SDK would start streaming — it hands the request to the SDK path with the call's outcome (or the
call itself, still running) in the request's ASGI scope under :data:`HANDED_OVER`;
:meth:`Answering.answer <replay_sim.replay.core.answering.Answering.answer>` takes it there instead of
resolving the call and asking the instance again.
"""

from __future__ import annotations

from typing import Any

import anyio
from mcp.server.context import ServerRequestContext

__all__ = ["HANDED_OVER", "Handed", "handed_over"]

HANDED_OVER = "replay-sim.handed-over"
"""ASGI scope key of a request's :class:`Handed` call."""


class Handed:
    """A call asked by a fast path: its answer (an ``Answer``) or error, once :attr:`done` is set."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.answer: Any = None
        self.error: BaseException | None = None

    def settle(self, answer: Any = None, error: BaseException | None = None) -> None:
        """The call ended with ``answer`` (or ``error``, re-raised to whoever waits for it)."""
        self.answer, self.error = answer, error
        self.done.set()

    async def outcome(self) -> Any:
        """The call's answer, once it has one.

        Raises:
            BaseException: What the call raised (an ``EpisodeLost``, a ``StoreError``).
        """
        await self.done.wait()
        if self.error is not None:
            raise self.error
        return self.answer


def handed_over(ctx: ServerRequestContext[Any, Any]) -> Handed | None:
    """The call a fast path handed over with this request, taken (None: the SDK path answers it all)."""
    scope = getattr(ctx.request, "scope", None)
    handed = scope.pop(HANDED_OVER, None) if isinstance(scope, dict) else None
    return handed if isinstance(handed, Handed) else None
