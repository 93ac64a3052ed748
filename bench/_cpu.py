"""CPU seconds of a process and of the processes it starts, for benchmarks that split a run's CPU.

A sandbox instance does not stay the replay's child to the end: confined, it runs under ``unshare``,
and when that is killed the instance is reparented and reaped elsewhere, so the replay's
``cutime`` never counts it. :class:`Descendants` therefore samples every live descendant of a
process every 50 ms and keeps the last CPU seen of each (its own and its reaped children's, so a
confinement script's programs count with the instance they started), less what a descendant
already alive when sampling began had used by then (a warm instance started before a pass does not
count its start in that pass). An instance's last < 50 ms are missed, and a short-lived child seen
alive and then in its parent's count counts twice: both are small beside a start.

The sampler is a process of its own (``python -m bench._cpu ROOT INTERVAL``), walking only the
root's tree (``/proc/PID/task/TID/children``): run as a thread of the benchmark it held the
benchmark's GIL while it read every process of the machine, and counted as the benchmark's
client CPU — 6 ms per episode of a second pass at 1,024 episodes, a third of the client's own.
"""

from __future__ import annotations

import os
import resource
import select
import subprocess
import sys
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
    """Samples the CPU of ``root``'s live descendants (in a process of its own) until :meth:`stop`."""

    def __init__(self, root: int, interval: float = 0.05) -> None:
        self._sampler = subprocess.Popen(
            [sys.executable, "-m", "bench._cpu", str(root), str(interval)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parent.parent,
            text=True,
        )
        assert self._sampler.stdout is not None
        self._sampler.stdout.readline()  # its baseline is taken: what runs from now on counts

    def stop(self) -> float:
        """Stop sampling; the CPU seconds of every descendant seen."""
        out, _ = self._sampler.communicate()  # closing its stdin stops it
        return float(out)


def _children(pid: int) -> list[int]:
    """``pid``'s live children (of each of its threads)."""
    kids: list[int] = []
    try:
        for task in os.scandir(f"/proc/{pid}/task"):
            with open(f"{task.path}/children") as f:
                kids += map(int, f.read().split())
    except OSError:
        pass  # ended meanwhile
    return kids


def _sample(root: int, seen: dict[tuple[int, str], float]) -> None:
    """Note the CPU (own and reaped children's) of each live descendant of ``root`` in ``seen``."""
    stack = _children(root)
    while stack:
        pid = stack.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        seen[(pid, fields[19])] = sum(int(f) for f in fields[11:15]) / _TICK
        stack += _children(pid)


def _main(root: int, interval: float) -> None:
    """Sample until stdin closes; print the total used meanwhile."""
    before: dict[tuple[int, str], float] = {}  # what the descendants alive now have used so far
    _sample(root, before)
    print("ready", flush=True)
    seen: dict[tuple[int, str], float] = {}  # (pid, start time) -> CPU seconds, last seen
    while not select.select([sys.stdin], [], [], interval)[0]:
        _sample(root, seen)
    print(sum(seconds - before.get(key, 0.0) for key, seconds in seen.items()))


if __name__ == "__main__":
    _main(int(sys.argv[1]), float(sys.argv[2]))
