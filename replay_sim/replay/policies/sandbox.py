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

The instance is closed when its episode ends (``DELETE``, idle expiry, the end of an MCP session for
session-scoped histories: the history is freed, and with it the binding) or stays idle
``sandbox_idle`` seconds. An instance that dies makes its episode **lost**
(:class:`~replay_sim.errors.EpisodeLost`); no instance within ``sandbox_timeout`` is a miss saying
why. The record side provides the pool (``replay_sim.record.instances``); the replay side declares
only what it needs of it (:mod:`~replay_sim.replay.policies.instances`), and never imports it.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from typing import Any, Self

import anyio
import anyio.abc

from replay_sim.canonical import call_identity
from replay_sim.errors import ConfigError, EpisodeLost, InstanceLost, ReplaySimError, SandboxUnavailable
from replay_sim.replay.core.episodes import Episode, History
from replay_sim.replay.core.misses import ErrorPolicy, Miss, MissPolicy
from replay_sim.replay.policies.binding import Binding, Divergence, given_calls
from replay_sim.replay.policies.canary import Canary
from replay_sim.replay.policies.miss import MissSettings
from replay_sim.resolve.lineage import DIVERGED, StateLookup, Trail
from replay_sim.resolve.resolution import Resolution, Tier
from replay_sim.store import Recording, Store
from replay_sim.store.snapshot import STORE_FILE

__all__ = ["SandboxPolicy", "sandbox_side_file"]


def sandbox_side_file(store_path: str | Path) -> Path:
    """Where a read-only store's sandbox answers are recorded: next to a snapshot bundle, or the file."""
    path = Path(store_path)
    if path.name == STORE_FILE:
        return path.parent.with_name(f"{path.parent.name}.sandbox.db")
    return path.with_name(f"{path.name}.sandbox.db")


