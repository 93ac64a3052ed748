"""Warming a resolver up in the background, so a replay answers exact hits the moment it starts.

The slow first-use work of a resolver — loading (or building) the vector index, loading the
embedding model (seconds: torch and sentence-transformers import slowly), calibrating each tool's
threshold — runs once, in a daemon thread. Exact and canonical hits need none of it. A call that
does need it waits for it (the index and the model are each loaded under a lock), never fails;
a server that must not block its event loop asks :meth:`Warmup.nowait` first and, when the call
would wait, runs it in a worker thread instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

__all__ = ["NotWarm", "Warmup"]

T = TypeVar("T")


class NotWarm(Exception):
    """A call made under :meth:`Warmup.nowait` needs what the warm-up is still loading."""


class Warmup:
    """One background warm-up: started once, waited for, asked whether it is still running.

    Args:
        work: The warm-up itself; its exceptions end it (and are reported by :mod:`threading`),
            calls that need what it failed to load try again themselves.
        name: The thread's name.
    """

    def __init__(self, work: Callable[[], None], name: str = "replay-sim-warm-up") -> None:
        self.work = work
        self.name = name
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._then: list[Callable[[], None]] = []
        self._local = threading.local()

    @property
    def warming(self) -> bool:
        """Whether the warm-up was started and has not finished."""
        return self._thread is not None and not self._done.is_set()

    @property
    def done(self) -> bool:
        """Whether the warm-up has finished (successfully or not)."""
        return self._done.is_set()

    def start(self, then: Callable[[], None] | None = None) -> None:
        """Start the warm-up unless it was started already.

        Args:
            then: Called (in the warm-up's thread) once it has finished; at once if it has.
        """
        with self._lock:
            finished = self._done.is_set()
            if then is not None and not finished:
                self._then.append(then)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        if then is not None and finished:
            then()

    def _run(self) -> None:
        try:
            self.work()
        finally:
            with self._lock:
                self._done.set()
                callbacks, self._then = self._then, []
            for callback in callbacks:
                callback()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the warm-up has finished (True), or ``timeout`` seconds passed (False)."""
        return self._done.wait(timeout)

    @contextmanager
    def nowait(self) -> Iterator[None]:
        """Within this block, on this thread, :meth:`need` raises :class:`NotWarm` while warming."""
        self._local.nowait = True
        try:
            yield
        finally:
            self._local.nowait = False

    def attempt(self, call: Callable[[], T]) -> T | None:
        """``call()``, or None when, while warming, it needs what the warm-up still loads (:meth:`need`)."""
        if not self.warming:
            return call()
        try:
            with self.nowait():
                return call()
        except NotWarm:
            return None

    def need(self) -> None:
        """Say that the caller needs the warm-up's results (a no-op unless under :meth:`nowait`).

        Raises:
            NotWarm: Under :meth:`nowait`, while the warm-up runs.
        """
        if getattr(self._local, "nowait", False) and self.warming:
            raise NotWarm
