"""A pool of sandbox instances: warm ones ready per server, a cap on live ones, and acquire with a bound.

:class:`InstancePool` is what the replay's ``sandbox`` miss policy calls a ``SandboxPool``. It keeps
``pool`` started instances ready for each sandbox server of a recorder config (started in the
background, refilled as they are taken, replaced when one dies), never more than ``max_instances``
live instances across servers (warm ones included: a warm instance of another server is ended to
make room), and an ``exclusive`` server (:class:`~replay_sim.record.config.Isolation`) at one live
instance at a time. :meth:`InstancePool.acquire` hands each instance to one caller only, or raises
:class:`~replay_sim.errors.SandboxUnavailable` within its timeout saying why: the cap reached and
what to raise, the server's start failure with its stderr tail, the exclusive server busy.

At the cap a caller does not wait while an instance is idle: a spare warm one is ended, else the
least recently used idle one its owner gives back (``reclaim``; :meth:`InstancePool.wake` when one
turns idle). Warm instances follow demand (:class:`~replay_sim.record.instances.demand.Demand`).

Use it as an async context manager around serving: its instances live in its task group.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Self

import anyio
import anyio.abc

from replay_sim.errors import SandboxUnavailable, UpstreamError
from replay_sim.record.config import DEFAULT_MAX_INSTANCES, DEFAULT_POOL, RecorderConfig, UpstreamSpec
from replay_sim.record.containment import Clock
from replay_sim.record.instances.confine import Placement, instance_uids
from replay_sim.record.instances.demand import Demand
from replay_sim.record.instances.expiry import end_idle, expire_idle
from replay_sim.record.instances.figures import pool_figures
from replay_sim.record.instances.fingerprint import fingerprint_detail, sandbox_fingerprint
from replay_sim.record.instances.instance import Instance
from replay_sim.record.instances.places import Places, Reclaim
from replay_sim.record.instances.snapshots import StateSnapshots
from replay_sim.record.instances.unavailable import served, why_unavailable
from replay_sim.record.instances.workspace import Launcher, sweep
from replay_sim.record.isolation import Isolation

__all__ = ["DEFAULT_MAX_INSTANCES", "DEFAULT_POOL", "InstancePool"]

_CRASH_LOOP = 3
"""Warm instances of a server that may die unasked in a row before the pool stops refilling it."""


class InstancePool(Places):
    """Warm, capped instances of a recorder config's sandbox servers (a ``SandboxPool``).

    Args:
        config: The recorder config: its servers with ``sandbox = true`` are served, each with its
            isolation; answers are redacted with its rules.
        pool: Warm instances kept ready per server (0: start each on demand).
        max_instances: Live instances at most, across servers, warm ones included.
        idle_timeout: Seconds a handed-out instance may go without a call before the pool ends it
            (its owner's next call gets :class:`~replay_sim.errors.InstanceLost`), so an owner that
            never closes its instance does not hold a place under the cap for ever (None: never).
        servers: The sandbox servers to serve (default: all of them).
        capabilities: Client capabilities declared to each server at ``initialize`` (wire JSON).
        base: Where instance directories are made (default: the system's temporary directory).
        unconfined: Run instances unconfined (``--unconfined-sandboxes``): the explicit opt-out
            where the kernel refuses confinement (:mod:`.confine`); otherwise entering the pool
            fails with :class:`~replay_sim.errors.SandboxUnavailable` there.
        hidden: Paths no instance may see (the store's directory, the index's, the config file).
        clocks: Per server, when its recordings began: its instances' clocks start there
            (``clock = "recorded"``; a server not named reads the host's clock).
        recorded: Per server, the paths under ``/tmp`` its recorded calls name (shown to its instances).
        snapshots: Its instances' state snapshots and their bounds (default: :class:`StateSnapshots`'s);
            deleted when the pool closes. Confined instances only.

    Raises:
        ConfigError: A named server is not a sandbox of the config, or a count is out of range.
    """

    def __init__(
        self,
        config: RecorderConfig,
        *,
        pool: int = DEFAULT_POOL,
        max_instances: int = DEFAULT_MAX_INSTANCES,
        idle_timeout: float | None = None,
        servers: Iterable[str] | None = None,
        capabilities: Mapping[str, Any] | None = None,
        base: str | Path | None = None,
        unconfined: bool = False,
        hidden: Iterable[str | Path] = (),
        clocks: Mapping[str, datetime] | None = None,
        recorded: Mapping[str, tuple[str, ...]] | None = None,
        snapshots: StateSnapshots | None = None,
    ) -> None:
        self._specs: dict[str, UpstreamSpec] = served(config, servers, pool, max_instances, idle_timeout)
        self.config = config
        self.pool = pool
        self.max_instances = max_instances
        self.idle_timeout = idle_timeout
        self._capabilities = dict(capabilities or {})
        self._base = None if base is None else Path(base)
        self._launcher: Launcher | None = None
        self.unconfined = unconfined
        self._hidden = tuple(str(p) for p in hidden)
        self._clocks = {k: v for k, v in (clocks or {}).items() if self._specs.get(k) is not None}
        self._recorded = dict(recorded or {})
        self._uids = instance_uids()
        self.snapshots = snapshots or StateSnapshots(base=self._base)
        self._warm: dict[str, deque[Instance]] = {name: deque() for name in self._specs}
        self._ready: set[Instance] = set()  # started from a snapshot for a caller, not yet handed out
        self._live: dict[str, set[Instance]] = {name: set() for name in self._specs}  # started or starting
        self._owned: set[Instance] = set()  # handed out, not ended
        self._starting: Counter[str] = Counter()
        self._waiting: Counter[str] = Counter()
        self._seeding: Counter[str] = Counter()  # callers waiting for a place to start from a snapshot
        self._counts: dict[str, Counter[str]] = {name: Counter() for name in self._specs}
        self._failure: dict[str, str] = {}
        self._crash_run: Counter[str] = Counter()
        self._evicted: set[Instance] = set()  # being ended to make room
        self._demand = Demand()
        self._ids = itertools.count(1)
        self._changed = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        launcher = (await anyio.to_thread.run_sync(Launcher.detect)).opted_out(self.unconfined)
        pinned = any(self._specs[s].containment.clock is Clock.RECORDED for s in self._clocks)
        launcher.require(clocks=pinned)  # one line naming what is missing, before any instance
        self._launcher = launcher
        exclusive = {s for s, spec in self._specs.items() if spec.isolation is Isolation.EXCLUSIVE}
        self.snapshots.servers = frozenset(self._specs.keys() - exclusive if launcher.confined else ())
        self.snapshots.base = self.snapshots.base or self._base  # hidden from instances with theirs
        await anyio.to_thread.run_sync(sweep, self._base)  # what replays killed outright left behind
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        if self.idle_timeout is not None:
            expiring = expire_idle(self._owned, self.idle_timeout, lambda i: self._spawn(end_idle, i))
            self._tg.start_soon(expiring, name="sandbox idle expiry")
        self._refill()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        await self.aclose()
        if self._tg is None:
            return None
        tg, self._tg = self._tg, None
        # aclose() cancelled the pool's task group, whose scope encloses what its owner entered
        # after it (the answer log): the cancellation they raise on the way out is the group's own.
        return await tg.__aexit__(*exc)

    async def aclose(self) -> None:
        """End every instance (warm and handed out) and delete their state; idempotent.

        Callable from any task; the pool's own task group ends when its ``async with`` does.
        """
        if self._closed:
            return
        self._closed = True
        self._notify()
        everything = [i for live in self._live.values() for i in live]
        async with anyio.create_task_group() as closing:
            for instance in everything:
                closing.start_soon(instance.close)
        await anyio.to_thread.run_sync(self.snapshots.close)
        if self._tg is not None:
            self._tg.cancel_scope.cancel()  # instances still starting

    # -- the SandboxPool interface ----------------------------------------------------------

    @property
    def confined(self) -> bool | None:
        """Whether its instances run confined (None until the pool is entered and has probed)."""
        return None if self._launcher is None else self._launcher.confined

    def servers(self) -> frozenset[str]:
        """The recorded server names this pool runs instances of."""
        return frozenset(self._specs)

    def fingerprint(self, server: str) -> tuple[str, dict[str, Any]]:
        """The fingerprint of ``server``'s sandbox config and code, and what it covers."""
        spec = self._specs[server]
        return sandbox_fingerprint(server, spec), fingerprint_detail(server, spec)

    async def acquire(
        self, server: str, *, timeout: float, reclaim: Reclaim | None = None, snapshot: str | None = None
    ) -> Instance:
        """A fresh instance of ``server`` at its initial state, the caller's alone until it closes it.

        Args:
            server: The recorded server name.
            timeout: Seconds to wait for a place (a start for the caller: its ``startup_timeout``).
            reclaim: At the cap (or an exclusive server's instance held), asked for an idle instance
                its owner gives back, which the pool ends to make room; else the caller waits.
            snapshot: Start it from this state snapshot (:attr:`snapshots`) instead: a new instance
                for the caller alone (never a warm one), in the snapshot's state.

        Raises:
            SandboxUnavailable: None could be had within ``timeout`` seconds: the cap of live
                instances is reached, ``server`` failed to start (with its stderr tail), its
                exclusive instance is held by another caller, or ``server`` is not a sandbox here.
        """
        if server not in self._specs:
            known = ", ".join(sorted(self._specs)) or "none"
            raise SandboxUnavailable(f"sandbox: no sandbox server {server!r} (sandboxes: {known})")
        if self._tg is None or self._closed:
            raise SandboxUnavailable(
                f"sandbox {server!r}: the instance pool is not running (enter it, or it was shut down)"
            )
        seed = None if snapshot is None else self.snapshots.pin(snapshot)
        if snapshot is not None and seed is None:
            raise SandboxUnavailable(f"sandbox {server!r}: state snapshot {snapshot[:12]} is no longer kept")
        failures, mine = self._counts[server]["failed"], list[Instance]()  # mine: its start from `seed`
        (self._seeding if seed else self._waiting)[server] += 1
        began = anyio.current_time()
        try:
            with anyio.CancelScope(deadline=began + max(timeout, 0)) as scope:
                while True:
                    if self._closed:
                        raise SandboxUnavailable(f"sandbox {server!r}: the instance pool is shutting down")
                    if (instance := self._take(server, None if seed is None else mine)) is not None:
                        self.snapshots.started(server, None, len(self._warm[server]))
                        return instance
                    failed = self._counts[server]["failed"] != failures and not self._starting[server]
                    if (mine[0] not in self._live[server]) if mine else (failed and not seed):
                        why = self._failure.get(server, "it failed to start, then started for another caller")
                        raise SandboxUnavailable(
                            f"sandbox {server!r}: an instance could not be started: {why}"
                        )
                    self._start_for_waiters(server, reclaim, seed, mine)
                    if self._starting[server]:  # a place was had: its start is waited for, not the place
                        scope.deadline = max(scope.deadline, began + self._specs[server].startup_timeout)
                    changed = self._changed
                    await changed.wait()
        finally:
            (self._seeding if seed and not mine else self._waiting)[server] -= not mine
            if seed is not None:
                self.snapshots.unpin(str(snapshot), seed[0])
            if mine and mine[0] in self._ready:  # started for a caller that gave up: ended
                self._ready.discard(mine[0])
                self._spawn(Instance.close, mine[0])
        spec, live = self._specs[server], self._live[server]
        raise SandboxUnavailable(why_unavailable(
            server, timeout, exclusive_held=spec.isolation is Isolation.EXCLUSIVE and bool(live),
            at_cap=self._total() >= self.max_instances and not self._starting[server],
            cap=self.max_instances, startup_timeout=spec.startup_timeout,
            failed=self._failure.get(server) if self._counts[server]["failed"] != failures else None,
        ))  # fmt: skip

    def wake(self) -> None:
        """An owner's instance turned idle (reclaimable): callers waiting for a place look again."""
        if any(self._waiting.values()) or any(self._seeding.values()):
            self._notify()

    def stats(self) -> dict[str, Any]:
        """Per server: isolation, live/warm/in-use/starting instances, counters, memory and pid per
        instance (:func:`~replay_sim.record.instances.figures.pool_figures`)."""
        return pool_figures(
            self._specs, self._live, self._warm, self._starting, self._counts, self._failure, self._launcher
        )

    # -- keeping instances ------------------------------------------------------------------

    def _refill(self) -> None:
        """Start warm instances as demand asks (``pool`` at least), within the cap (no failing server)."""
        if self._closed or self._tg is None:
            return
        ceiling = max(self.pool, self.max_instances // 4)
        for server, spec in self._specs.items():
            if self._crash_run[server] >= _CRASH_LOOP or server in self._failure:
                continue  # a failing server is started again only when a caller asks for it
            wanted = self._demand.warm(server, self.pool, ceiling) if self.pool else 0
            while len(self._warm[server]) + self._starting[server] < wanted:
                exclusive = spec.isolation is Isolation.EXCLUSIVE
                if self._total() + self._unserved() >= self.max_instances or (
                    exclusive and self._live[server]
                ):
                    break
                self._start(server, ahead=True)

    def _start(self, server: str, seed: tuple[Path, int] | None = None, *, ahead: bool = False) -> Instance:
        seed_path, seed_uid = seed or (None, 0)
        placement = Placement(
            next(self._uids), self._hidden, self._clocks.get(server), self._recorded.get(server, ()),
            seed=seed_path, seed_uid=seed_uid,
        )  # fmt: skip
        instance = Instance(
            server, f"{server}-{next(self._ids)}", self._specs[server], redactor=self.config.redactor,
            launcher=self._launcher or Launcher.detect(), capabilities=self._capabilities, base=self._base,
            placement=placement, ahead=ahead,
        )  # fmt: skip
        self._live[server].add(instance)
        self._starting[server] += 1
        self._demand.begin(instance.id)
        self._spawn(self._hold, instance)
        return instance

    async def _hold(self, instance: Instance) -> None:
        """Run one instance for its whole life, keeping the books as it starts and ends."""
        server, started, began = instance.server, False, anyio.current_time()

        def ready() -> None:
            nonlocal started
            started = True
            self._demand.ready(server, instance.id)
            self._starting[server] -= 1
            self._counts[server]["started"] += 1
            self._failure.pop(server, None)
            if instance.placement.seed is None:
                self._warm[server].append(instance)
            else:
                self._ready.add(instance)
                self.snapshots.counts["started"] += 1
            self.snapshots.started(server, anyio.current_time() - began, len(self._warm[server]))
            self._notify()

        try:
            await instance.run(ready)
        except Exception as exc:  # a start failure (UpstreamError) or an unforeseen one: never the pool's end
            self._failure[server] = (
                str(exc) if isinstance(exc, UpstreamError) else f"{type(exc).__name__}: {exc}"
            )
            self._counts[server]["failed"] += 1
        finally:
            if not started:
                self._starting[server] -= 1
            elif instance.crashed:
                self._counts[server]["crashed"] += 1
                if instance in self._warm[server]:
                    self._crash_run[server] += 1
            else:
                self._counts[server]["expired" if instance.ended_because else "ended"] += 1
            self._owned.discard(instance)
            self._evicted.discard(instance)
            if instance in self._warm[server]:
                self._warm[server].remove(instance)
            self._ready.discard(instance)
            self._live[server].discard(instance)
            self._notify()
            self._refill()

    def _spawn(self, job: Any, instance: Instance) -> None:
        assert self._tg is not None
        self._tg.start_soon(job, instance, name=f"sandbox instance {instance.id}")

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()
