"""A thread-free stdio transport for serving MCP on this process's stdin/stdout (POSIX).

The SDK's ``stdio_server`` reads and writes through worker threads (three thread hops per
request), which alone costs the recording proxy most of its latency budget. This one polls
non-blocking duplicates of fds 0 and 1 on the event loop. Like the SDK's, it points fd 0 at the
null device and fd 1 at stderr while serving, so stray output of handlers cannot corrupt the wire.

Bad input is answered, never left hanging (:func:`read_line`, :mod:`~.messages`): a line that is
not JSON, or JSON nested deeper than :data:`~replay_sim.untrusted.MAX_DEPTH` levels, gets a
``-32700`` parse error (id null), JSON that is not a JSON-RPC message ``-32600`` (with its id when
it has one), and so does a request whose id is neither a string nor an integer (``1e3``, ``true``,
``null``, an object), which the SDK would read as a notification and never answer. Lines are
framed in time linear in their length (:class:`LineSplitter`), and capped: a line longer than
:data:`DEFAULT_MAX_LINE` bytes (32 MiB, or ``REPLAY_SIM_MAX_LINE_BYTES``) is dropped as it arrives —
never held whole — and answered with ``-32600`` naming the cap; the next line is served as usual.
32 MiB holds a base64-encoded file or image of 24 MB, more than MCP clients send in practice, while
bounding what one line can make the process hold to a few hundred MB while it is parsed.

A :class:`Shortcut` may answer request lines itself before they are parsed into messages (the
replay's fast path, the recorder's pass-through) — at once, later from a task of the transport's,
or later by itself through the transport's :class:`Writer`; it sees every message the server
writes, and its answers and the server's are written whole, one at a time, in the order they were
handed over. :class:`Opening` tells a shortcut what the connection's first requests settled (its era,
and a handshake's version once the server answered ``initialize``): until then the server must see
every request. :class:`Repeated` cuts a request line's id out of it, so a shortcut can answer a line
it answered before but for its id without parsing it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, Literal, Protocol

import anyio
import anyio.abc
import mcp_types as types
import sniffio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

from replay_sim.stdio_transport.lines import LineSplitter, TooLong
from replay_sim.stdio_transport.messages import MAX_LINE_ENV, read_line
from replay_sim.stdio_transport.requests import Opening, Repeated, request_of
from replay_sim.stdio_transport.writer import Writer

__all__ = [
    "DEFAULT_MAX_LINE",
    "MAX_LINE_ENV",
    "LineSplitter",
    "Opening",
    "Repeated",
    "Resume",
    "Shortcut",
    "TooLong",
    "Writer",
    "native_stdio",
    "read_line",
    "request_of",
]

_CHUNK = 1 << 16
_RESUMED_WAIT = 60.0  # seconds a resumed request's answer is awaited before the next line is read
DEFAULT_MAX_LINE = 32 << 20


class Resume(Protocol):
    """A connection another reader began (a stdio start answering from prepared bytes): what it
    read, and which of the server's answers the client already has."""

    lines: list[bytes]
    """Lines the server must read first (without their newlines), one at a time: each request's
    answer comes before the next line is read, as the client had them."""
    rest: bytes
    """What was read from stdin after them, not yet read by anyone: read next."""

    def swallow(self, line: bytes) -> bool:
        """Whether a response line (no newline) answers one of :attr:`lines`: then it is not written."""
        ...

    def is_request(self, line: bytes) -> bool:
        """Whether this one of :attr:`lines` is a request (whose answer the client already has)."""
        ...


class Shortcut(Protocol):
    """Answers some request lines before the server reads them."""

    def answer(self, line: bytes) -> bytes | Awaitable[bytes] | Literal[True] | None:
        """The response line (no newline) to a request line, or what produces it; None: the server reads it.

        An awaitable is run in a task of the transport's and its line written when it is done;
        True: the shortcut took the line and writes its answer itself (:meth:`Writer.send`).
        """
        ...

    def sent(self, message: types.JSONRPCMessage) -> None:
        """See a message the server writes (before it is written)."""
        ...

    def opened(self, write: Writer) -> None:
        """Called once serving starts with the transport's writer (whole lines, in turn with the server's)."""
        ...


