"""A stdio upstream's process and its lines: the SDK's messages, and the recorder's raw requests.

The SDK's stdio client hands every line the server writes to its dispatcher as a validated
message, and writes every request from a model, a task hop each way. The recorder forwards its
client's calls as they are, so :class:`ChildStdio` also lets it write a request line itself
(:meth:`ChildStdio.call`) and takes the answer to it off the server's output as parsed JSON,
before any model is built — or, for a request written with :meth:`ChildStdio.send`, hands the
answer to a callback as the line is read, with no task woken at all. Every other line —
notifications, the server's own requests, answers
to the SDK's requests — reaches the SDK's dispatcher as its stdio client would deliver it. The
server process is started off the event loop (:func:`~replay_sim.record.spawn.spawn`, in its own
process group, as the SDK's spawn) and stopped by the SDK's own helper (stdin closed first, then
the group terminated).
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any, TextIO

import anyio
import anyio.abc
import mcp_types as types
import pydantic_core
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import (
    StdioServerParameters,
    _create_platform_compatible_process,  # the SDK's spawn (where spawn() cannot run): its own process group
    _drain_stdout,
    _get_executable_command,
    _stop_server_process,  # the SDK's shutdown: stdin closed, grace period, group terminated
    get_default_environment,
)
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from replay_sim.record.child_output import ChildOutput, output_pipe, parse
from replay_sim.record.priority import Priority
from replay_sim.record.spawn import spawn, spawnable

__all__ = ["Answered", "ChildStdio", "outcome", "request_line"]

_CHUNK = 1 << 16
_FLUSH_TIMEOUT = 2.0  # seconds the SDK's messages already accepted may take to reach the server at close
_CANCEL_TIMEOUT = 1.0  # seconds a courtesy cancel may take to write
_HIGH_WATER = 1 << 16  # bytes buffered for the server's input before a writer waits


Answered = Callable[[dict[str, Any] | None], None]
"""Takes the answer to a request written by :meth:`ChildStdio.send` (None: the output ended first)."""


class _Waiter:
    """One raw request's answer, once the server wrote it (or the connection closed)."""

    __slots__ = ("answer", "answered", "done")

    def __init__(self, answered: Answered | None = None) -> None:
        self.answered = answered
        self.done = anyio.Event() if answered is None else None
        self.answer: dict[str, Any] | None = None

    def settle(self, answer: dict[str, Any] | None) -> None:
        if self.answered is not None:
            self.answered(answer)
            return
        assert self.done is not None
        self.answer = answer
        self.done.set()


