"""Sandbox instances as caches of episodes' states: who holds one, which to give back, how to rebuild.

An episode's state on a server is its recorded prefix; the instance bound to it only caches that
state. So an instance can be given back whenever it is idle — after ``--sandbox-idle`` seconds
without a call, when its MCP session ends, or when the pool is at its cap and another episode
needs a place — and rebuilt when its episode calls again (from a state snapshot of it, where one is
taken as it is given back, even at the cap: :meth:`Keeper.reclaim`): :func:`rebuild_calls` says which
state-changing calls bring a fresh instance there (those the binding's journal holds, then those
the episode was answered from the cache since). :class:`Holders` keeps the bindings that hold an
instance in least-recently-used order and picks the one to give back: never one answering a call.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterator
from functools import partial

import anyio
import anyio.abc

from replay_sim.replay.core.episodes import History
from replay_sim.replay.policies.binding import Binding, given_calls
from replay_sim.replay.policies.instances import SandboxInstance
from replay_sim.replay.policies.recording import Source
from replay_sim.replay.policies.shared import Shared
from replay_sim.resolve.lineage import DIVERGED, StateLookup, Trail
from replay_sim.store import Recording

__all__ = ["Holders", "Keeper", "rebuild_calls"]

_REAP_EVERY = 5.0  # seconds between looks for idle instances (at most)


def rebuild_calls(lookup: StateLookup, trail: Trail, journal: list[Recording]) -> list[Recording] | str:
    """The state-changing calls that bring a fresh instance to the episode's state, in order.

    The journal's calls (what its earlier instances made or re-played, recorded or not yet) are
    taken as they are, at their steps of the trail; the trail's other state-changing steps (calls
    the cache answered while no instance was bound) are found as :func:`given_calls` finds them.

    Returns:
        The recordings, or why the state cannot be rebuilt (a step no recording or journal entry
        answers, or journal calls the trail does not show).
    """
    if not journal:
        return given_calls(lookup, trail)
    pending = deque(journal)
    walked = Trail()
    given: list[Recording] = []
    for step in trail.steps:
        key = step[len(DIVERGED) :] if step.startswith(DIVERGED) else step
        if pending and pending[0].key == key:
            given.append(pending.popleft())
            lookup.advance(walked, key, True)
            continue
        if step.startswith(DIVERGED):
            return f"call {key[:12]} changed state without a recording"
        if lookup.in_state(step):  # the rule given_calls walks by (every call a sandbox server may change)
            chosen = lookup.choose(lookup.by_key(step), walked)
            if chosen is None:
                return f"the recording the episode was given for call {step[:12]} is gone from the store"
            given.append(chosen)
        lookup.advance(walked, step)
    if pending:
        return (
            f"{len(pending)} state-changing call(s) its instance made (first {pending[0].key[:12]}) "
            "are not in the episode's history"
        )
    return given


class Holders:
    """The bindings holding an instance, least recently used first (at most one per instance)."""

    def __init__(self) -> None:
        self._held: OrderedDict[int, Binding] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[Binding]:
        return iter(list(self._held.values()))

    def used(self, binding: Binding) -> None:
        """``binding`` holds an instance and was just used: it is the most recently used."""
        self._held[id(binding)] = binding
        self._held.move_to_end(id(binding))

    def forget(self, binding: Binding) -> None:
        """``binding`` holds no instance any more."""
        self._held.pop(id(binding), None)

    def idle(self, server: str | None = None) -> Binding | None:
        """The least recently used binding holding an idle instance (of ``server``, or any), or None.

        Idle: no call of its episode is being answered or waiting for it (its lock is free).
        """
        for binding in self._held.values():
            if binding.instance is None:
                continue
            if (server is None or binding.server == server) and not binding.lock.locked():
                return binding
        return None

    def idle_since(self, before: float) -> list[Binding]:
        """The bindings holding an idle instance whose last use was before ``before`` (monotonic)."""
        return [
            b
            for b in self._held.values()
            if b.instance is not None and not b.lock.locked() and b.used < before
        ]


class Keeper:
    """The episodes' bindings and their instances' lifecycle: given back idle, at a session's end, for room.

    Run :meth:`run` in a task group (the policy's); :meth:`close` unbinds everything at the end.

    Args:
        shared: The instances shared by requests with no history (also given back when idle).
        idle: Seconds without a call after which an instance is given back (None: never).
        counts: Where ``released``, ``reclaimed`` and ``cut`` are counted.
        source: The fingerprint each server's recorded sessions are marked with (None: unmarked).
        keep: Called with an instance given back idle (at its session's or episode's end, or
            reclaimed at the cap) and the calls it was sent, before it is closed (a state snapshot
            of it may be taken); its third argument: whether it was reclaimed (a caller waits).
    """

    def __init__(
        self,
        shared: Shared,
        idle: float | None,
        counts: Counter[str] | dict[str, int],
        *,
        source: Callable[[str], Source | None] = lambda server: None,
        keep: Callable[[SandboxInstance, list[Recording], bool], Awaitable[None]] | None = None,
    ) -> None:
        self.shared = shared
        self.keep = keep
        self.source = source
        self.idle = idle
        self.counts = counts
        self.holders = Holders()
        self.bindings: dict[int, Binding] = {}  # id(trail) -> its binding, while the trail lives
        self._tg: anyio.abc.TaskGroup | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing: asyncio.Queue[Binding] | None = None  # bindings of ended trails, to unbind

    async def run(self, tg: anyio.abc.TaskGroup) -> None:
        """Give back idle instances, and close those of freed trails, until cancelled."""
        self._tg, self._loop, self._closing = tg, asyncio.get_running_loop(), asyncio.Queue()
        tg.start_soon(self._unbind_ended, self._closing)
        if self.idle is None:
            return
        while True:
            await anyio.sleep(min(_REAP_EVERY, self.idle / 4))
            before = time.monotonic() - self.idle
            for binding in self.holders.idle_since(before):
                self.give_back(binding, f"idle {self.idle:g} s (--sandbox-idle)")
            for instance in self.shared.idle_since(before):
                self.end(instance)

    async def close(self) -> None:
        """Unbind every binding (their instances end); nothing is given back after."""
        self._tg = self._loop = None
        bindings, self.bindings = list(self.bindings.values()), {}
        if self._closing is not None:  # ended trails whose instances were not closed yet
            while not self._closing.empty():
                bindings.append(self._closing.get_nowait())
            self._closing = None
        with anyio.CancelScope(shield=True):
            for binding in bindings:
                await binding.unbind()

    def binding(self, trail: Trail, server: str) -> Binding:
        """The binding of ``trail`` (made on first use; closed when the trail is freed)."""
        found = self.bindings.get(id(trail))
        if found is None:
            found = self.bindings[id(trail)] = Binding(server, source=self.source(server))
            weakref.finalize(trail, self._ended, id(trail))
        return found

    def used(self, binding: Binding) -> None:
        """A call of ``binding``'s episode was answered: it is the most recently used."""
        binding.used = time.monotonic()
        if binding.instance is not None:
            self.holders.used(binding)

    def release(self, owner: History) -> int:
        """Give back the idle instances of a history whose MCP session ended; how many.

        Its episode (a named one lives on) rebuilds its state on a fresh instance at its next call;
        an instance answering a call now is given back when idle, or when that call is cancelled
        with the session.
        """
        released = 0
        for trail in list(owner.trails.values()):
            binding = self.bindings.get(id(trail))
            if binding is not None and binding.instance is not None and not binding.lock.locked():
                self.give_back(binding, "its MCP session ended")
                released += 1
        return released

    def give_back(self, binding: Binding, why: str, counted: str = "released") -> None:
        """End a binding's instance, keeping what rebuilds it (counted as ``counted``)."""
        instance = binding.release(why)
        self.holders.forget(binding)
        if instance is not None:
            self.counts[counted] = self.counts.get(counted, 0) + 1
            self.end(instance, None if counted == "cut" else list(binding.made))  # cut: its state is unknown

    def reclaim(
        self, server: str | None
    ) -> SandboxInstance | tuple[SandboxInstance, Callable[[], Awaitable[None]]] | None:
        """The pool is at its cap: the least recently used idle instance (of ``server``, or any), or None.

        An episode's instance comes with what the pool awaits before it ends it: :attr:`keep` (a
        state snapshot of it, so its episode's rebuild starts there); a shared one, at the initial
        state, alone.
        """
        instance, keep = self.shared.reclaim(server), None
        if instance is None:
            binding = self.holders.idle(server)
            if binding is None:
                return None
            instance = binding.release("reclaimed to make room (--max-sandboxes)")
            self.holders.forget(binding)
            if instance is not None and self.keep is not None:
                keep = partial(self.keep, instance, list(binding.made), True)
        if instance is None:
            return None
        self.counts["reclaimed"] = self.counts.get("reclaimed", 0) + 1
        return instance if keep is None else (instance, keep)

    def end(self, instance: SandboxInstance, made: list[Recording] | None = None) -> None:
        """Close an instance in the background (its state is deleted), after :attr:`keep` when it
        was given back idle (``made``: the calls it was sent)."""
        if self._tg is not None:
            keep = None if made is None or self.keep is None else self.keep(instance, made, False)
            self._tg.start_soon(_close, instance, keep, name=f"closing sandbox instance {instance.id}")

    async def _unbind_ended(self, closing: asyncio.Queue[Binding]) -> None:
        """Close the instances of freed trails, as :meth:`_ended` hands them over."""
        while True:
            binding = await closing.get()
            self.holders.forget(binding)
            if self.keep is not None and binding.instance is not None and binding.lost is None:
                await self.keep(binding.instance, list(binding.made), False)
            await binding.unbind()

    def _ended(self, key: int) -> None:
        """A trail was freed (its episode ended or expired, its MCP session closed): close its instance."""
        binding = self.bindings.pop(key, None)
        if binding is None or binding.instance is None:
            return
        loop, closing = self._loop, self._closing
        if loop is None or closing is None or loop.is_closed():
            return
        try:  # a bare callback, in no task, maybe another thread: it may only hand the binding over
            loop.call_soon_threadsafe(closing.put_nowait, binding)
        except RuntimeError:  # the loop closed meanwhile: the policy closed the pool and its instances
            return


async def _close(instance: SandboxInstance, keep: Awaitable[None] | None = None) -> None:
    with anyio.CancelScope(shield=True):
        if keep is not None:
            await keep
        await instance.close()
