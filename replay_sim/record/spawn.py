"""Start a stdio server process without holding up the event loop.

uvloop (which uvicorn runs when it is installed, as it is with ``ray[serve]``) starts a subprocess
with ``fork()`` and waits, holding the GIL, until the child has called ``exec``. In a replay process
of 0.6 GB that is 30-80 ms per start in which no other session is answered: in a first pass of
64 sandboxed episodes, 44 % of the replay's Python time. :func:`spawn` starts the process with
:class:`subprocess.Popen` in a worker thread instead (CPython uses ``vfork``: well under a
millisecond, and the loop goes on meanwhile), then connects its pipes to the running loop and
learns of its exit from a pidfd — no thread waits on it.

What it returns is an :class:`anyio.abc.Process` as the SDK's spawn returns (its own process
group, so ``killpg`` ends it and its children), with the pipes' asyncio objects where
:class:`~replay_sim.record.child.ChildStdio` reads them: the input's ``StreamWriter`` and the
output's pipe transport (:func:`~replay_sim.record.child_output.output_pipe`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

import anyio
import anyio.abc

__all__ = ["Spawned", "spawn", "spawnable"]

_CHUNK = 1 << 16


async def spawn(
    command: str, args: list[str], env: Mapping[str, str] | None, errlog: TextIO, cwd: str | Path | None
) -> Spawned:
    """Start ``command args`` in its own session, its stdin and stdout piped to this loop.

    Raises:
        OSError: It could not be started (no such program, not executable, no such ``cwd``).
    """
    popen = await anyio.to_thread.run_sync(
        lambda: subprocess.Popen(
            [command, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errlog,
            env=None if env is None else dict(env),
            cwd=cwd,
            bufsize=0,
            start_new_session=True,
        )
    )
    try:
        return await Spawned.attach(popen)
    except BaseException:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, signal.SIGKILL)
        await anyio.to_thread.run_sync(popen.wait)
        raise


class _Input(anyio.abc.ByteSendStream):
    """The process's stdin. ``_stream`` is the asyncio ``StreamWriter`` (as anyio's own wrapper names
    it): :class:`~replay_sim.record.child.ChildStdio` writes through it without a task hop."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._stream = writer

    async def send(self, item: bytes) -> None:
        if self._stream.is_closing():
            raise anyio.BrokenResourceError
        self._stream.write(item)
        try:
            await self._stream.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        self._stream.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self._stream.wait_closed()


class _Output(anyio.abc.ByteReceiveStream):
    """The process's stdout. ``pipe`` is its asyncio read transport, whose protocol a reader of
    its own may take over (:class:`~replay_sim.record.child_output.ChildOutput`)."""

    def __init__(self, reader: asyncio.StreamReader, pipe: asyncio.ReadTransport) -> None:
        self._reader = reader
        self._closed = False
        self.pipe = pipe

    async def receive(self, max_bytes: int = _CHUNK) -> bytes:
        if self._closed:
            raise anyio.ClosedResourceError
        data = await self._reader.read(max_bytes)
        if not data:
            raise anyio.EndOfStream
        return data

    async def aclose(self) -> None:
        self._closed = True
        self.pipe.close()


class Spawned(anyio.abc.Process):
    """A started process: its pipes on this loop, its exit learned from a pidfd."""

    def __init__(self, popen: subprocess.Popen[bytes], stdin: _Input, stdout: _Output) -> None:
        self._popen = popen
        self._stdin = stdin
        self._stdout = stdout
        self._exited = anyio.Event()

    @classmethod
    async def attach(cls, popen: subprocess.Popen[bytes]) -> Spawned:
        """Connect a started process's pipes to the running loop and watch for its exit."""
        loop = asyncio.get_running_loop()
        assert popen.stdin is not None and popen.stdout is not None
        reader = asyncio.StreamReader(limit=_CHUNK, loop=loop)
        pipe, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), popen.stdout)
        # A write pipe's protocol: asyncio's stream protocol gives the writer its flow control.
        write, protocol = await loop.connect_write_pipe(
            lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), popen.stdin
        )
        writer = asyncio.StreamWriter(write, protocol, None, loop)
        process = cls(popen, _Input(writer), _Output(reader, pipe))
        process._watch(loop)
        return process

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            pidfd = os.pidfd_open(self._popen.pid)
        except ProcessLookupError:  # gone already: reaped by poll() below
            self._popen.poll()
            self._exited.set()
            return

        def exited() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self._popen.poll()  # reaps it
            self._exited.set()

        loop.add_reader(pidfd, exited)

    async def aclose(self) -> None:
        """Close its pipes and wait for it to exit (as anyio's ``Process`` does; killed if cancelled)."""
        await self._stdin.aclose()
        await self._stdout.aclose()
        try:
            await self.wait()
        except BaseException:
            self.kill()
            with anyio.CancelScope(shield=True):
                await self.wait()
            raise

    async def wait(self) -> int:
        await self._exited.wait()
        returncode = self._popen.poll()
        assert returncode is not None  # its pidfd said it exited
        return returncode

    def terminate(self) -> None:
        self._popen.terminate()

    def kill(self) -> None:
        self._popen.kill()

    def send_signal(self, signal: int) -> None:  # type: ignore[override]  # anyio names it ``signal`` too
        self._popen.send_signal(signal)

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    @property
    def stdin(self) -> _Input:
        return self._stdin

    @property
    def stdout(self) -> _Output:
        return self._stdout

    @property
    def stderr(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"Spawned(pid={self.pid}, returncode={self.returncode})"


@functools.cache
def spawnable() -> bool:
    """Whether :func:`spawn` works here (pidfds: Linux 5.3 and later); else the SDK's spawn is used."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True
