"""A stdio server's output read by the recorder's own protocol: answers handed over as they are read.

asyncio's stdio subprocess hands a server's output to the SDK's stream through three turns of
the event loop (the pipe's read, the subprocess protocol, the reading task). :class:`ChildOutput`
takes the pipe's place as its protocol, so each read is handled in the loop's callback: an answer
to a request :class:`~replay_sim.record.child.ChildStdio` wrote raw goes to its waiter at once,
every other line (notifications, the server's requests, answers to the SDK's requests) to the SDK's
dispatcher, in order, by :meth:`ChildOutput.deliver`.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp.shared.message import SessionMessage

from replay_sim.stdio_transport import LineSplitter

__all__ = ["ChildOutput", "Reader", "output_pipe", "parse"]


class Reader(Protocol):
    """What reads a server's output lines (:class:`~replay_sim.record.child.ChildStdio`)."""

    on_read: Callable[[], None] | None
    """Called after a read that answered a raw request."""
    max_line: int | None
    """The longest output line allowed, in bytes (None: any)."""

    def overflowed(self) -> None:
        """A line was longer than ``max_line``: the server is ended."""
        ...

    def answers(self, line: bytes) -> bool:
        """Whether a line answers a raw request (then handed to its waiter)."""
        ...

    async def hand_over(
        self, line: bytes, read_writer: MemoryObjectSendStream[SessionMessage | Exception]
    ) -> bool:
        """Hand a line to a raw request's waiter (True) or to the SDK's dispatcher."""
        ...

    def closed(self) -> None:
        """The output ended."""
        ...


class ChildOutput:
    """A stdio server's output as asyncio reads it: answers to raw requests handed over at once.

    Installed as the protocol of the server's stdout pipe, so each read is handled in the event
    loop's callback, with no task woken (the SDK's stream would take three trips through the loop:
    the read, the subprocess protocol, the reading task). A line for the SDK's dispatcher is queued
    for :meth:`deliver`, and so is every line after it, in order, with the pipe paused meanwhile.
    """

    def __init__(self, child: Reader, pipe: Any) -> None:
        self.child = child
        self.pipe = pipe
        self.sdk = pipe.get_protocol()  # the subprocess transport's: told when the pipe closes
        self.lines = LineSplitter(child.max_line or sys.maxsize)
        self.backlog: deque[bytes | None] = deque()  # lines for deliver(); None: the output ended
        self.wake = anyio.Event()
        self.ended = False
        self.discarding = False
        pipe.set_protocol(self)

    def connection_made(self, transport: Any) -> None:
        """Not called: the pipe was connected before."""

    def data_received(self, data: bytes) -> None:
        if self.discarding:
            return
        child, answered = self.child, False
        lines = self.lines.feed(data)
        if self.lines.dropping or any(not isinstance(line, bytes) for line in lines):
            self.discarding = True
            child.overflowed()  # a line over the cap: the server is ended, never half-answered
            return
        for line in lines:
            assert isinstance(line, bytes)
            if not self.backlog and child.answers(line):
                answered = True
            else:
                self.backlog.append(line)
        if answered and child.on_read is not None:
            child.on_read()
        if self.backlog:
            self.pipe.pause_reading()  # until deliver() has handed the backlog over
            self.wake.set()

    def eof_received(self) -> None:
        self._end()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()
        self.sdk.connection_lost(exc)

    def _end(self) -> None:
        if not self.ended:
            self.ended = True
            self.backlog.append(None)
            self.wake.set()

    async def deliver(self, read_writer: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        """Hand the queued lines to the SDK's dispatcher in order (an answer among them to its waiter)."""
        child = self.child
        try:
            async with read_writer:
                while True:
                    await self.wake.wait()
                    self.wake = anyio.Event()
                    answered = False
                    while self.backlog:
                        line = self.backlog.popleft()
                        if line is None:
                            return  # the session sees the stream close
                        answered = await child.hand_over(line, read_writer) or answered
                    if answered and child.on_read is not None:
                        child.on_read()
                    self.pipe.resume_reading()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # our shutdown: the session is gone
        finally:
            # From now on the output is read and dropped, so the server never blocks on a full pipe.
            self.discarding = True
            self.backlog.clear()
            self.pipe.resume_reading()
            child.closed()


def output_pipe(process: Any) -> Any:
    """asyncio's transport of the server's stdout pipe, or None (another event loop)."""
    pipe = getattr(getattr(process, "stdout", None), "pipe", None)  # spawn()'s
    if pipe is None:
        transport = getattr(getattr(process, "_process", None), "_transport", None)  # anyio's
        get_pipe = getattr(transport, "get_pipe_transport", None)
        pipe = get_pipe(1) if callable(get_pipe) else None
    needed = ("get_protocol", "set_protocol", "pause_reading", "resume_reading")
    return pipe if pipe is not None and all(hasattr(pipe, name) for name in needed) else None


def parse(line: bytes) -> SessionMessage | Exception:
    """A line for the SDK's dispatcher, as its stdio client parses it."""
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc
