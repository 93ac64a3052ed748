"""The ``sandbox`` miss policy: the real server answers, in the episode's own state.

For a server the recorder config declares a sandbox (its state can be thrown away), a call the cache
cannot answer *from the episode's state* is answered by an instance of the real server that belongs
to the episode (:class:`~replay_sim.replay.policies.binding.Binding`): taken at the initial state
from a :class:`~.instances.SandboxPool`, brought to the episode's state by re-playing its state-changing calls
(each answer checked; a server answering otherwise is a miss naming the call, never an answer from
another state), then asked the call. From then on the episode is **bound** on that server: every
call that may change state goes to its instance even when the cache has an answer (the instance's
state must stay the episode's, see :meth:`SandboxPolicy.claims`), and reads are answered from the
cache only when a recording was made from exactly that state. Every answer is recorded (origin
``sandbox``), so the next episode making the same calls is answered from the cache; serving a
read-only snapshot, they go to a side store next to the bundle (``<bundle>.sandbox.db``) and the
episode's later calls are its instance's.

An instance is a cache of its episode's state, not a lease (:mod:`~replay_sim.replay.policies.lifecycle`):
it is given back when its MCP session ends (:meth:`SandboxPolicy.release`), after ``sandbox_idle``
seconds without a call, or — at the pool's cap — when it is the least recently used idle one and
another episode needs a place; the episode's next call rebuilds its state on a fresh instance
(re-play of its journal) and goes on. A call waits for an instance only while every instance is
busy answering (``sandbox_timeout`` at most, then a miss saying what to change). One call to an
instance takes ``sandbox_call_limit`` seconds at most, progress or not; a call that exceeds it, or
whose client left (its request cancelled), ends the instance; a call that may change state and reached
no instance the episode keeps (none could be had, or it was ended) leaves the episode's state there
unknown: its later calls miss. Answers are recorded off the answer path
(:mod:`~replay_sim.replay.policies.recording`).
Requests with no history share a few initial-state instances (:mod:`~replay_sim.replay.policies.shared`).
An instance that dies unasked makes its episode **lost** (:class:`~replay_sim.errors.EpisodeLost`):
the call that killed it may be what the episode did. The record side provides the pool
(``replay_sim.record.instances``); the replay side declares only what it needs of it
(:mod:`~replay_sim.replay.policies.instances`), and never imports it.
"""

from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager, AsyncExitStack, nullcontext
from functools import partial
from typing import Any, Self

import anyio
import anyio.abc

from replay_sim.errors import ConfigError, EpisodeLost, InstanceLost, ReplaySimError, SandboxUnavailable
from replay_sim.replay.core.episodes import Episode, History
from replay_sim.replay.core.misses import ErrorPolicy, Miss, MissPolicy
from replay_sim.replay.policies.binding import Binding, Divergence, given_calls
from replay_sim.replay.policies.canary import Canary
from replay_sim.replay.policies.instances import SandboxInstance
from replay_sim.replay.policies.lifecycle import Keeper, rebuild_calls
from replay_sim.replay.policies.miss import MissSettings
from replay_sim.replay.policies.outcomes import answered, missed
from replay_sim.replay.policies.recording import AnswerLog, fingerprints, sandbox_side_file
from replay_sim.replay.policies.shared import Shared
from replay_sim.replay.policies.snapshotting import Snapshotting
from replay_sim.resolve.lineage import StateLookup, Trail
from replay_sim.resolve.resolution import Resolution
from replay_sim.store import Recording, Store

__all__ = ["SandboxPolicy"]