_REAP_EVERY = 5.0  # seconds between looks for idle instances (at most)


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
        self.fallback = fallback or ErrorPolicy()
        self.canary = Canary(self.lookup)
        self._side: Store | None = None
        self._sources: dict[str, tuple[str, dict[str, Any]] | None] = {}
        self._bindings: dict[int, Binding] = {}  # id(trail) -> its binding, while the trail lives
        self._tg: anyio.abc.TaskGroup | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing: asyncio.Queue[Binding] | None = None  # bindings of ended trails, to unbind
        self._stack = AsyncExitStack()
        self.counts: dict[str, int] = {"instances": 0, "replayed": 0, "answers": 0, "lost": 0}
        """Instances bound, calls re-played, calls answered, episodes lost — since the start."""

    # -- lifetime ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._loop = asyncio.get_running_loop()
        if isinstance(self.pool, AbstractAsyncContextManager):  # its instances live in its task group
            await self._stack.enter_async_context(self.pool)
        self._tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._closing = asyncio.Queue()
        self._tg.start_soon(self._reap)
        self._tg.start_soon(self._unbind_ended, self._closing)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()  # the reaper
        self._tg = self._loop = None
        bindings, self._bindings = list(self._bindings.values()), {}
        if self._closing is not None:  # ended trails whose instances were not closed yet
            while not self._closing.empty():
                bindings.append(self._closing.get_nowait())
            self._closing = None
        with anyio.CancelScope(shield=True):
            for binding in bindings:
                await binding.unbind()
            await self.pool.aclose()
        await self._stack.aclose()  # the pool's own task group: exited where it was entered
        if self._side is not None:
            self._side.close()

    async def _reap(self) -> None:
        """Close the instances of episodes idle ``sandbox_idle`` seconds (they are lost after)."""
        if self.idle is None:
            return
        while True:
            await anyio.sleep(min(_REAP_EVERY, self.idle / 4))
            now = time.monotonic()
            for binding in list(self._bindings.values()):
                if (
                    binding.instance is not None
                    and not binding.lock.locked()
                    and now - binding.used >= self.idle
                ):
                    binding.lost = (
                        f"its sandbox instance of {binding.server!r} was closed after {self.idle:g} s idle "
                        "(--episode-idle-timeout)"
                    )
                    await binding.unbind()

    async def _unbind_ended(self, closing: asyncio.Queue[Binding]) -> None:
        """Close the instances of ended trails, as :meth:`_ended` hands them over."""
        while True:
            binding = await closing.get()
            await binding.unbind()

    def _ended(self, key: int) -> None:
        """A trail was freed (its episode ended or expired, its MCP session closed): close its instance."""
        binding = self._bindings.pop(key, None)
        if binding is None or binding.instance is None:
            return
        loop, closing = self._loop, self._closing
        if loop is None or closing is None or loop.is_closed():
            return
        try:  # a bare callback, in no task: it may only hand the binding over (anyio needs a task)
            loop.call_soon_threadsafe(closing.put_nowait, binding)
        except RuntimeError:  # the loop closed meanwhile: __aexit__ closed the pool and its instances
            return

    def _source(self, server: str) -> tuple[str, dict[str, Any]] | None:
        """The fingerprint each session the server's instances record is marked with (if the pool says)."""
        if server not in self._sources:  # once per server: it reads the server's files
            fingerprint = getattr(self.pool, "fingerprint", None)
            self._sources[server] = None if fingerprint is None else fingerprint(server)
        return self._sources[server]

    def _binding(self, trail: Trail, server: str) -> Binding:
        found = self._bindings.get(id(trail))
        if found is None:
            found = self._bindings[id(trail)] = Binding(server, source=self._source(server))
            weakref.finalize(trail, self._ended, id(trail))
        return found

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
        binding = self._bindings.get(id(trail))
        if binding is None or binding.server != server:
            return False
        if binding.lost is not None:
            return True
        return (
            binding.instance is not None
            and method == "tools/call"
            and self.lookup.may_change(server, name, arguments)
        )

    async def answer(self, miss: Miss) -> Resolution:
        """Answer from the episode's instance (taking and re-playing one first), and record the answer.

        Raises:
            EpisodeLost: The episode's instance died (or was closed idle): its state is gone.
        """
        if miss.server not in self.servers:
            return await self.fallback.answer(miss)
        if miss.server in self.canary.refused:
            return self._missed(miss, self.canary.refused[miss.server])
        if miss.trail is None:
            return await self._once(miss)
        binding = self._binding(miss.trail, miss.server)
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
                if miss.trail.diverged:  # a state no recording shows: nothing to re-play it from
                    return miss.resolution
                bound = await self._bind(binding, miss)
                if isinstance(bound, Resolution):
                    return bound
                replayed = bound
            return await self._ask(binding, miss, replayed)

    async def _bind(self, binding: Binding, miss: Miss) -> Resolution | int:
        """Take an instance and re-play the episode's state on it; the calls re-played, or the miss."""
        assert miss.trail is not None
        given = given_calls(self.lookup, miss.trail)
        if isinstance(given, str):
            return self._missed(miss, f"the episode's state cannot be re-played on a sandbox: {given}")
        try:
            instance = await self.pool.acquire(miss.server, timeout=self.timeout)
        except SandboxUnavailable as exc:
            return self._missed(miss, f"no sandbox instance of {miss.server!r} could be had: {exc}")
        try:
            refused = await self.canary.check(miss.server, instance)
            if refused is not None:
                raise Divergence(refused)
            await binding.replay(instance, given, self.recordings)
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
        self._count(miss.owner, instances=1, replayed=len(given))
        return len(given)

    async def _ask(self, binding: Binding, miss: Miss, replayed: int) -> Resolution:
        instance = binding.instance
        assert instance is not None
        try:
            if not instance.alive:
                raise InstanceLost(f"sandbox instance {instance.id} of {miss.server!r} has exited")
            recording = await binding.ask(miss.method, miss.params, self.recordings)
        except InstanceLost as exc:
            binding.lost = f"its sandbox instance {instance.id} died ({exc})"
            self._count(miss.owner, lost=1)
            await binding.unbind()
            raise EpisodeLost(
                f"{_whose(miss.owner)} is lost: {binding.lost}, and the state it held with it; "
                "restart it under a new episode id"
            ) from exc
        except ReplaySimError as exc:  # a timeout: what state the instance is in now is unknown
            await binding.unbind()
            return self._missed(miss, f"sandbox instance {instance.id} failed: {exc}")
        self._count(miss.owner, answers=1)
        return self._answered(miss, recording, instance.id, replayed)

    async def _once(self, miss: Miss) -> Resolution:
        """A request with no history (answered from the initial state): a fresh instance, then closed."""
        try:
            instance = await self.pool.acquire(miss.server, timeout=self.timeout)
        except SandboxUnavailable as exc:
            return self._missed(miss, f"no sandbox instance of {miss.server!r} could be had: {exc}")
        binding = Binding(miss.server, source=self._source(miss.server))
        try:
            refused = await self.canary.check(miss.server, instance)
            if refused is not None:
                with anyio.CancelScope(shield=True):
                    await instance.close()
                return self._missed(miss, refused)
            await binding.replay(instance, [], self.recordings)
            recording = await binding.ask(miss.method, miss.params, self.recordings)
        except ReplaySimError as exc:
            return self._missed(miss, f"sandbox instance {instance.id} failed: {exc}")
        finally:
            await binding.unbind()
        self._count(None, instances=1, answers=1)
        return self._answered(miss, recording, instance.id, 0)

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
        step = recording.key
        if self.store.readonly and self.lookup.may_change(miss.server, recording.name, recording.arguments):
            # The resolver cannot see the side store: the episode's state is its instance's from here
            # (a failed call too: on a sandbox server every call not declared read-only is state).
            step = DIVERGED + step
        return Resolution(
            Tier.SANDBOX,
            1.0,
            recording,
            miss.resolution.candidates,
            reason=f"answered by sandbox instance {instance} of the real server",
            key=miss.resolution.key,
            step=step,
            sandbox={"instance": instance, "latency_ms": recording.latency_ms, "replayed": replayed},
        )

    def _missed(self, miss: Miss, why: str) -> Resolution:
        """The miss to serve instead: the resolver's (its state-changing step marked), saying why."""
        resolution = miss.resolution
        step = resolution.step or resolution.key
        if resolution.hit:  # a call claimed from the cache: it was not made, so what state follows is unknown
            _, arguments = call_identity(miss.method, miss.params)
            name = resolution.recording.name if resolution.recording else ""
            if miss.method == "tools/call" and self.lookup.may_change(miss.server, name, arguments):
                step = DIVERGED + resolution.key
            else:
                step = resolution.key
        reason = f"{resolution.reason}; {why}".lstrip("; ") if not resolution.hit else why
        return Resolution(
            Tier.MISS, 0.0, None, resolution.candidates, reason, resolution.key, resolution.problem, step
        )

    def _count(self, owner: History | None, **counts: int) -> None:
        for what, n in counts.items():
            self.counts[what] = self.counts.get(what, 0) + n
        if isinstance(owner, Episode):
            owner.count_sandbox(**counts)

    def stats(self) -> dict[str, Any]:
        """What the policy did (instances, re-played calls, answers, lost episodes) and the pool's figures."""
        return {**self.counts, "canaries": self.canary.asked, "refused": sorted(self.canary.refused),
                "bound": sum(b.instance is not None for b in self._bindings.values()),
                "pool": self.pool.stats()}  # fmt: skip


def _whose(owner: History | None) -> str:
    return f"episode {owner.id!r}" if isinstance(owner, Episode) else "this MCP session's history"
