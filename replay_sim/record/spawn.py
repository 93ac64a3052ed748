"""Start a stdio server process without holding up the event loop.

uvloop (which uvicorn runs when it is installed, as it is with ``ray[serve]``) starts a subprocess
with ``fork()`` and waits, holding the GIL, until the child has called ``exec``. In a replay process
of 0.6 GB that is 30-80 ms per start in which no other session is answered: in a first pass of
64 sandboxed episodes, 44 % of the replay's Python time. :func:`spawn` starts the process with
:class:`subprocess.Popen` in a worker thread instead (CPython uses ``vfork``: well under a
millisecond, and the loop goes on meanwhile), then connects its pipes to the running loop and
learns of its exit from a pidfd, which one reaper thread waits on for every process (in an epoll
of its own, never the loop's).

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
import select
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TextIO

import anyio
import anyio.abc
import anyio.lowlevel

from replay_sim.record.priority import Priority

__all__ = ["Spawned", "handed", "spawn", "spawnable"]

_CHUNK = 1 << 16


async def spawn(
    command: str,
    args: list[str],
    env: Mapping[str, str] | None,
    errlog: TextIO,
    cwd: str | Path | None,
    priority: Priority | None = None,
) -> Spawned:
    """Start ``command args`` in its own session, its stdin and stdout piped to this loop.

    Args:
        priority: Its CPU priority, told of the process group as soon as it exists (None: normal).

    Raises:
        OSError: It could not be started (no such program, not executable, no such ``cwd``).
    """

    def start() -> subprocess.Popen[bytes]:
        popen = subprocess.Popen(
            [command, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errlog,
            env=None if env is None else dict(env),
            cwd=cwd,
            bufsize=0,
            start_new_session=True,
        )
        if priority is not None:
            priority.started(popen.pid)
        return popen

    popen = await anyio.to_thread.run_sync(start)
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
        # Not waiting for it to close, as anyio's own wrapper: input a server does not read would
        # hold the SDK's stop (stdin closed, then a grace period, then the kill) at this line.
        self._stream.close()
        await anyio.lowlevel.checkpoint()


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
    """A started process: its pipes on this loop, its exit learned from its pidfd (by the reaper)."""

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
        output = handed(popen.stdout, loop)
        pipe, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), output)
        # A write pipe's protocol: asyncio's stream protocol gives the writer its flow control.
        write, protocol = await loop.connect_write_pipe(
            lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), handed(popen.stdin, loop)
        )
        writer = asyncio.StreamWriter(write, protocol, None, loop)
        process = cls(popen, _Input(writer), _Output(reader, pipe))
        process._watch(loop)
        return process

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        def exited() -> None:
            self._popen.poll()  # reaps it
            self._exited.set()

        try:
            _REAPER.watch(self._popen.pid, loop, exited)
        except ProcessLookupError:  # gone already
            exited()

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


class _Descriptor:
    """A pipe end handed to uvloop: libuv closes the descriptor, so closing this object does nothing."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        pass


def handed(file: IO[bytes], loop: asyncio.AbstractEventLoop) -> IO[bytes] | _Descriptor:
    """``file``'s pipe end as ``loop`` will close it: exactly once.

    uvloop closes a pipe transport's descriptor itself (libuv) and then calls the file object's
    ``close()`` too (``uvloop/handles/handle.pyx``, ``UVSocketHandle._close``, which expects
    ``EBADF``): a second ``close`` of the same number — which another thread may have been given
    meanwhile (a worker thread's ``Popen`` pipes, the pinned clock's file), so that thread's file is
    closed under it, and a number libuv watches can end up closed or reused. The replay aborted
    (``SIGABRT``) in some first passes of 1,024 episodes. So the loop gets a duplicate of the
    descriptor, ``Popen``'s own file object is closed here, once, and uvloop's object does not close
    it again; asyncio, which closes only the file object, gets a file object of the duplicate.
    """
    fd = os.dup(file.fileno())
    file.close()
    if type(loop).__module__.partition(".")[0] == "uvloop":
        return _Descriptor(fd)
    return open(fd, "rb" if "r" in file.mode else "wb", buffering=0)  # the transport closes it


class _Reaper:
    """One thread waiting on the pidfds of every process :func:`spawn` started, in an epoll of its
    own; it tells each process's loop of its exit. The pidfds are never the loop's: while uvloop's
    poller watched them, libuv aborted the replay (``SIGABRT`` in the loop) in two of two first
    passes of 1,024 episodes — more likely the pipes' double close :func:`handed` mends, but a
    descriptor the loop never watches cannot be one it aborts on."""

    def __init__(self) -> None:
        self._epoll: select.epoll | None = None
        self._waiting: dict[int, tuple[asyncio.AbstractEventLoop, Callable[[], None]]] = {}
        self._lock = threading.Lock()

    def watch(self, pid: int, loop: asyncio.AbstractEventLoop, exited: Callable[[], None]) -> None:
        """Call ``exited`` in ``loop`` once process ``pid`` has exited.

        Raises:
            ProcessLookupError: It is gone already.
        """
        pidfd = os.pidfd_open(pid)
        with self._lock:
            if self._epoll is None:
                self._epoll = select.epoll()
                reaper = threading.Thread(target=self._run, args=(self._epoll,), name="replay-sim-reaper")
                reaper.daemon = True
                reaper.start()
            self._waiting[pidfd] = (loop, exited)
            self._epoll.register(pidfd, select.EPOLLIN)

    def _run(self, epoll: select.epoll) -> None:
        while True:
            for pidfd, _ in epoll.poll():
                with self._lock:
                    loop, exited = self._waiting.pop(pidfd)
                    epoll.unregister(pidfd)
                os.close(pidfd)
                with contextlib.suppress(RuntimeError):  # its loop has closed: nobody to tell
                    loop.call_soon_threadsafe(exited)


_REAPER = _Reaper()


@functools.cache
def spawnable() -> bool:
    """Whether :func:`spawn` works here (pidfds: Linux 5.3 and later); else the SDK's spawn is used."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True
