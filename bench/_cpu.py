"""CPU seconds of a process and of the processes it starts, for benchmarks that split a run's CPU.

A sandbox instance does not stay the replay's child to the end: confined, it runs under ``unshare``,
and when that is killed the instance is reparented and reaped elsewhere, so the replay's
``cutime`` never counts it. :class:`Descendants` therefore samples every live descendant of a
process every 50 ms and keeps the last CPU seen of each (its own and its reaped children's, so a
confinement script's programs count with the instance they started). An instance's last < 50 ms
are missed, and a short-lived child seen alive and then in its parent's count counts twice: both
are small beside a start.
"""

from __future__ import annotations

import os
import resource
import threading
from pathlib import Path

__all__ = ["Descendants", "own_cpu", "process_cpu"]

_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds one process has used itself (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def own_cpu() -> tuple[float, float]:
    """``(this process, its waited-for children)``: CPU seconds so far."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime


class Descendants:
    """Samples the CPU of ``root``'s live descendants until :meth:`stop`; :meth:`total` sums them."""

    def __init__(self, root: int, interval: float = 0.05) -> None:
        self.root = root
        self._seen: dict[tuple[int, str], float] = {}  # (pid, start time) -> CPU seconds, last seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def stop(self) -> float:
        """Stop sampling; the total."""
        self._stop.set()
        self._thread.join()
        return self.total()

    def total(self) -> float:
        """CPU seconds of every descendant seen (processes: :attr:`count`)."""
        return sum(self._seen.values())

    @property
    def count(self) -> int:
        """Descendants seen."""
        return len(self._seen)

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            children: dict[int, list[int]] = {}
            used: dict[int, tuple[str, float]] = {}
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue  # ended meanwhile
                pid = int(entry.name)
                children.setdefault(int(fields[1]), []).append(pid)
                used[pid] = (fields[19], sum(int(f) for f in fields[11:15]) / _TICK)
            stack = list(children.get(self.root, ()))
            while stack:
                pid = stack.pop()
                if pid in used:
                    started, seconds = used[pid]
                    self._seen[(pid, started)] = seconds
                stack += children.get(pid, ())
