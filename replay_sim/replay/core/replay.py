"""The replay: one MCP server per recorded server, each call answered from the store.

:class:`Replay` builds what answering needs — the resolver, the miss policy, the recorded
surfaces, the histories, metrics, the kept misses and the latency and faults asked for
(:mod:`~replay_sim.replay.shaping.faults`) — and the servers themselves (:mod:`.server`), which the
doors serve. How one call is answered is :mod:`.answering`'s; replies and their provenance are rendered
in :mod:`.provenance`; refusals come from the recorded :mod:`.surface`, and misses are kept by
:mod:`.keeper`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Self

from mcp.server import Server

from replay_sim.errors import ConfigError
from replay_sim.redaction import RULES_META_KEY, Redactor
from replay_sim.replay.core.answering import Answering
from replay_sim.replay.core.conversation import Rounds
from replay_sim.replay.core.episodes import Episodes
from replay_sim.replay.core.histories import Histories
from replay_sim.replay.core.keeper import MissKeeper
from replay_sim.replay.core.misses import ErrorPolicy, MissPolicy
from replay_sim.replay.core.prepared import Prepared
from replay_sim.replay.core.server import build_server
from replay_sim.replay.core.surface import Surface
from replay_sim.replay.observe.metrics import Metrics
from replay_sim.replay.options import MissDetail
from replay_sim.replay.shaping.faults import Faults, Latency
from replay_sim.replay.shaping.injection import Injector
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store
from replay_sim.store.misslog import MissLog

__all__ = ["DEFAULT_WARM_WAIT", "Replay"]

DEFAULT_WARM_WAIT = 10.0
"""Seconds a call waits for the warm-up it needs before it is answered as "still starting"."""


class Replay(Answering):
    """Replay servers for every recorded server of a store.

    Args:
        store: The recording store (or a snapshot's, opened read-only).
        resolver: The resolver; a plain :class:`Resolver` over ``store`` when None.
        policy: What a miss gets (:mod:`replay_sim.replay.policies` builds them by name); by default
            the miss itself, as an error.
        policy_name: The policy's name, as the admin API and stats show it (default: ``error``, or the
            policy's class name).
        holds: What serving holds open around the policy — ``live`` connections, ``sandbox``
            instances — entered by :meth:`enter` and closed when serving ends.
        snapshot: The snapshot id cited in every provenance record, when serving a snapshot.
        histories: Episode histories (the calls each episode made, per server).
        metrics: Where counts, latencies and misses go.
        redactor: Applied to incoming params before resolving, so calls carrying secrets find
            the recordings the recorder redacted the same way (when None: the rules the store
            records were made with).
        latency: How long answers are held (``none``, ``recorded``, ``fixed:MS``, ``scale:F``).
        faults: Which tool calls fail on purpose, and how (default: none).
        sleep: How the replay waits (injected latency, a timeout fault's hold); ``anyio.sleep``
            unless a test injects a clock.
        miss_detail: How much a miss tells the client (``full``, ``reason``, ``none``).
        warm_wait: Seconds a call that needs what the warm-up still loads (index, model, a tool's
            matching state) waits for it; past that it is answered as a miss saying the replay is
            still loading (no history advanced, nothing kept), never held for minutes.

    Raises:
        ConfigError: ``faults`` names a server or tool nothing recorded.
    """

    def __init__(
        self,
        store: Store,
        *,
        resolver: Resolver | None = None,
        policy: MissPolicy | None = None,
        policy_name: str | None = None,
        holds: Sequence[AbstractAsyncContextManager[Any]] = (),
        snapshot: str | None = None,
        histories: Histories | None = None,
        metrics: Metrics | None = None,
        redactor: Redactor | None = None,
        latency: Latency | str | None = None,
        faults: Faults | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        miss_detail: MissDetail | str = MissDetail.FULL,
        warm_wait: float = DEFAULT_WARM_WAIT,
    ) -> None:
        self.store = store
        self.miss_detail = MissDetail(miss_detail)
        self.warm_wait = warm_wait
        self.redactor = redactor or Redactor.from_rules(store.meta(RULES_META_KEY))
        self.resolver = resolver or Resolver(store)
        self.policy: MissPolicy = policy or ErrorPolicy()
        self.miss_policy_name = policy_name or ("error" if policy is None else type(policy).__name__)
        self.holds = tuple(holds)
        self.snapshot = snapshot
        self.histories = histories or Histories()
        self.rounds = Rounds()  # 2026-era clients answer recorded questions one round at a time
        self.metrics = metrics or Metrics()
        self.misses = MissKeeper(store, self.resolver, self.metrics)
        self.surfaces = {record.name: Surface(store, record) for record in store.servers()}
        if faults:
            faults.check(self._tools())
        self.injector = Injector(
            Latency.parse(latency) if isinstance(latency, str) else latency or Latency(),
            faults or Faults(),
            # What faults are drawn from besides the episode: the same content gets the same faults.
            basis=snapshot or f"store:{store.fingerprint()}",
            snapshot=snapshot,
            metrics=self.metrics,
            sleep=sleep,
        )
        self._servers: dict[str, Server[Any]] = {}
        self.prepared = Prepared(self, self.server)
        """Exact and canonical hits served from prepared bytes (the HTTP and stdio fast paths)."""

    def _tools(self) -> dict[str, set[str]]:
        """Each recorded server's tools: listed, or called (recordings of unlisted tools count)."""
        tools = {name: set(surface.tools) for name, surface in self.surfaces.items()}
        for server, method, name in self.store.names():
            if method == "tools/call" and server in tools:
                tools[server].add(name)
        return tools

    @property
    def episodes(self) -> Episodes:
        """The live named episodes (``/api/episodes``)."""
        return self.histories.episodes

    @property
    def miss_log(self) -> MissLog | None:
        """Where misses persist for ``replay-sim backfill`` (None: nowhere)."""
        return self.misses.log

    @miss_log.setter
    def miss_log(self, log: MissLog | None) -> None:
        self.misses.log = log

    def sandbox_stats(self) -> dict[str, Any] | None:
        """What the ``sandbox`` miss policy did and its pool's figures (None under another policy)."""
        stats = getattr(self.policy, "stats", None)
        return stats() if callable(stats) else None

    def session_ended(self, scopes: Iterable[str | Hashable]) -> int:
        """An MCP session ended: its scopes (its connection, the episodes it named) give back their idle
        sandbox instances (their episodes rebuild them at their next call); how many were given back.
        """
        release = getattr(self.policy, "release", None)
        if release is None:
            return 0
        released = 0
        for scope in scopes:
            history = self.histories.find(scope)
            if history is not None:
                released += int(release(history))
        return released

    def close(self) -> None:
        """Write the queued misses (10 s at most, see :meth:`MissLog.close`) and close the store (idempotent).

        The replay answers nothing after.
        """
        if self.misses.log is not None:
            self.misses.log.close()
        self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- servers ------------------------------------------------------------------------------

    def names(self) -> list[str]:
        """The recorded servers this replay serves, by name."""
        return sorted(self.surfaces)

    def problems(self) -> list[str]:
        """What is missing for a faithful replay (listings a server's capabilities promise)."""
        return [p for name in self.names() for p in self.surfaces[name].problems()]

    def check(self, strict: bool) -> list[str]:
        """Return :meth:`problems`; with ``strict``, raise instead.

        Raises:
            ConfigError: ``strict`` and the store lacks something a faithful replay needs.
        """
        problems = (
            self.problems()
            if self.surfaces
            else ["the store has no recorded servers; record or import first"]
        )
        if strict and problems:
            raise ConfigError("strict replay refused: " + "; ".join(problems))
        return problems

    def server(self, name: str) -> Server[Any]:
        """The MCP server replaying the recorded server ``name`` (built once).

        Raises:
            ConfigError: No server of that name was recorded.
        """
        if name not in self._servers:
            surface = self.surfaces.get(name)
            if surface is None:
                known = ", ".join(self.names()) or "none"
                raise ConfigError(f"no recorded server {name!r} in {self.store.path} (recorded: {known})")
            self._servers[name] = build_server(surface, self.answer)
        return self._servers[name]

    async def enter(self, stack: contextlib.AsyncExitStack) -> None:
        """Start what the miss policy holds open (``live`` connections, ``sandbox`` instances)."""
        for held in self.holds:
            await stack.enter_async_context(held)
