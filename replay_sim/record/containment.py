"""How a sandbox instance is contained: its network, its clock and its limits, as a recorder config says.

Every sandbox instance runs confined (:mod:`replay_sim.record.instances.confine`): the host's
filesystem read-only under a private copy-on-write layer, no network, no privileges, its own process
table, and the limits of :class:`Limits`. A server's table in the recorder config may loosen or
tighten that per server::

    [servers.git]
    command = "mcp-server-git"
    sandbox = true
    network = false          # default: its own network namespace, loopback only
    clock = "recorded"       # default: a clock that starts when its recordings were made ("real": the host's)
    memory_mb = 1024         # limits (defaults below)
    processes = 256
    cpu_seconds = 60         # CPU time per call
    open_files = 1024
    layer_mb = 512           # bytes it may write to its copy-on-write layer (and /tmp)
    answer_mb = 32           # bytes per line it writes on stdout (an answer is one line)
    stderr_mb = 16           # bytes it may write on stderr (and the largest file it may write)

:func:`containment_keys` checks those keys; each mistake is one line naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from replay_sim.errors import ConfigError

__all__ = ["CONTAINMENT_KEYS", "Clock", "Containment", "Limits", "containment_keys"]

_MB = 1 << 20


class Clock(StrEnum):
    """Which clock a sandbox instance reads."""

    RECORDED = "recorded"
    """A pinned clock (libfaketime) that starts at the time its recordings were made and advances as
    real time does, so a server that stamps time re-plays identically."""
    REAL = "real"
    """The host's clock."""


@dataclass(frozen=True)
class Limits:
    """What one sandbox instance may use; going over any ends it (its episode is lost), bar none.

    Attributes:
        memory_bytes: Memory of its process tree (a memory cgroup: the kernel ends it on overflow).
        processes: Processes and threads of its tree (a pids cgroup, and ``RLIMIT_NPROC`` for its uid).
        cpu_seconds: CPU time one call may take (``RLIMIT_CPU``, re-armed before each call).
        open_files: Open files per process (``RLIMIT_NOFILE``).
        layer_bytes: Bytes it may write to its copy-on-write layer and private ``/tmp`` (a tmpfs).
        answer_bytes: Bytes per line of its stdout; an answer is one line.
        stderr_bytes: Bytes it may write to its stderr, and the largest file it may write
            (``RLIMIT_FSIZE``).
    """

    memory_bytes: int = 1024 * _MB
    processes: int = 256
    cpu_seconds: int = 60
    open_files: int = 1024
    layer_bytes: int = 512 * _MB
    answer_bytes: int = 32 * _MB
    stderr_bytes: int = 16 * _MB


@dataclass(frozen=True)
class Containment:
    """A sandbox's containment settings.

    Attributes:
        network: Whether it shares the host's network (default: loopback of its own only).
        clock: Which clock it reads (:class:`Clock`).
        limits: What it may use (:class:`Limits`).
    """

    network: bool = False
    clock: Clock = Clock.RECORDED
    limits: Limits = field(default_factory=Limits)


_LIMIT_KEYS = {
    "memory_mb": ("memory_bytes", _MB),
    "processes": ("processes", 1),
    "cpu_seconds": ("cpu_seconds", 1),
    "open_files": ("open_files", 1),
    "layer_mb": ("layer_bytes", _MB),
    "answer_mb": ("answer_bytes", _MB),
    "stderr_mb": ("stderr_bytes", _MB),
}
CONTAINMENT_KEYS = frozenset({"network", "clock", *_LIMIT_KEYS})
"""The recorder config keys of a server's table that :func:`containment_keys` reads."""


def containment_keys(entry: dict[str, Any], where: str, *, sandbox: bool) -> dict[str, Any]:
    """The ``containment`` field of a server's spec from its table (empty when no key is given).

    Raises:
        ConfigError: A key is given to a server that is not a sandbox, or has a wrong value (names it).
    """
    given = sorted(CONTAINMENT_KEYS & set(entry))
    if not given:
        return {}
    if not sandbox:
        raise ConfigError(f"{where}: {given[0]!r} applies to a sandbox instance: add sandbox = true")
    network = entry.get("network", False)
    if not isinstance(network, bool):
        raise ConfigError(f"{where}: 'network' must be true or false")
    clock = entry.get("clock", Clock.RECORDED.value)
    if clock not in {c.value for c in Clock}:
        raise ConfigError(f'{where}: \'clock\' must be "recorded" or "real", got {clock!r}')
    limits: dict[str, int] = {}
    for key, (attribute, unit) in _LIMIT_KEYS.items():
        if key not in entry:
            continue
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise ConfigError(f"{where}: {key!r} must be a positive number, not {value!r}")
        limits[attribute] = max(1, int(value * unit))
    return {"containment": Containment(network, Clock(clock), Limits(**limits))}
