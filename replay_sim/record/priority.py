"""The CPU priority of a server process started ahead of demand: lowered until somebody needs it.

A sandbox pool starts instances before any episode asks for them (:mod:`~replay_sim.record.
instances.demand`). Such a start — a Node.js server's is ~0.25 s of CPU — competes with the
answers of the episodes running meanwhile, and at the end of a burst nobody may take the
instances at all. So an instance started ahead of demand runs its start at a lower priority
(:data:`AHEAD`, a ``nice`` value; the kernel then gives it ~1/10 of a contended core), and is
raised to the normal priority once an episode takes it or a caller waits for it.

Raising a priority again takes ``CAP_SYS_NICE`` (root, as confined instances are run): without
it, nothing is lowered (:func:`raisable`). The priority is set on the process group the server
leads (its own, as :func:`~replay_sim.record.spawn.spawn` starts it), which covers every thread
and child it has by then; later ones inherit it.
"""

from __future__ import annotations

import functools
import os
import threading
from contextlib import suppress

__all__ = ["AHEAD", "Priority", "raisable"]

AHEAD = 10
"""The ``nice`` value of a start ahead of demand (0 is the normal priority, 19 the lowest)."""

_CAP_SYS_NICE = 23


@functools.cache
def raisable() -> bool:
    """Whether this process may raise a lowered priority again (it holds ``CAP_SYS_NICE``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            effective = next(line for line in status if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return False
    return bool(int(effective.split()[1], 16) >> _CAP_SYS_NICE & 1)


class Priority:
    """One server's CPU priority: ``niceness`` from its start until :meth:`restore`.

    :meth:`started` runs in the thread that started the process, :meth:`restore` in the event
    loop's: whichever comes second applies the priority, so a start raised before its process
    existed is never left lowered.
    """

    def __init__(self, niceness: int = 0) -> None:
        self._niceness = niceness if niceness and raisable() else 0
        self._group: int | None = None
        self._lock = threading.Lock()

    @property
    def lowered(self) -> bool:
        """Whether it runs (or will start) below the normal priority."""
        return bool(self._niceness)

    def started(self, group: int) -> None:
        """Its process (leading process group ``group``) has just started: lower it, if it still is."""
        with self._lock:
            self._group = group
            if self._niceness:
                _set(group, self._niceness)

    def restore(self) -> None:
        """Run it at the normal priority from now on (idempotent)."""
        with self._lock:
            if not self._niceness:
                return
            self._niceness = 0
            if self._group is not None:
                _set(self._group, 0)


def _set(group: int, niceness: int) -> None:
    with suppress(ProcessLookupError, PermissionError):  # gone already, or a group of nobody's
        os.setpriority(os.PRIO_PGRP, group, niceness)