def _asyncio_loop() -> asyncio.AbstractEventLoop | None:
    """The running asyncio event loop, or None under another one."""
    try:
        return asyncio.get_running_loop() if sniffio.current_async_library() == "asyncio" else None
    except (RuntimeError, sniffio.AsyncLibraryNotFoundError):
        return None


def _max_line() -> int:
    value = os.environ.get(MAX_LINE_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_MAX_LINE


@asynccontextmanager
async def native_stdio(
    max_line: int | None = None,
    shortcut: Shortcut | None = None,
    resume: Resume | None = None,
) -> AsyncIterator[
    tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
]:
    """Yield ``(read_stream, write_stream)`` of JSON-RPC messages over stdin/stdout.

    Lines that are not messages are answered here (see the module docstring) and never reach
    ``read_stream``. Falls back to the SDK's thread-based ``stdio_server`` on Windows.

    Args:
        max_line: The longest request line read, in bytes; default ``REPLAY_SIM_MAX_LINE_BYTES``
            from the environment, else :data:`DEFAULT_MAX_LINE`.
        shortcut: Answers some request lines itself (see :class:`Shortcut`).
        resume: The connection as another reader left it (see :class:`Resume`): its lines are read
            first, and the answers the client already has are not written again.
    """
    if sys.platform == "win32":  # pragma: no cover
        from mcp.server.stdio import stdio_server

        async with stdio_server() as streams:
            yield streams  # type: ignore[misc]
        return
    wire_in, wire_out = os.dup(0), os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    blocking = (os.get_blocking(wire_in), os.get_blocking(wire_out))
    os.set_blocking(wire_in, False)
    os.set_blocking(wire_out, False)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    answers = write_stream.clone()  # the reader's own answers to lines that are not messages
    limit = max_line or _max_line()
    begun = b"" if resume is None else resume.rest
    settled = anyio.Event()  # set when an answer the client already has is swallowed
    spawned: list[Callable[[], Coroutine[Any, Any, None]]] = []  # flushes asked before serving starts
    task_group: anyio.abc.TaskGroup | None = None

    def spawn(fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if task_group is None:
            spawned.append(fn)
        else:
            task_group.start_soon(fn)

    write = Writer(wire_out, spawn)

    def answered(line: bytes) -> bool:
        """Whether the client already has this response line (the reader before this one answered it)."""
        if resume is None or not resume.swallow(line):
            return False
        settled.set()
        return True

    async def resumed(tg: anyio.abc.TaskGroup) -> None:
        """Serve the lines another reader answered, one at a time, each request's answer awaited."""
        nonlocal settled
        assert resume is not None
        for line in resume.lines:
            settled = anyio.Event()
            if shortcut is None or not offer(line, tg):
                await serve_line(line)
            if resume.is_request(line):
                with anyio.move_on_after(_RESUMED_WAIT):
                    await settled.wait()

    async def later(answer: Awaitable[bytes]) -> None:
        line = await answer
        if not answered(line):
            await write(line + b"\n")

    def offer(line: bytes, tg: anyio.abc.TaskGroup) -> bool:
        """Offer a request line to the shortcut; True when it answers it."""
        assert shortcut is not None
        answer = shortcut.answer(line)
        if answer is None:
            return False
        if isinstance(answer, bytes):
            if not answered(answer):
                write.send(answer + b"\n")
        elif answer is not True:
            tg.start_soon(later, answer)
        return True

    async def serve_line(line: bytes | TooLong) -> None:
        """Hand a line the shortcut did not answer to the server, or answer that it is no message."""
        message, for_server = read_line(line, limit)
        await (read_writer if for_server else answers).send(message)

    async def reader(tg: anyio.abc.TaskGroup) -> None:
        async with read_writer, answers:
            if resume is not None:
                await resumed(tg)
            loop = _asyncio_loop()
            if loop is not None:
                try:
                    loop.add_reader(wire_in, lambda: None)
                except (OSError, ValueError):
                    pass  # not pollable by asyncio's selector: read in turns below
                else:
                    loop.remove_reader(wire_in)
                    await read_in_callbacks(tg, loop)
                    return
            await read_in_turns(tg)

    async def read_in_turns(tg: anyio.abc.TaskGroup) -> None:
        """Wait for input, read it, handle its lines; again (any event loop)."""
        splitter = LineSplitter(limit)
        pollable = True
        chunk = begun
        while True:
            if chunk:
                pass  # what the reader before this one read
            elif pollable:
                try:
                    await anyio.wait_readable(wire_in)
                except OSError:  # a regular file or /dev/null: always readable, and no selector takes it
                    pollable = False
            else:
                await anyio.lowlevel.checkpoint()
            try:
                chunk = chunk or os.read(wire_in, _CHUNK)
            except BlockingIOError:
                continue
            if not chunk:
                return
            lines, chunk = splitter.feed(chunk), b""
            for line in lines:
                if isinstance(line, bytes) and not line.strip():
                    continue
                if isinstance(line, bytes) and shortcut is not None and offer(line, tg):
                    await write.drained()
                    continue
                await serve_line(line)

    async def read_in_callbacks(tg: anyio.abc.TaskGroup, loop: asyncio.AbstractEventLoop) -> None:
        """Read input in the event loop's callback: lines the shortcut answers cost no task switch.

        A line for the server (and every line after it, in order) waits in a backlog for this
        task, and so does reading, as it does while the client is not reading its answers.
        """
        splitter = LineSplitter(limit)
        backlog: deque[tuple[bytes | TooLong | None, bool]] = deque()  # (line, still to offer); None: EOF
        wake = anyio.Event()

        def readable() -> None:
            try:
                chunk = os.read(wire_in, _CHUNK)
            except BlockingIOError:
                return
            take(chunk)

        def take(chunk: bytes, ended: bool = True) -> None:
            if not chunk and ended:
                backlog.append((None, False))
            for line in splitter.feed(chunk):
                if isinstance(line, bytes) and not line.strip():
                    continue
                if backlog or not isinstance(line, bytes) or shortcut is None:
                    backlog.append((line, isinstance(line, bytes) and shortcut is not None))
                elif not offer(line, tg):
                    backlog.append((line, False))
            if backlog or write.pending:
                loop.remove_reader(wire_in)
                wake.set()

        take(begun, ended=False)  # what the reader before this one read
        if not wake.is_set():
            loop.add_reader(wire_in, readable)
        try:
            while True:
                await wake.wait()
                wake = anyio.Event()
                while backlog:
                    line, still = backlog.popleft()
                    if line is None:
                        return
                    if still and isinstance(line, bytes) and offer(line, tg):
                        continue
                    await serve_line(line)
                await write.drained()
                loop.add_reader(wire_in, readable)
        finally:
            loop.remove_reader(wire_in)

    async def writer() -> None:
        async with write_reader:
            async for item in write_reader:
                if shortcut is not None:
                    shortcut.sent(item.message)
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True).encode()
                if not answered(data) and not await write(data + b"\n"):
                    return

    if shortcut is not None:
        shortcut.opened(write)
    try:
        async with anyio.create_task_group() as tg:
            task_group = tg
            for fn in spawned:
                tg.start_soon(fn)
            tg.start_soon(reader, tg)
            tg.start_soon(writer)
            try:
                yield read_stream, write_stream
            finally:
                tg.cancel_scope.cancel()
    finally:
        os.set_blocking(wire_in, blocking[0])
        os.set_blocking(wire_out, blocking[1])
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        for fd in (wire_in, wire_out, saved_in, saved_out):
            os.close(fd)
