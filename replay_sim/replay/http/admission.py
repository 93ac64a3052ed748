"""Admission control for the replay server: bounded sessions, bounded work, bounded body reads.

An RL trainer opens sessions by the thousand and does not always close them. The replay server
keeps what it takes on bounded — :class:`~replay_sim.replay.options.Limits`, settable from
``replay-sim serve``. While too many MCP requests are in flight, a request that would open a
session waits its turn (first come, first served) for one of them to finish, so the sessions
already open keep their pace and a batch of rollouts starting at once all start — the MCP SDK
client does not retry a ``503``. One that waited :attr:`Limits.admission_wait` in vain gets
``503`` with a JSON-RPC error and ``Retry-After``. A client that sends its headers but not its body
gets ``408`` and its connection closed once :attr:`Limits.body_timeout` has passed.

A request counts as in flight only once it can be answered: its body is read first (up to
:data:`MAX_PEEK_BYTES`, which the router reads anyway), so a body that trickles in — or never
comes, with any ``Mcp-Session-Id`` made up — holds no slot while it does, and hundreds of them
cannot keep new sessions waiting. Only a body past :data:`MAX_PEEK_BYTES` is counted before it has
all arrived (its sender has sent a mebibyte for it); :attr:`Limits.body_timeout` bounds them all.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

import anyio
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from replay_sim.replay.options import Limits

__all__ = ["MAX_PEEK_BYTES", "Admission", "BodyTimeout", "peek", "replaying"]

MAX_PEEK_BYTES = 1 << 20
"""The most of a POST body read before it counts in flight (and read for ``_meta`` by the router)."""


_SESSION_HEADER = b"mcp-session-id"
_VERSION_HEADER = b"mcp-protocol-version"
_HANDSHAKE = frozenset(v.encode() for v in HANDSHAKE_PROTOCOL_VERSIONS)


def _opens_session(scope: Scope) -> bool:
    """Whether a POST would open a handshake-era session (no session id; not a modern-era request)."""
    version = None
    for key, value in scope["headers"]:
        if key == _SESSION_HEADER:
            return False
        if key == _VERSION_HEADER:
            version = value
    return version is None or version in _HANDSHAKE


async def _refuse(send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]]) -> None:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}}
    start: dict[str, Any] = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), *headers],
    }
    await send(start)
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


class Admission:
    """Counts the MCP requests in flight; new sessions queue for a slot while there are too many.

    Args:
        limits: The limits to keep.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.in_flight = 0  # POSTs being handled (one event loop: no lock needed)
        self.reading = 0  # POSTs whose body is still coming (they hold no slot)
        self._waiting: deque[anyio.Event] = deque()  # opening requests, oldest first

    @property
    def waiting(self) -> int:
        """Requests that would open a session, waiting for their turn."""
        return len(self._waiting)

    async def __call__(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """Hand one MCP request to ``app``; one that would open a session first waits for its turn."""
        if scope["method"] != "POST":  # GET streams live long and do no work; DELETE ends a session
            await app(scope, receive, send)
            return
        self.reading += 1
        try:
            messages = await peek(receive)  # before a slot: a body still trickling in holds none
        finally:
            self.reading -= 1
        if messages[-1]["type"] == "http.disconnect":
            return  # gone (or answered 408 by BodyTimeout) before its body came: nothing to do
        receive = replaying(messages, receive)
        retry = [(b"retry-after", str(self.limits.retry_after).encode())]
        if not _opens_session(scope):
            self.in_flight += 1
            try:
                await app(scope, receive, send)
            finally:
                self._release()
            return
        queued = self.waiting
        if not await self._admit():
            await _refuse(
                send,
                503,
                f"replay server overloaded: {self.in_flight} MCP requests in flight (serve "
                f"--max-concurrent {self.limits.max_concurrent}) and {queued} new sessions ahead of "
                f"this one for {self.limits.admission_wait:g} s (--admission-wait); retry in "
                f"{self.limits.retry_after} s",
                retry,
            )
            return

        async def retry_later(message: Message) -> None:
            # The session manager's own "too many open sessions" 503 says when to come back, too.
            if message["type"] == "http.response.start" and message["status"] == 503:
                headers = list(message.get("headers", []))
                if all(name.lower() != b"retry-after" for name, _ in headers):
                    message = {**message, "headers": [*headers, *retry]}
            await send(message)

        try:
            await app(scope, receive, retry_later)
        finally:
            self._release()

    async def _admit(self) -> bool:
        """Take a slot for a request that would open a session, waiting in line for it if need be.

        Returns:
            Whether the request holds a slot (counted in :attr:`in_flight`); False once it has
            waited :attr:`Limits.admission_wait` without one.
        """
        if self.in_flight < self.limits.max_concurrent and not self._waiting:
            self.in_flight += 1
            return True
        if self.limits.admission_wait <= 0:
            return False
        turn = anyio.Event()
        self._waiting.append(turn)
        try:
            with anyio.move_on_after(self.limits.admission_wait):
                await turn.wait()
        except BaseException:  # cancelled while waiting: give back a slot handed over meanwhile
            if turn.is_set():
                self._release()
            else:
                self._waiting.remove(turn)
            raise
        if turn.is_set():
            return True  # a finishing request handed its slot over
        self._waiting.remove(turn)
        return False

    def _release(self) -> None:
        """One request is done: its slot goes to the oldest waiting one while there is room."""
        if self._waiting and self.in_flight <= self.limits.max_concurrent:
            self._waiting.popleft().set()  # the slot changes hands: in_flight stays
        else:
            self.in_flight -= 1


async def peek(receive: Receive) -> list[Message]:
    """A request's first messages: its whole body when at most :data:`MAX_PEEK_BYTES`, else its start.

    The last message read is a disconnect when the client went (or its body's time ran out).
    """
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            return messages
        size += len(message.get("body", b""))
        if size > MAX_PEEK_BYTES:
            return messages


def replaying(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` with ``messages`` (already read) handed out first."""
    queue = deque(messages)

    async def replayed() -> Message:
        return queue.popleft() if queue else await receive()

    return replayed


class BodyTimeout:
    """ASGI middleware: a request whose body has not arrived ``seconds`` after its headers gets ``408``.

    The answer closes the connection (``Connection: close``); the app sees the client disconnect.

    Args:
        app: The app to guard.
        seconds: The time allowed for a whole request body.
    """

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = anyio.current_time() + self.seconds
        body_done = started = answered = False

        async def timed_receive() -> Message:
            nonlocal body_done, answered
            if body_done:
                return await receive()
            if answered:
                return {"type": "http.disconnect"}
            with anyio.move_on_after(deadline - anyio.current_time()) as waiting:
                message = await receive()
            if not waiting.cancelled_caught:
                body_done = message["type"] != "http.request" or not message.get("more_body", False)
                return message
            if not started:
                answered = True
                await _refuse(
                    send,
                    408,
                    f"request body not received within {self.seconds:g} s",
                    [(b"connection", b"close")],
                )
            return {"type": "http.disconnect"}

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if answered:  # the 408 was the answer; the app is only winding down
                return
            started = True
            await send(message)

        await self.app(scope, timed_receive, guarded_send)
