"""A thread-free stdio transport for serving MCP on this process's stdin/stdout (POSIX).

The SDK's ``stdio_server`` reads and writes through worker threads (three thread hops per
request), which alone costs the recording proxy most of its latency budget. This one polls
non-blocking duplicates of fds 0 and 1 on the event loop. Like the SDK's, it points fd 0 at the
null device and fd 1 at stderr while serving, so stray output of handlers cannot corrupt the wire.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

__all__ = ["native_stdio"]

_CHUNK = 1 << 16


@asynccontextmanager
async def native_stdio() -> AsyncIterator[
    tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
]:
    """Yield ``(read_stream, write_stream)`` of JSON-RPC messages over stdin/stdout.

    Falls back to the SDK's thread-based ``stdio_server`` on Windows.
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

    async def reader() -> None:
        buffer = b""
        async with read_writer:
            while True:
                await anyio.wait_readable(wire_in)
                try:
                    chunk = os.read(wire_in, _CHUNK)
                except BlockingIOError:
                    continue
                if not chunk:
                    return
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    try:
                        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                    except Exception as exc:
                        await read_writer.send(exc)
                        continue
                    await read_writer.send(SessionMessage(message))

    async def writer() -> None:
        async with write_reader:
            async for item in write_reader:
                data = (item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode()
                while data:
                    try:
                        data = data[os.write(wire_out, data) :]
                    except BlockingIOError:
                        await anyio.wait_writable(wire_out)
                    except (BrokenPipeError, ConnectionResetError):
                        return

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
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
