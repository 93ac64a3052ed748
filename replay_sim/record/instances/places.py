"""Places under a sandbox pool's cap: who gets one, and which instance ends to make room.

:class:`Places` is the capacity half of :class:`~replay_sim.record.instances.pool.InstancePool`
(which keeps the instances' books and lifecycle): handing out a warm instance (or one started
from a state snapshot for its caller), starting instances for waiting callers, and — at the cap —
ending a spare warm instance or the least recently used idle one an owner gives back, so no caller
waits while an instance is idle. An owner may have its reclaimed instance's state snapshotted first:
the place is had once it has ended, so the cap holds throughout.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio

from replay_sim.record.config import UpstreamSpec
from replay_sim.record.instances.demand import Demand
from replay_sim.record.instances.instance import Instance
from replay_sim.record.isolation import Isolation

__all__ = ["Keep", "Places", "Reclaim"]

Keep = Callable[[], Awaitable[None]]
"""What an owner does with its reclaimed instance before it is ended (takes a state snapshot of it);
never raises (a failure only means no snapshot, which the owner counts)."""

Reclaim = Callable[[str | None], Instance | tuple[Instance, Keep] | None]
"""``reclaim(server)``: an idle instance (of ``server``, or any) its owner gives back, or None — or
the instance and ``keep``, awaited before it is ended (its owner snapshots its state; its place is
had once that is done)."""


class Places:
    """Capacity: places under ``max_instances`` and who gets them (the pool's state, declared here)."""

    max_instances: int
    _specs: dict[str, UpstreamSpec]
    _warm: dict[str, deque[Instance]]
    _ready: set[Instance]  # started from a snapshot for a caller, not yet handed out
    _live: dict[str, set[Instance]]  # started or starting
    _owned: set[Instance]  # handed out, not ended
    _starting: Counter[str]
    _waiting: Counter[str]
    _seeding: Counter[str]  # callers waiting for a place to start from a snapshot
    _counts: dict[str, Counter[str]]
    _crash_run: Counter[str]
    _evicted: set[Instance]  # being ended to make room
    _demand: Demand

    # The pool's own (it keeps the instances' books):
    def _start(self, server: str, seed: tuple[Any, int] | None = None, *, ahead: bool = False) -> Instance:
        """Start an instance of ``server`` (from the state snapshot ``seed``: its path and uid;
        ``ahead`` of demand: at a lower CPU priority until it is needed)."""
        raise NotImplementedError

    def _refill(self) -> None:
        """Start warm instances as demand asks."""
        raise NotImplementedError

    def _spawn(self, job: Any, instance: Instance) -> None:
        """Run ``job(instance)`` in the pool's task group."""
        raise NotImplementedError

    def _take(self, server: str, mine: list[Instance] | None = None) -> Instance | None:
        """A warm, live instance of ``server`` — or, for a caller starting from a snapshot, ``mine``
        once it has started (never a warm one: that one is at the initial state) — now handed out."""
        warm = deque(self._ready & set(mine)) if mine is not None else self._warm[server]
        while warm:
            instance = warm.popleft()
            self._ready.discard(instance)
            if instance.alive:
                instance.hurry()
                self._crash_run[server] = 0
                self._demand.took(server)
                self._owned.add(instance)
                instance.idle_since = anyio.current_time()
                self._refill()
                return instance
        return None

    def _start_for_waiters(
        self,
        server: str,
        reclaim: Reclaim | None = None,
        seed: Any = None,
        mine: list[Instance] | None = None,
    ) -> None:
        """Start instances for the callers waiting on ``server`` that no starting instance will serve
        (for a caller starting from a snapshot, ``seed``: its own, into ``mine``)."""
        if seed is not None and mine is not None:
            if not mine and self._room(server, reclaim):
                self._seeding[server] -= 1
                mine.append(self._start(server, seed))
            return
        for instance in self._live[server] - self._owned:  # started ahead of demand: a caller needs them
            instance.hurry()
        needed = self._waiting[server] - self._starting[server] - len(self._warm[server])
        for _ in range(needed):
            if not self._room(server, reclaim):
                return
            self._start(server)

    def _room(self, server: str, reclaim: Reclaim | None = None) -> bool:
        """Whether one more instance of ``server`` may start now; if not, make room when one is idle.

        One instance ends per caller no warm or starting instance serves: a spare warm one first,
        else the least recently used idle one ``reclaim`` gives back.
        """
        if self._specs[server].isolation is Isolation.EXCLUSIVE and self._live[server]:
            if reclaim is not None and not any(i.server == server for i in self._evicted):
                given = reclaim(server)
                if given is not None:
                    self._end_to_make_room(*_kept(given), reclaimed=True)
            return False
        if self._total() < self.max_instances:
            return True
        if len(self._evicted) < self._unserved():
            for other, warm in self._warm.items():
                if warm and len(warm) > self._waiting[other]:
                    self._end_to_make_room(warm.pop(), reclaimed=False)
                    return False
            given = None if reclaim is None else reclaim(None)
            if given is not None:
                self._end_to_make_room(*_kept(given), reclaimed=True)
        return False

    def _end_to_make_room(self, instance: Instance, keep: Keep | None = None, *, reclaimed: bool) -> None:
        """End ``instance`` (a spare warm one, or one given back, after its owner's ``keep``): a
        waiting caller gets its place once it has ended (it counts as live until then)."""
        if reclaimed:
            self._owned.discard(instance)
            self._counts[instance.server]["reclaimed"] += 1
        self._evicted.add(instance)
        self._spawn(Instance.close if keep is None else partial(_end_after, keep), instance)

    def _unserved(self) -> int:
        """Callers waiting that no warm or starting instance will serve: a place freed goes to them first."""
        return sum(
            max(0, waiting - self._starting[server] - len(self._warm[server]))
            for server, waiting in self._waiting.items()
        ) + sum(self._seeding.values())

    def _total(self) -> int:
        return sum(len(live) for live in self._live.values())


def _kept(given: Instance | tuple[Instance, Keep]) -> tuple[Instance, Keep | None]:
    """What ``reclaim`` gave: the instance, and what to await before it is ended (None: nothing)."""
    return given if isinstance(given, tuple) else (given, None)


async def _end_after(keep: Keep, instance: Instance) -> None:
    """End a reclaimed instance once its owner's ``keep`` is done."""
    try:
        await keep()
    finally:
        await instance.close()
