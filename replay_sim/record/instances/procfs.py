"""What Linux's /proc says about processes: an instance's resident memory, and whether a process lives on.

An instance runs as its own process group (its launcher's pid is the group id), so the memory an
instance holds is the sum of the resident sets of the processes in that group, children included.
A process is told from a later one with its pid by its start time.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Collection
from pathlib import Path

__all__ = ["CpuBudget", "group_rss", "started_at"]

_PROC = Path("/proc")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def group_rss(groups: Collection[int]) -> dict[int, int]:
    """Resident memory in bytes of the processes in each of ``groups`` (process group ids).

    One pass over /proc. A group with no process left is absent; so is everything where /proc is
    not Linux's (then the caller reports memory as unknown).
    """
    wanted = set(groups)
    totals: dict[int, int] = {}
    if not wanted or not _PROC.is_dir():
        return totals
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        # After the command name in parentheses (which may itself hold spaces and parentheses):
        # state ppid pgrp session ... and the resident set in pages is the 22nd field from there.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 22:
            continue
        group = int(fields[2])
        if group in wanted:
            totals[group] = totals.get(group, 0) + int(fields[21]) * _PAGE
    return totals


def started_at(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, as text), None when there is none."""
    try:
        stat = Path(_PROC, str(pid), "stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[19].decode() if len(fields) > 19 else None


class CpuBudget:
    """A confined instance's CPU time per call (``RLIMIT_CPU``), armed again before each call.

    The server is its launcher's child (``unshare --fork``: process 1 of its PID namespace). It is
    found once, and its ``stat`` file kept open: arming reads how much CPU it has used and sets the
    limit to that plus ``seconds`` (SIGXCPU, which ends it, past that) — a read and a system call,
    where finding the server and opening its file each time cost a busy event loop ~150 µs a call.
    """

    def __init__(self, launcher: int, seconds: int) -> None:
        self.launcher = launcher
        self.seconds = seconds
        self._stat: int | None = None  # the server's /proc/PID/stat, open
        self._pid = 0

    def arm(self) -> bool:
        """Let the server use :attr:`seconds` more CPU time, and no more. Returns whether it was set
        (False: no such process, or not Linux)."""
        try:
            if self._stat is None:
                children = Path(_PROC, str(self.launcher), "task", str(self.launcher), "children").read_text()
                self._pid = int(children.split()[0])
                self._stat = os.open(Path(_PROC, str(self._pid), "stat"), os.O_RDONLY)
            stat = os.pread(self._stat, 4096, 0)  # fails once the process is gone: no other one is limited
            fields = stat[stat.rfind(b")") + 2 :].split()
            used = (int(fields[11]) + int(fields[12])) // _TICK + 1
            resource.prlimit(self._pid, resource.RLIMIT_CPU, (used + self.seconds, used + self.seconds + 1))
        except (OSError, IndexError, ValueError):
            return False
        return True

    def close(self) -> None:
        """Close the server's file; idempotent."""
        stat, self._stat = self._stat, None
        if stat is not None:
            os.close(stat)
