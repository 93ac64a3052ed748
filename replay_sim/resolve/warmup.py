"""Warming a resolver up in the background, so a replay answers exact hits the moment it starts.

The slow first-use work of a resolver — loading (or building) the vector index — runs once, in a
daemon thread. The embedding model (seconds of CPU: torch and sentence-transformers import slowly)
is not part of it unless the index must be built: the first call that embeds a query loads it; nor
is a tool's matching state (its canonical forms and threshold), built by the tool's first call
that needs it. Exact and canonical hits need none of it. A call that
does need it waits for it (the index and the model are each loaded under a lock), never fails;
a server that must not block its event loop asks :meth:`Warmup.nowait` first and, when the call
would wait, runs it in a worker thread instead.

A warm-up that fails (a file it cannot open while the process is out of file descriptors, memory
…) is never silently gone: the failure is logged on the ``replay_sim`` logger, kept in
:attr:`Warmup.failure` (the replay's readiness reports it) and the work is tried again after a
back-off (1 s, doubling up to a minute) until it succeeds or :meth:`Warmup.stop` is called.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

__all__ = ["NotWarm", "Warmup"]

T = TypeVar("T")
log = logging.getLogger("replay_sim")
RETRY_FIRST_S = 1.0
"""Seconds before a failed warm-up is tried again (doubled after each failure)."""
RETRY_MAX_S = 60.0
"""The longest wait between two attempts."""


class NotWarm(Exception):
    """A call made under :meth:`Warmup.nowait` needs what the warm-up is still loading."""


class Warmup:
    """One background warm-up: started once, waited for, asked whether it is still running.

    Args:
        work: The warm-up itself; an exception is logged, kept as :attr:`failure` and the work
            tried again after a back-off (calls that need what it failed to load meanwhile try
            themselves).
        name: The thread's name.

    Attributes:
        failure: The last attempt's exception while the warm-up has not succeeded (None otherwise).
        attempts: Attempts made so far.
    """

    def __init__(self, work: Callable[[], None], name: str = "replay-sim-warm-up") -> None:
        self.work = work
        self.name = name
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._then: list[Callable[[], None]] = []
        self._local = threading.local()
        self._stopped = threading.Event()
        self.failure: BaseException | None = None
        self.attempts = 0

    @property
    def warming(self) -> bool:
        """Whether the warm-up was started and has not finished."""
        return self._thread is not None and not self._done.is_set()

    @property
    def done(self) -> bool:
        """Whether the warm-up has finished successfully."""
        return self._done.is_set()

    def problem(self) -> str | None:
        """What keeps the warm-up from being done, in a sentence (None once done)."""
        if self.done:
            return None
        if self._thread is None:
            return "the index is not loaded (warm-up not started)"
        if self.failure is not None:
            return (
                f"loading the index failed {self.attempts} time(s), last with "
                f"{type(self.failure).__name__}: {self.failure}; trying again"
            )
        return "loading the index"

    def stop(self) -> None:
        """Stop trying again after a failure (the server is stopping); a running attempt finishes.

        A later :meth:`start` starts it again if it has not succeeded.
        """
        self._stopped.set()

    def start(self, then: Callable[[], None] | None = None) -> None:
        """Start the warm-up unless it was started already.

        Args:
            then: Called (in the warm-up's thread) once it has succeeded; at once if it has.
        """
        with self._lock:
            finished = self._done.is_set()
            if then is not None and not finished:
                self._then.append(then)
            stopped = self._thread is not None and not self._thread.is_alive() and not finished
            if self._thread is None or stopped:  # not started, or stopped before it succeeded
                self._stopped.clear()
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        if then is not None and finished:
            then()

    def _run(self) -> None:
        delay = RETRY_FIRST_S
        while True:
            self.attempts += 1
            try:
                self.work()
            except Exception as exc:  # never silently gone: said, kept for readiness, tried again
                self.failure = exc
                log.warning(
                    "replay-sim: the warm-up (index) failed (attempt %d): %s: %s; trying again in %g s",
                    self.attempts,
                    type(exc).__name__,
                    exc,
                    delay,
                    exc_info=exc,
                )
                if self._stopped.wait(delay):
                    return
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            self.failure = None
            break
        with self._lock:
            self._done.set()
            callbacks, self._then = self._then, []
        for callback in callbacks:
            callback()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the warm-up has succeeded (True), or ``timeout`` seconds passed (False)."""
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
