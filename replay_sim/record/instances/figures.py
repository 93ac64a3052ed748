"""What an instance pool shows of itself (``/api/stats``, the dashboard, ``/metrics``): its figures."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any

from replay_sim.record.config import UpstreamSpec
from replay_sim.record.instances.instance import Instance
from replay_sim.record.instances.procfs import group_rss
from replay_sim.record.instances.workspace import Launcher

__all__ = ["pool_figures"]


def pool_figures(
    specs: Mapping[str, UpstreamSpec],
    live: Mapping[str, Collection[Instance]],
    warm: Mapping[str, Collection[Instance]],
    starting: Counter[str],
    counts: Mapping[str, Counter[str]],
    failure: Mapping[str, str],
    launcher: Launcher | None,
) -> dict[str, Any]:
    """Per server: isolation, live/warm/in-use/starting instances, counters, memory and pid per instance.

    Counters: ``started``, ``ended`` (by their owner or the pool), ``expired`` (``idle_timeout``),
    ``reclaimed`` (given back idle to make room), ``crashed`` (ended unasked), ``failed``.
    """
    # Read from a thread (the stats endpoint) while the event loop adds and ends instances: copies,
    # each taken at once (a set or deque copied by tuple() is not changed meanwhile).
    live = {server: tuple(instances) for server, instances in tuple(live.items())}
    warm = {server: tuple(queue) for server, queue in tuple(warm.items())}
    running = [i for instances in live.values() for i in instances if i.pid is not None and i.alive]
    memory = group_rss([i.pid for i in running if i.pid is not None])
    out: dict[str, Any] = {}
    for server, spec in specs.items():
        alive = [i for i in live.get(server, ()) if i.alive]
        counted = counts[server]
        out[server] = {
            "isolation": str(spec.isolation),
            "live": len(alive),
            "warm": len(warm.get(server, ())),
            "in_use": len(alive) - sum(1 for i in warm.get(server, ()) if i.alive),
            "starting": starting[server],
            "started": counted["started"],
            "ended": counted["ended"],
            "expired": counted["expired"],
            "reclaimed": counted["reclaimed"],
            "crashed": counted["crashed"],
            "failed": counted["failed"],
            "last_failure": failure.get(server),
            "memory_bytes": {i.id: memory.get(i.pid) for i in alive if i.pid is not None},
            "pids": {i.id: i.pid for i in alive if i.pid is not None},
            "parent_death_signal": bool(launcher and launcher.parent_death),
            "confined": bool(launcher and launcher.confined),
        }
    return out
