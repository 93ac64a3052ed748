"""Initial-state instances shared by the requests that have no history (no episode, no session).

A 2026-era request without an episode id is answered from the initial state; starting a process
for each would make a burst of them a burst of processes. :class:`Shared` keeps at most ``size``
instances per server for them: a request takes an idle one (or starts one while fewer run), or
waits for one to come back. An instance that took a call which may change state is not at the
initial state any more: it is ended instead of coming back. Idle ones are given back to the pool
like any idle instance (:meth:`Shared.reclaim`, :meth:`Shared.idle_since`).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from functools import partial

import anyio

from replay_sim.errors import SandboxUnavailable
from replay_sim.replay.policies.binding import Binding, Divergence
from replay_sim.replay.policies.canary import Canary
from replay_sim.replay.policies.instances import Reclaim, SandboxInstance, SandboxPool
from replay_sim.replay.policies.recording import AnswerLog, Source

__all__ = ["DEFAULT_SHARED", "Shared"]

DEFAULT_SHARED = 2
"""Initial-state instances per server shared by requests with no history."""


class Shared:
    """At most ``size`` initial-state instances per server, taken and given back one request at a time.

    Args:
        pool: Where instances come from.
        log: Where each instance's recording session is started.
        end: Ends an instance (in the policy's task group).
        size: :data:`DEFAULT_SHARED`.
        source: The fingerprint each server's recorded sessions are marked with (None: unmarked).
        canary: Asks each new instance its server's canary first (None: no canary).
    """

    def __init__(
        self,
        pool: SandboxPool,
        log: AnswerLog,
        end: Callable[[SandboxInstance], None],
        size: int = DEFAULT_SHARED,
        *,
        source: Callable[[str], Source | None] = lambda server: None,
        canary: Canary | None = None,
    ) -> None:
        self.pool = pool
        self.source = source
        self.canary = canary
        self.log = log
        self.end = end
        self.size = size
        self._idle: dict[str, deque[Binding]] = {}
        self._taken: Counter[str] = Counter()
        self._back = anyio.Event()
        self.started = 0
        """Instances started for requests with no history."""
        self.discarded = 0
        """Instances ended because a call may have changed their state."""

    async def take(self, server: str, timeout: float, reclaim: Reclaim) -> Binding:
        """An idle shared instance of ``server`` (bound), the caller's until :meth:`give_back`.

        Raises:
            SandboxUnavailable: None came back, nor could be started, within ``timeout``.
        """
        with anyio.move_on_after(timeout):
            while True:
                idle = self._idle.setdefault(server, deque())
                while idle:
                    binding = idle.pop()  # the most recently used: the others may go idle for good
                    if binding.instance is not None and binding.instance.alive:
                        self._taken[server] += 1
                        return binding
                    self._end(binding)
                if self._taken[server] < self.size:
                    self._taken[server] += 1
                    try:
                        return await self._start(server, timeout, reclaim)
                    except BaseException:
                        self._taken[server] -= 1
                        raise
                back = self._back
                await back.wait()
        raise SandboxUnavailable(
            f"sandbox {server!r}: the {self.size} instances shared by requests with no episode were "
            f"all busy for {timeout:g}s; name an episode in each rollout's requests (each gets its own)"
        )

    async def _start(self, server: str, timeout: float, reclaim: Reclaim) -> Binding:
        acquire = partial(self.pool.acquire, server, timeout=timeout, reclaim=reclaim)
        try:
            instance = await (acquire() if self.canary is None else self.canary.admit(server, acquire))
        except Divergence as exc:  # not the recordings' initial state: nothing it says is recorded
            raise SandboxUnavailable(str(exc)) from exc
        binding = Binding(server, source=self.source(server))
        await binding.replay(instance, [], self.log)
        self.started += 1
        return binding

    def give_back(self, binding: Binding, *, changed: bool) -> None:
        """Return a taken instance; ended instead when a call may have ``changed`` its state (or it died)."""
        self._taken[binding.server] -= 1
        binding.used = time.monotonic()
        if changed or binding.instance is None or not binding.instance.alive:
            self.discarded += changed
            self._end(binding)
        else:
            self._idle.setdefault(binding.server, deque()).append(binding)
        self._notify()

    def reclaim(self, server: str | None) -> SandboxInstance | None:
        """An idle shared instance (of ``server``, or any) given back to the pool to end, or None."""
        for name, idle in self._idle.items():
            if idle and (server is None or name == server):
                instance = idle.popleft().release("reclaimed to make room")
                self._notify()
                if instance is not None:
                    return instance
        return None

    def idle_since(self, before: float) -> list[SandboxInstance]:
        """Take out the idle shared instances last used before ``before`` (monotonic), to be ended."""
        ended: list[SandboxInstance] = []
        for idle in self._idle.values():
            while idle and idle[0].used < before:
                instance = idle.popleft().release("idle")
                if instance is not None:
                    ended.append(instance)
        return ended

    def counts(self) -> dict[str, int]:
        """Idle and taken shared instances, started and discarded ones."""
        return {
            "idle": sum(len(idle) for idle in self._idle.values()),
            "taken": sum(self._taken.values()),
            "started": self.started,
            "discarded": self.discarded,
        }

    def _end(self, binding: Binding) -> None:
        instance = binding.release("ended")
        if instance is not None:
            self.end(instance)

    def _notify(self) -> None:
        self._back.set()
        self._back = anyio.Event()
