"""What a replica's front serves or forwards, and running the replay app on it: one buffered request.

The front (:mod:`~replay_sim.scale.gateway`) reads the request (it must, to find ``_meta``
episodes) and serves here, or sends the replica holding the episode, an
:class:`Envelope`: the ASGI scope, the whole body, what the request belongs to and — when the
front knows — the replica that must serve it. The replica runs the unchanged replay app
(:func:`~replay_sim.replay.http.app.create_app`) on it with :func:`run_buffered` and streams back the
ASGI messages the app sends, batched. :class:`Lifespan` runs the app's startup and shutdown, as
uvicorn would. No Ray here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Scope

from replay_sim.errors import ReplaySimError
from replay_sim.scale.affinity import Affinity

__all__ = ["REDIRECT", "Envelope", "Lifespan", "run_buffered", "scope_for_wire"]

REDIRECT = "replay-sim.redirect"
"""A replica's answer meaning "not mine: this episode is held by replica ``message['replica']``"."""
START = "http.response.start"
_finishing: set[asyncio.Future[None]] = set()  # apps finishing requests already answered (kept alive)
_SCOPE_KEYS = (
    "type",
    "asgi",
    "http_version",
    "method",
    "scheme",
    "path",
    "raw_path",
    "root_path",
    "query_string",
    "headers",
    "client",
    "server",
)


@dataclass(frozen=True)
class Envelope:
    """One HTTP request as a replica's front serves or forwards it.

    Attributes:
        scope: The ASGI scope, reduced to what crosses processes (:func:`scope_for_wire`).
        body: The whole request body.
        affinity: What the request belongs to (episode, MCP session).
        target: The replica that must serve it (its session's, or its episode's known holder), or
            None to let the router hash the episode (or pick any replica for a request with none).
    """

    scope: dict[str, Any]
    body: bytes
    affinity: Affinity
    target: str | None = None


def scope_for_wire(scope: Scope) -> dict[str, Any]:
    """The picklable part of an ASGI HTTP scope (no app state, no extensions)."""
    wire = {key: scope[key] for key in _SCOPE_KEYS if key in scope}
    wire["headers"] = [(bytes(k), bytes(v)) for k, v in scope.get("headers", [])]
    return wire


async def run_buffered(app: ASGIApp, scope: Scope, body: bytes) -> AsyncIterator[list[Message]]:
    """Run an ASGI app on one buffered request, yielding what it sends in batches.

    A response start is yielded with its first body part (but a GET's, a standalone stream, at
    once), so a plain JSON answer is one batch. When the consumer stops before the answer is
    complete (the client went away), the app sees ``http.disconnect`` and is cancelled; once it
    is complete, the app finishes the request undisturbed.

    Args:
        app: The ASGI app.
        scope: The request's scope.
        body: The whole request body.

    Yields:
        Lists of ASGI ``http.response.*`` messages, in order.
    """
    sent: asyncio.Queue[Message | None] = asyncio.Queue()
    gone = asyncio.Event()
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await sent.put(message)

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            await sent.put(None)

    # A GET is a standalone stream: its first event may come much later, its headers must not wait.
    hold = scope.get("method") != "GET"
    task = asyncio.ensure_future(run())
    done = False
    try:
        while not done:
            batch: list[Message] = []
            while not done and (
                not batch or (batch[-1]["type"] == "http.response.start" and hold) or not sent.empty()
            ):
                message = await sent.get()
                if message is None:
                    done = True
                else:
                    batch.append(message)
                    done = message["type"] == "http.response.body" and not message.get("more_body", False)
            if batch:
                yield batch
        # Shielded: a consumer cancelled now (the client closed after its answer) must not cancel the
        # app, whose request is complete (asyncio cancels an awaited task with its awaiter).
        await asyncio.shield(task)  # re-raises what the app raised
    finally:
        if task.done():
            pass
        elif done:
            # The answer is complete: let the app finish its request on its own. Cancelling its tail
            # would undo what it settles after answering (the SDK keeps a new MCP session only once
            # the request that opened it returns normally).
            _finishing.add(task)
            task.add_done_callback(_finishing.discard)
        else:
            gone.set()  # the client went away mid-answer
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class Lifespan:
    """Runs an ASGI app's lifespan (startup, then shutdown) outside a web server.

    Args:
        app: The ASGI app whose lifespan starts its MCP session managers, index and model.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._outbox: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """True from a completed startup until the app's lifespan ends."""
        return self._task is not None and not self._task.done()

    async def startup(self) -> None:
        """Start the app; returns once its startup completed.

        Raises:
            ReplaySimError: The app's startup failed (with the app's message).
        """

        async def run() -> None:
            scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
            await self.app(scope, self._inbox.get, self._outbox.put)

        self._task = asyncio.ensure_future(run())
        await self._inbox.put({"type": "lifespan.startup"})
        message = await self._answer()
        if message["type"] != "lifespan.startup.complete":
            raise ReplaySimError(f"the replay app failed to start: {message.get('message', message)}")

    async def shutdown(self) -> None:
        """Stop the app (its session managers close their sessions)."""
        if self._task is None or self._task.done():
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        with contextlib.suppress(Exception):
            await self._answer()
        with contextlib.suppress(Exception):
            await self._task

    async def _answer(self) -> Message:
        assert self._task is not None
        getting = asyncio.ensure_future(self._outbox.get())
        await asyncio.wait({getting, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if getting.done():
            return getting.result()
        getting.cancel()
        error = self._task.exception()
        return {"type": "lifespan.failed", "message": str(error) if error else "the app returned"}
