"""A sandbox instance's pinned clock: libfaketime, started at the time its recordings were made.

A server that stamps time (a git commit's hash, file times, "created at") answers a re-played call
as it was recorded only if its clock reads what it read then. An instance of a server whose config
keeps ``clock = "recorded"`` (the default) runs with Debian's libfaketime preloaded (``LD_PRELOAD``)
and a clock that reads ``clock_start`` when the instance starts and advances as real time does:

- ``FAKETIME`` is an offset from real time (``"+N"`` / ``"-N"`` seconds), fixed when the instance is
  launched, so every process it starts (which inherits the environment) reads the same clock —
  libfaketime's ``@start`` form would restart the clock in each child unless told not to;
- ``FAKETIME_DONT_FAKE_MONOTONIC=1``: monotonic clocks stay real, so event loops and timeouts work;
- ``FAKETIME_DONT_RESET=1`` for good measure, should a start form ever be used.

libfaketime does not reach statically linked programs (Go binaries): they read the host's clock.
:func:`recordings_began` reads when a session's recordings (or a server's) began from a store.
"""

from __future__ import annotations

import functools
import glob
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replay_sim.store import Store

__all__ = ["FAKETIME_GLOB", "clock_env", "faketime_library", "recordings_began"]

FAKETIME_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"
"""Where Debian's libfaketime package puts the library (``apt-get install libfaketime``)."""


@functools.cache
def faketime_library() -> str | None:
    """The path of libfaketime here, or None when it is not installed."""
    found = sorted(glob.glob(FAKETIME_GLOB)) or sorted(glob.glob("/usr/local/lib/faketime/libfaketime.so.1"))
    return found[0] if found else None


def clock_env(start: datetime, *, now: datetime | None = None) -> dict[str, str]:
    """Environment variables that make a process's clock read ``start`` now and advance in real time.

    Args:
        start: What the clock reads at launch (a naive time is taken as UTC).
        now: The real time of the launch (default: now).

    Raises:
        FileNotFoundError: libfaketime is not installed here.
    """
    library = faketime_library()
    if library is None:
        raise FileNotFoundError(f"libfaketime not found ({FAKETIME_GLOB}): apt-get install libfaketime")
    start = start if start.tzinfo is not None else start.replace(tzinfo=UTC)
    offset = round((start - (now or datetime.now(UTC))).total_seconds())
    return {
        "LD_PRELOAD": library,
        "FAKETIME": f"{offset:+d}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_DONT_RESET": "1",
    }


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
    when = datetime.fromisoformat(first[0].recorded_at)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