class SandboxPolicy:
    """Answer misses of sandbox servers from the episode's own instance; others by ``fallback``.

    Use it as an async context manager around serving (the replay enters it): it closes the
    instances of ended episodes and idle ones, and every instance and the pool at the end.

    Args:
        settings: ``sandboxes`` (the pool), ``sandbox_timeout``, ``sandbox_idle`` and ``lookup``
            (filled in by the replay).
        fallback: The policy of servers that are not sandboxes (default: ``error``).

    Raises:
        ConfigError: No pool was given, or no resolver lookup.
    """

    def __init__(self, settings: MissSettings, fallback: MissPolicy | None = None) -> None:
        if settings.sandboxes is None:
            raise ConfigError(
                "miss policy 'sandbox' needs a recorder config declaring the sandbox servers "
                "(--config FILE with `sandbox = true` upstreams)"
            )
        if settings.lookup is None:
            raise ConfigError("miss policy 'sandbox' is built by a Replay (it needs the resolver's lookup)")
        self.pool = settings.sandboxes
        self.servers = self.pool.servers()
        self.lookup: StateLookup = settings.lookup
        self.lookup.answer_strictly(self.servers)  # with a sandbox at hand, the cache never guesses
        self.store = settings.store
        self.timeout = settings.sandbox_timeout
        self.idle = settings.sandbox_idle
        self.call_limit = settings.sandbox_call_limit
        self.fallback = fallback or ErrorPolicy()
        self.canary = Canary(self.lookup)
        self._side: Store | None = None
        self._source = fingerprints(self.pool)
        self._tg: anyio.abc.TaskGroup | None = None
        self._stack = AsyncExitStack()
        self.counts: dict[str, int] = {"instances": 0, "replayed": 0, "answers": 0, "lost": 0}
        """Instances bound, calls re-played, calls answered, episodes lost — since the start; and
        ``rebuilt`` (instances bound again after one was given back), ``released`` (given back idle or
        at a session's end), ``reclaimed`` (given back to make room), ``cut`` (calls ended at the
        call limit or when their client left), ``fast`` and ``handed`` (answers of a warm instance
        written on the HTTP fast path, or handed from it to the SDK path)."""
        # A read-only store's answers go to the side store, which the resolver does not read.
        self.log = AnswerLog(
            lambda: self.recordings, written=None if self.store.readonly else settings.stored
        )
        self.shared = Shared(
            self.pool, self.log, self._end, settings.sandbox_shared, source=self._source, canary=self.canary
        )
        self.states = Snapshotting(self.pool, self.lookup, self.canary, self._source)
        self.keeper = Keeper(self.shared, self.idle, self.counts, source=self._source, keep=self.states.keep)

    # -- lifetime ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if isinstance(self.pool, AbstractAsyncContextManager):  # its instances live in its task group
            await self._stack.enter_async_context(self.pool)
        await self._stack.enter_async_context(self.log)  # flushed when serving ends (SIGTERM, SIGHUP too)
        self._tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._tg.start_soon(self.keeper.run, self._tg)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()  # the reaper
        self._tg = None
        await self.keeper.close()
        with anyio.CancelScope(shield=True):
            await self.pool.aclose()
        await self._stack.aclose()  # the pool's own task group: exited where it was entered
        if self._side is not None:
            self._side.close()

    def release(self, owner: History) -> int:
        """Give back the idle instances of a history whose MCP session ended (:meth:`Keeper.release`)."""
        return self.keeper.release(owner)

    # -- answering ----------------------------------------------------------------------------

    def asks_real_server(self, server: str) -> bool:
        """Whether a miss of ``server`` is answered by the real server (an instance), not the cache."""
        return server in self.servers

    def claims(self, server: str, method: str, name: str, arguments: dict[str, Any], trail: Trail) -> bool:
        """Whether a call the cache answers must go to the episode's instance instead.

        True once the episode is bound on ``server`` and the call is not declared read-only (its
        instance's state must stay the episode's: a tool only *learned* effect-free is asked too),
        or when the episode is lost there (it gets the error).
        """
        binding = self.keeper.bindings.get(id(trail))
        if binding is None or binding.server != server:
            return False
        if binding.lost is not None:
            return True
        return (
            binding.instance is not None
            and method == "tools/call"
            and self.lookup.may_change(server, name, arguments)
        )

    def warm(self, server: str, trail: Trail) -> bool:
        """Whether the episode's instance of ``server`` is bound, alive and idle (it answers at once)."""
        binding = self.keeper.bindings.get(id(trail))
        if binding is None or binding.server != server or binding.lost or binding.refused:
            return False
        return binding.instance is not None and binding.instance.alive and not binding.lock.locked()

    async def answer(self, miss: Miss) -> Resolution:
        """Answer from the episode's instance (taking, or rebuilding, one first), and record the answer.

        Raises:
            EpisodeLost: The episode's instance died: its state is gone.
        """
        if miss.server not in self.servers:
            return await self.fallback.answer(miss)
        if miss.server in self.canary.refused:
            return self._missed(miss, self.canary.refused[miss.server])
        if miss.trail is None:
            return await self._once(miss)
        binding = self.keeper.binding(miss.trail, miss.server)
        try:
            async with binding.lock:
                binding.used = time.monotonic()
                if binding.lost is not None:
                    raise EpisodeLost(
                        f"{_whose(miss.owner)} is lost: {binding.lost}; restart it under a new episode id"
                    )
                if binding.refused is not None:
                    return self._missed(miss, binding.refused)
                replayed = 0
                if binding.instance is None:
                    if miss.trail.diverged and not binding.journal:  # a state no recording shows
                        return miss.resolution
                    bound = await self._bind(binding, miss)
                    if isinstance(bound, Resolution):
                        return bound
                    replayed = bound
                resolution = await self._ask(binding, miss, replayed)
                self.keeper.used(binding)
                return resolution
        finally:
            self.pool.wake()  # its instance is idle now: a caller waiting for a place may reclaim it

    async def _bind(self, binding: Binding, miss: Miss) -> Resolution | int:
        """Take an instance and re-play the episode's state on it; the calls re-played, or the miss."""
        assert miss.trail is not None
        rebuilding = binding.instances > 0
        if binding.journal:
            await self.log.flush()  # the calls the cache answered since may be its own answers
            given = rebuild_calls(self.lookup, miss.trail, binding.journal)
        else:
            given = given_calls(self.lookup, miss.trail)
        if isinstance(given, str):
            return self._missed(miss, f"the episode's state cannot be re-played on a sandbox: {given}")
        acquire = partial(self.pool.acquire, miss.server, timeout=self.timeout, reclaim=self.keeper.reclaim)
        admit = partial(self.canary.admit, miss.server, acquire)  # a fresh one, past its server's canaries
        try:  # from the longest state snapshot of a prefix of it (verified), else a fresh one
            instance, held = await self.states.start(
                miss.server, given, self.timeout, self.keeper.reclaim, admit
            )
        except SandboxUnavailable as exc:
            why = f"no sandbox instance of {miss.server!r} could be had: {exc}"
            return self._missed(miss, why, unmade=True)
        except (Divergence, ReplaySimError) as exc:
            return self._missed(miss, f"the canary of {miss.server!r}: {exc}")
        try:
            await binding.replay(instance, given, self.log, held)
            await self.states.take(miss.server, instance, given)  # (when it holds enough calls)
        except Divergence as exc:
            binding.refused = str(exc)
            with anyio.CancelScope(shield=True):
                await instance.close()
            return self._missed(miss, str(exc))
        except InstanceLost as exc:
            with anyio.CancelScope(shield=True):
                await instance.close()
            return self._missed(miss, f"sandbox instance {instance.id} died while re-playing: {exc}")
        except ReplaySimError as exc:
            with anyio.CancelScope(shield=True):
                await instance.close()
            return self._missed(
                miss, f"re-playing the episode on sandbox instance {instance.id} failed: {exc}"
            )
        except BaseException:  # cancelled (its client left): the instance's state is unknown
            self._count(None, cut=1)
            with anyio.CancelScope(shield=True):
                await instance.close()
            raise
        self.keeper.used(binding)
        self._count(miss.owner, instances=1, replayed=len(given) - held, rebuilt=int(rebuilding))
        return len(given) - held

    async def _ask(self, binding: Binding, miss: Miss, replayed: int) -> Resolution:
        instance = binding.instance
        assert instance is not None
        try:
            if not instance.alive:
                raise InstanceLost(f"sandbox instance {instance.id} of {miss.server!r} has exited")
            with anyio.fail_after(self.call_limit) if self.call_limit is not None else nullcontext():
                recording = await binding.ask(miss.method, miss.params, self.recordings, self.log)
        except InstanceLost as exc:
            binding.lost = f"its sandbox instance {instance.id} died ({exc})"
            self._count(miss.owner, lost=1)
            self.keeper.holders.forget(binding)
            await binding.unbind()
            raise EpisodeLost(
                f"{_whose(miss.owner)} is lost: {binding.lost}, and the state it held with it; "
                "restart it under a new episode id"
            ) from exc
        except TimeoutError:  # the call limit: what it did to the instance's state is unknown
            self._cut(binding)
            return self._missed(
                miss,
                f"sandbox instance {instance.id} did not answer within {self.call_limit:g}s "
                "(--sandbox-call-limit; progress notifications do not extend it): the instance was "
                "ended; if this call changes state, the episode's state there is unknown from here",
                unmade=True,
            )
        except ReplaySimError as exc:  # a timeout: what state the instance is in now is unknown
            self._cut(binding)
            return self._missed(
                miss, f"sandbox instance {instance.id} failed: {exc}; if this call changes state, the "
                "episode's state there is unknown from here",
                unmade=True,
            )  # fmt: skip
        except BaseException:  # cancelled: its client left (or its session ended) mid-call
            self._cut(binding)
            raise
        if self.lookup.changed_by(recording):
            binding.journal.append(recording)
        self._count(miss.owner, answers=1)
        return self._answered(miss, recording, instance.id, replayed)

    def _cut(self, binding: Binding) -> None:
        """End the instance of a call that did not finish (its state is unknown); the episode rebuilds it."""
        self.keeper.give_back(binding, "a call to it did not finish", counted="cut")

    def _end(self, instance: SandboxInstance) -> None:
        self.keeper.end(instance)

    async def _once(self, miss: Miss) -> Resolution:
        """A request with no history (answered from the initial state): one of the shared instances."""
        try:
            binding = await self.shared.take(miss.server, self.timeout, self.keeper.reclaim)
        except SandboxUnavailable as exc:
            why = f"no sandbox instance of {miss.server!r} could be had: {exc}"
            return self._missed(miss, why, unmade=True)
        assert binding.instance is not None
        instance, changed = binding.instance.id, True
        try:
            with anyio.fail_after(self.call_limit) if self.call_limit is not None else nullcontext():
                recording = await binding.ask(miss.method, miss.params, self.recordings, self.log)
            changed = self.lookup.changed_by(recording)
        except TimeoutError:
            return self._missed(
                miss,
                f"sandbox instance {instance} did not answer within {self.call_limit:g}s "
                "(--sandbox-call-limit)",
            )
        except ReplaySimError as exc:
            return self._missed(miss, f"sandbox instance {instance} failed: {exc}")
        finally:
            self.shared.give_back(binding, changed=changed)
            self.pool.wake()
        self._count(None, answers=1)
        return self._answered(miss, recording, instance, 0)

    # -- what is recorded and served --------------------------------------------------------------

    @property
    def recordings(self) -> Store:
        """Where answers are recorded: the store, or for a read-only one a side store next to it."""
        if not self.store.readonly:
            return self.store
        if self._side is None:
            self._side = Store(sandbox_side_file(self.store.path))
        return self._side

    def _answered(self, miss: Miss, recording: Recording, instance: str, replayed: int) -> Resolution:
        return answered(self.lookup, miss, recording, instance, replayed, readonly=self.store.readonly)

    def _missed(self, miss: Miss, why: str, *, unmade: bool = False) -> Resolution:
        return missed(self.lookup, miss, why, unmade=unmade)

    def _count(self, owner: History | None, **counts: int) -> None:
        for what, n in counts.items():
            self.counts[what] = self.counts.get(what, 0) + n
        if isinstance(owner, Episode):
            owner.count_sandbox(**counts)

    def confined(self) -> bool | None:
        """Whether the pool's instances run confined (None: the pool does not say)."""
        return getattr(self.pool, "confined", None)

    def stats(self) -> dict[str, Any]:
        """What the policy did (instances, re-played calls, answers, lost episodes…), its log and pool."""
        log = {"waiting": self.log.waiting, "written": self.log.written, "batches": self.log.batches,
               "failure": self.log.failure}  # fmt: skip
        return {**self.counts, "canaries": self.canary.asked, "refused": sorted(self.canary.refused),
                "bound": len(self.keeper.holders), "shared": self.shared.counts(), "log": log,
                "snapshots": self.states.stats(), "pool": self.pool.stats()}  # fmt: skip


def _whose(owner: History | None) -> str:
    return f"episode {owner.id!r}" if isinstance(owner, Episode) else "this MCP session's history"
