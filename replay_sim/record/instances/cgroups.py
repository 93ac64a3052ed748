"""Control groups that hold one sandbox instance's memory and process count to its limits.

An instance's launch script joins the groups made here before it does anything else, so every
process it ever starts is counted; the kernel ends the instance's largest process when the group's
memory is exhausted (an out-of-memory kill: the instance is lost) and refuses a ``fork`` past its
``pids`` limit. Both cgroup v1 (one hierarchy per controller, ``memory`` and ``pids``) and v2 (one
unified hierarchy with both controllers enabled) are used as the machine offers them.
"""

from __future__ import annotations

import os
from contextlib import suppress
from pathlib import Path

__all__ = ["CGROUP_ROOT", "cgroup_problem", "make_cgroups", "remove_cgroups", "stale_cgroups"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
_OURS = "replay-sim"


def _v1() -> bool:
    return all((CGROUP_ROOT / c / "cgroup.procs").exists() for c in ("memory", "pids"))


def _parents() -> list[Path]:
    """The directories our instance groups are made in (one per v1 controller, or the one v2 tree)."""
    if _v1():
        return [CGROUP_ROOT / "memory" / _OURS, CGROUP_ROOT / "pids" / _OURS]
    return [CGROUP_ROOT / _OURS]


def cgroup_problem() -> str | None:
    """Why instance groups cannot be made here (one line), or None when they can."""
    if not _v1():
        controllers = CGROUP_ROOT / "cgroup.controllers"
        if not controllers.exists():
            return "no cgroup hierarchy with the memory and pids controllers at /sys/fs/cgroup"
        missing = {"memory", "pids"} - set(controllers.read_text().split())
        if missing:
            return f"the cgroup v2 hierarchy lacks the {' and '.join(sorted(missing))} controller"
    probe = f"probe-{os.getpid()}"
    try:
        for group in make_cgroups(probe, memory_bytes=64 << 20, processes=8):
            group.rmdir()
    except OSError as exc:
        return f"cannot make control groups under {CGROUP_ROOT} ({exc.strerror or exc}): run as root"
    return None


def make_cgroups(name: str, *, memory_bytes: int, processes: int) -> list[Path]:
    """Make instance ``name``'s groups with its limits; their directories (whose ``cgroup.procs`` to join).

    Raises:
        OSError: A group could not be made or limited.
    """
    made: list[Path] = []
    try:
        for parent in _parents():
            if not parent.exists():
                parent.mkdir(exist_ok=True)
                if not _v1():  # v2: the controllers must be enabled down to our groups
                    for level in (CGROUP_ROOT, parent):
                        (level / "cgroup.subtree_control").write_text("+memory +pids")
            group = parent / name
            group.mkdir(exist_ok=True)
            made.append(group)
            _limit(group, memory_bytes, processes)
    except OSError:
        remove_cgroups(made)
        raise
    return made


def _limit(group: Path, memory_bytes: int, processes: int) -> None:
    """Write the limits a group's controller understands (v1: one controller per group; v2: both)."""
    settings = {
        "memory.limit_in_bytes": memory_bytes,  # v1
        "memory.memsw.limit_in_bytes": memory_bytes,  # v1 with swap accounting: swap is no escape
        "memory.max": memory_bytes,  # v2
        "memory.swap.max": 0,  # v2
        "pids.max": processes,
    }
    for file, value in settings.items():
        path = group / file
        if path.exists():
            path.write_text(str(value))


def remove_cgroups(groups: list[Path]) -> list[Path]:
    """Remove groups whose processes have ended; the ones still busy (to retry later) are returned."""
    busy = []
    for group in groups:
        try:
            group.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            busy.append(group)
    return busy


def stale_cgroups() -> int:
    """Remove the empty groups of replays that are gone (killed before they could); how many.

    A group is named ``<replay pid>-<instance id>``: one of a replay still running is left alone.
    """
    removed = 0
    for parent in _parents():
        with suppress(OSError):
            for group in parent.iterdir():
                owner = group.name.partition("-")[0]
                if owner.isdigit() and Path("/proc", owner).exists():
                    continue
                if group.is_dir() and not remove_cgroups([group]):
                    removed += 1
    return removed