class ChildStdio:
    """A stdio MCP server process: the SDK's message streams, and raw requests beside them.

    Args:
        params: How to start the server.
        errlog: Where its stderr goes.
        max_line: The longest line it may write on stdout, in bytes: a longer one ends the server
            (its process group is killed; no request is answered from it). None: no cap.
        priority: Its CPU priority from its start (:mod:`~replay_sim.record.priority`; applied where
            :func:`~replay_sim.record.spawn.spawn` starts it). None: the normal one.
    """

    def __init__(
        self,
        params: StdioServerParameters,
        errlog: TextIO,
        max_line: int | None = None,
        priority: Priority | None = None,
    ) -> None:
        self.params = params
        self.errlog = errlog
        self.max_line = max_line
        self.priority = priority
        self.overflow = False
        """Whether it was ended for writing a line longer than ``max_line``."""
        self._waiting: dict[str, _Waiter] = {}
        self._writing = anyio.Lock()
        self._stdin: Any = None
        self._closed = False
        self.process: Any = None
        """The server process once started (an anyio ``Process``: ``pid``, ``returncode``, ``wait()``)."""
        self.delivered = 0
        """Lines handed to the SDK's dispatcher so far (notifications among them are handled in tasks)."""
        self.on_read: Callable[[], None] | None = None
        """Called once the answers in a read of the server's output have been handed over (to batch them)."""

    @asynccontextmanager
    async def open(
        self,
    ) -> AsyncIterator[
        tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
    ]:
        """Start the server; yield the SDK dispatcher's streams; stop the server (as the SDK's client does).

        Raises:
            OSError: The server could not be started.
        """
        params = self.params
        command = await _get_executable_command(params.command)
        env = get_default_environment() | (params.env or {})
        if spawnable():  # off the event loop: uvloop's fork would hold every session up meanwhile
            process: Any = await spawn(command, params.args, env, self.errlog, params.cwd, self.priority)
        else:
            process = await _create_platform_compatible_process(
                command=command, args=params.args, env=env, errlog=self.errlog, cwd=params.cwd
            )
        self._stdin = process.stdin
        self.process = process
        read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
        writer_done = anyio.Event()

        async def reader() -> None:
            assert process.stdout is not None
            buffer = b""
            try:
                async with read_writer:
                    try:
                        while True:
                            lines = (buffer + await process.stdout.receive(_CHUNK)).split(b"\n")
                            buffer = lines.pop()
                            if self.max_line is not None and max(map(len, [buffer, *lines])) > self.max_line:
                                self.overflowed()
                                return
                            answered = False
                            for line in lines:
                                answered = await self.hand_over(line, read_writer) or answered
                            if answered and self.on_read is not None:
                                self.on_read()
                    finally:
                        self._close()
                        await _drain_stdout(process)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
                pass  # the server or our shutdown ended its output: the session sees the stream close

        async def writer() -> None:
            try:
                async with write_reader:
                    async for message in write_reader:
                        data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                        await self._write(data.encode(params.encoding, params.encoding_error_handler))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                await read_writer.aclose()  # the session sees the connection end, not a hung request
            finally:
                writer_done.set()

        async with anyio.create_task_group() as tg:
            pipe = output_pipe(process)
            if pipe is None:
                tg.start_soon(reader)
            else:  # asyncio: the output is read by a protocol of ours, answers handed over at once
                tg.start_soon(ChildOutput(self, pipe).deliver, read_writer)
            tg.start_soon(writer)
            try:
                yield read_stream, write_stream
            finally:
                with anyio.CancelScope(shield=True):
                    read_stream.close()
                    write_stream.close()
                    with anyio.move_on_after(_FLUSH_TIMEOUT):
                        await writer_done.wait()
                    await _stop_server_process(process)
                    for stream in (read_stream, write_stream, read_writer, write_reader):
                        await stream.aclose()
                    self._close()
                tg.cancel_scope.cancel()

    async def call(self, request_id: str, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
        """Send one request raw (as the SDK's dispatcher would write it) and return its result as sent.

        Raises:
            MCPError: The server's JSON-RPC error; ``CONNECTION_CLOSED`` when its output ended first.
        """
        return outcome(method, await self.request(request_id, request_line(request_id, method, params)))

    async def request(self, request_id: str, line: bytes) -> dict[str, Any]:
        """Write one request line and return the server's answer to it, parsed (``result`` or ``error``).

        Cancelled while waiting, the server is sent a courtesy ``notifications/cancelled``.

        Raises:
            MCPError: ``CONNECTION_CLOSED`` when the server's output ended first.
        """
        if self._closed:
            raise MCPError(code=types.CONNECTION_CLOSED, message="Connection closed")
        waiter = self._waiting[request_id] = _Waiter()
        assert waiter.done is not None
        written = False
        try:
            await self._write(line + b"\n")
            written = True
            await waiter.done.wait()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            raise MCPError(code=types.CONNECTION_CLOSED, message="Connection closed") from None
        except anyio.get_cancelled_exc_class():
            if written and not self._closed:
                cancel = {"requestId": request_id, "reason": "caller cancelled"}
                notice = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel}
                with anyio.move_on_after(_CANCEL_TIMEOUT, shield=True), suppress(Exception):
                    await self._write(pydantic_core.to_json(notice) + b"\n")
            raise
        finally:
            self._waiting.pop(request_id, None)
        if waiter.answer is None:
            raise MCPError(code=types.CONNECTION_CLOSED, message="Connection closed")
        return waiter.answer

    def send(self, request_id: str, line: bytes, answered: Answered) -> bool:
        """Write one request line now, without waiting; ``answered`` gets the server's answer to it.

        ``answered`` is called as the answer's line is read (or with None when the server's output
        ends first). False, and nothing written: the line cannot go out at once (the server is
        not reading its input, or the connection is not asyncio's), so :meth:`request` should.
        """
        stream = getattr(self._stdin, "_stream", None)
        if (
            self._closed
            or stream is None
            or stream.is_closing()
            or stream.transport.get_write_buffer_size() > _HIGH_WATER
        ):
            return False
        self._waiting[request_id] = _Waiter(answered)
        stream.write(line + b"\n")
        return True

    def forget(self, request_id: str) -> None:
        """Stop waiting for the answer to a request written by :meth:`send`; the server is told."""
        if self._waiting.pop(request_id, None) is None or self._closed:
            return
        stream = getattr(self._stdin, "_stream", None)
        if stream is not None and not stream.is_closing():
            cancel = {"requestId": request_id, "reason": "caller cancelled"}
            notice = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel}
            stream.write(pydantic_core.to_json(notice) + b"\n")

    async def _write(self, data: bytes) -> None:
        """Write ``data`` whole, after what was written before (lines never interleave)."""
        stream = getattr(self._stdin, "_stream", None)  # anyio's asyncio stream: write() buffers, in order
        if stream is None:
            async with self._writing:
                await self._stdin.send(data)
            return
        if stream.is_closing():
            raise anyio.BrokenResourceError
        stream.write(data)
        if stream.transport.get_write_buffer_size() > _HIGH_WATER:
            await stream.drain()  # a server not reading its input: wait for it rather than buffer on

    def answers(self, line: bytes) -> bool:
        """Whether a line of the server's output answers a raw request (then handed to its waiter)."""
        return bool(self._waiting) and self._answered(line)

    async def hand_over(
        self, line: bytes, read_writer: MemoryObjectSendStream[SessionMessage | Exception]
    ) -> bool:
        """Hand a line of the server's output to a raw request's waiter (True) or to the SDK's dispatcher."""
        if self.answers(line):
            return True
        self.delivered += 1
        await read_writer.send(parse(line))
        return False

    def closed(self) -> None:
        """The server's output ended: no raw request will be answered (its waiters are told)."""
        self._close()

    def overflowed(self) -> None:
        """It wrote a line longer than ``max_line``: end its process group; no waiter gets an answer."""
        self.overflow = True
        self._close()
        if self.process is not None and self.process.returncode is None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def _answered(self, line: bytes) -> bool:
        """Hand a line that answers a raw request to its waiter; False for every other line."""
        try:
            message = pydantic_core.from_json(line)
        except ValueError:
            return False
        if not isinstance(message, dict) or "method" in message:
            return False
        id_ = message.get("id")
        waiter = self._waiting.pop(id_, None) if isinstance(id_, str) else None
        if waiter is None:
            return False
        waiter.settle(message)
        return True

    def _close(self) -> None:
        """The server's output ended: no raw request will be answered."""
        if self._closed:
            return
        self._closed = True
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            waiter.settle(None)


def outcome(method: str, answer: dict[str, Any]) -> dict[str, Any]:
    """The result of an answer to ``method`` as its server sent it.

    Raises:
        MCPError: The server's JSON-RPC error, or an answer without a result.
    """
    error = answer.get("error")
    if isinstance(error, dict):
        raise MCPError(
            code=error.get("code", types.INTERNAL_ERROR),
            message=str(error.get("message", "")),
            data=error.get("data"),
        )
    result = answer.get("result")
    if not isinstance(result, dict):
        raise MCPError(code=types.INTERNAL_ERROR, message=f"the server answered {method} without a result")
    return result


def request_line(request_id: str, method: str, params: Mapping[str, Any] | None) -> bytes:
    """A request as the SDK's dispatcher writes it (``params`` left out when empty, as an empty ``_meta``)."""
    out = dict(params or {})
    if not out.get("_meta", True):
        del out["_meta"]
    parts = [
        b'{"jsonrpc":"2.0","id":',
        pydantic_core.to_json(request_id),
        b',"method":',
        pydantic_core.to_json(method),
    ]
    if out:
        parts += [b',"params":', pydantic_core.to_json(out)]
    return b"".join([*parts, b"}"])
