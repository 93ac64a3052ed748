"""Writing whole lines to a non-blocking file descriptor in order, at once when the pipe takes them."""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine
from typing import Any

import anyio

__all__ = ["Writer"]


class Writer:
    """This process's stdout: whole lines written in the order handed over, at once when the pipe takes them.

    :meth:`send` never waits: what the pipe does not take at once is kept, in order, and written
    by a task as the client reads; awaiting the writer (``await writer(data)``) also waits until
    the line is written, so a writer that keeps writing is held back by a client not reading.

    Args:
        fd: The (non-blocking) file descriptor written.
        spawn: Starts the task that writes what the pipe did not take at once.
    """

    def __init__(self, fd: int, spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], None]) -> None:
        self.fd = fd
        self.gone = False
        """The client closed its end: nothing more is written."""
        self._spawn = spawn
        self._pending = bytearray()
        self._flushed: anyio.Event | None = None  # set when what was pending is written

    def send(self, data: bytes) -> bool:
        """Write ``data`` after everything handed over before, without waiting; False: the client is gone."""
        if self.gone:
            return False
        if not self._pending:
            try:
                written = os.write(self.fd, data)
            except BlockingIOError:
                written = 0
            except (BrokenPipeError, ConnectionResetError):
                self.gone = True
                return False
            if written == len(data):
                return True
            data = data[written:]
            self._flushed = anyio.Event()
            self._spawn(self._flush)
        self._pending += data
        return True

    @property
    def pending(self) -> int:
        """Bytes handed over and not yet written."""
        return len(self._pending)

    async def drained(self) -> None:
        """Wait until everything handed over so far is written (or the client is gone)."""
        if self._flushed is not None:
            await self._flushed.wait()

    async def __call__(self, data: bytes) -> bool:
        """Write all of ``data`` (after everything handed over before); False when the client is gone."""
        if not self.send(data):
            return False
        await self.drained()
        return not self.gone

    async def _flush(self) -> None:
        """Write what the pipe did not take at once, as the client reads."""
        try:
            while self._pending:
                await anyio.wait_writable(self.fd)
                try:
                    del self._pending[: os.write(self.fd, self._pending)]
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    self.gone = True
                    self._pending.clear()
        finally:
            flushed, self._flushed = self._flushed, None
            if flushed is not None:
                flushed.set()
