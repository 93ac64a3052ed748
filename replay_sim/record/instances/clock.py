"""A sandbox instance's pinned clock: libfaketime, set before each call to that call's recorded time.

A server that stamps time (a git commit's hash, file times, "created at") answers a re-played call
as it was recorded only if its clock reads what it read then. An instance of a server whose config
keeps ``clock = "recorded"`` (the default) runs with Debian's libfaketime preloaded (``LD_PRELOAD``)
and its clock read from a *timestamp file* in its workspace (:class:`ClockFile`):

- ``FAKETIME_TIMESTAMP_FILE`` names the file; it holds an absolute time, seconds since the epoch
  to the microsecond (``FAKETIME_FMT=%s``: read the same whatever the instance's time zone). Before
  each call the instance rewrites it (:meth:`ClockFile.set`), and the clock **stands at that time
  for the whole call**: what a server stamps does not depend on how long it took to read its clock
  (a loaded machine re-plays a commit with the hash it was recorded with), and a sub-second stamp
  re-plays to the microsecond. Every process the server starts inherits the environment and reads
  the same file, so a ``git`` child stamps with the same clock;
- ``FAKETIME_NO_CACHE=1``: the file is read at every clock read (libfaketime otherwise caches it for
  10 s, and its finest cache duration, 1 s, is longer than the gap between two calls);
- ``FAKETIME`` stays unset: it would take priority over the file;
- ``FAKETIME_DONT_FAKE_MONOTONIC=1``: monotonic clocks stay real, so event loops, timers and
  timeouts run (asyncio, Node's timers, ``select``, a thread's timed wait).

Known limits (libfaketime 0.9.10, Debian's): Python 3.11+'s ``time.sleep`` fails with ``EINVAL``
under it (libfaketime issue #426: its ``clock_nanosleep`` mishandles an absolute monotonic deadline
it is told not to fake), and a server that waits for the *wall* clock to pass a time waits until its
call limit, since that clock stands still during a call; such a server takes ``clock = "real"``.
libfaketime does not reach statically linked programs (Go binaries): they read the host's clock.
The file is replaced whole (written aside, then renamed), so a clock read never sees half a line;
a confined instance sees its directory read-only (:mod:`.confine`).
:func:`recordings_began` reads when a session's recordings (or a server's) began from a store.
"""

from __future__ import annotations

import functools
import glob
import os
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replay_sim.store import Store

__all__ = ["FAKETIME_GLOB", "ClockFile", "clock_env", "clock_line", "faketime_library", "recordings_began"]

FAKETIME_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"
"""Where Debian's libfaketime package puts the library (``apt-get install libfaketime``)."""


@functools.cache
def faketime_library() -> str | None:
    """The path of libfaketime here, or None when it is not installed."""
    found = sorted(glob.glob(FAKETIME_GLOB)) or sorted(glob.glob("/usr/local/lib/faketime/libfaketime.so.1"))
    return found[0] if found else None


def utc(when: datetime) -> datetime:
    """``when`` with a time zone (a naive time is taken as UTC)."""
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def clock_line(at: datetime) -> str:
    """The timestamp file's line that makes a clock stand at ``at`` (a naive time is taken as UTC)."""
    return f"{utc(at).timestamp():.6f}\n"  # seconds since the epoch (FAKETIME_FMT=%s), to the microsecond


def clock_env(file: Path) -> dict[str, str]:
    """Environment variables that make a process's clock follow the timestamp file ``file``.

    Raises:
        FileNotFoundError: libfaketime is not installed here.
    """
    library = faketime_library()
    if library is None:
        raise FileNotFoundError(f"libfaketime not found ({FAKETIME_GLOB}): apt-get install libfaketime")
    return {
        "LD_PRELOAD": library,
        "FAKETIME_TIMESTAMP_FILE": str(file),
        "FAKETIME_FMT": "%s",
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_DONT_RESET": "1",
    }


class ClockFile:
    """One instance's timestamp file: the time its clock stands at, set before each call.

    Args:
        path: The file (its directory exists; only this replay writes in it).
        start: What the clock reads once made, until the first :meth:`set`.
    """

    def __init__(self, path: Path, start: datetime) -> None:
        self.path = path
        self.at = utc(start)
        """What its clock reads (or will once a :meth:`set_ahead` under way is written)."""
        self._ahead: Future[None] | None = None
        self._stale = False  # a write ahead failed: the file may not read `at`
        self._write(self.at)

    def now(self) -> datetime:
        """What its clock reads now."""
        return self.at

    def set(self, at: datetime) -> None:
        """Make the clock read ``at`` from now until the next :meth:`set` (atomic replace); nothing
        is written when it reads ``at`` already (set ahead)."""
        self._settle()
        at = utc(at)
        if at == self.at and not self._stale:
            return
        self.at = at
        self._write(at)

    def set_ahead(self, at: datetime) -> None:
        """Make the clock read ``at`` soon, the file written in a worker thread: a call about to be
        sent at ``at`` finds it set, and whoever waits for an answer does not wait for the write."""
        self._settle()
        self.at = utc(at)
        self._ahead = _writer().submit(self._write, self.at)

    def _settle(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            try:
                ahead.result()
                self._stale = False
            except OSError:
                self._stale = True

    def _write(self, at: datetime) -> None:
        aside = self.path.with_name(f".{self.path.name}.new")
        aside.write_text(clock_line(at))
        os.chmod(aside, 0o644)
        os.replace(aside, self.path)
        self._stale = False


@functools.cache
def _writer() -> ThreadPoolExecutor:
    """The one thread that writes clocks ahead (made on first use)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-clock")


def recordings_began(
    store: Store, *, session: str | None = None, server: str | None = None
) -> datetime | None:
    """When the first call of a session (or of a server's recordings) was recorded; None when none was.

    Args:
        store: The store the recordings are in.
        session: A session id.
        server: A server name (its earliest recording of any session) when ``session`` is None.
    """
    if session is None and server is None:
        raise ValueError("recordings_began needs a session or a server")
    first = store.recordings(server, session=session, limit=1)
    if not first:
        return None
    return utc(datetime.fromisoformat(first[0].recorded_at))
