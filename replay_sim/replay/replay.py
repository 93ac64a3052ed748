"""The replay: one MCP server per recorded server, each call answered from the store.

:class:`Replay` orchestrates answering a call: it resolves it (exact, canonical, semantic), checks
a call nothing answers against the recorded tool schemas (refusing it as the real server would),
falls back to the miss policy, re-enacts what the real server sent during the recorded call
(notifications, questions to the client), advances the episode's history and counts the answer;
and it injects the latency and faults asked for (:mod:`~replay_sim.replay.faults`).
The servers themselves are built in :mod:`~replay_sim.replay.server`; replies and their provenance
are rendered in :mod:`~replay_sim.replay.provenance`; refusals come from the recorded
:mod:`~replay_sim.replay.surface`, and misses are kept by :mod:`~replay_sim.replay.keeper`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Self

import anyio.to_thread
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from replay_sim import untrusted
from replay_sim.canonical import call_identity, call_key
from replay_sim.errors import ConfigError, EpisodeError, EpisodeLost, ReplaySimError, StoreError
from replay_sim.protocol import LOST_CODE, MATCH_META_KEY, declared
from replay_sim.redaction import RULES_META_KEY, Redactor
from replay_sim.replay.connections import connection_key, stdio_client
from replay_sim.replay.conversation import Rounds, bound_to, questions, reenact, suited
from replay_sim.replay.episodes import Episode, Episodes, History
from replay_sim.replay.fastpath import StdioFastPath
from replay_sim.replay.faults import FaultKind, Faults, Latency
from replay_sim.replay.histories import Histories, needs_history, one_client
from replay_sim.replay.histories import scope as history_scope
from replay_sim.replay.injection import Injector
from replay_sim.replay.keeper import MissKeeper
from replay_sim.replay.metrics import Metrics
from replay_sim.replay.policies.miss import Miss, MissPolicy, MissPolicyName, MissSettings
from replay_sim.replay.policies.registry import make_policy
from replay_sim.replay.prepared import Prepared
from replay_sim.replay.provenance import FAULT_STATUS, MissDetail, Reply, provenance, render, status_of
from replay_sim.replay.readiness import still_loading
from replay_sim.replay.responses import stream_now
from replay_sim.replay.server import build_server
from replay_sim.replay.surface import Surface
from replay_sim.resolve.lineage import DIVERGED, Trail
from replay_sim.resolve.resolution import Candidate, Resolution, Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.stdio_transport import native_stdio
from replay_sim.store import Store
from replay_sim.store.misslog import MissLog

__all__ = ["DEFAULT_WARM_WAIT", "Answer", "Replay"]

DEFAULT_WARM_WAIT = 10.0
"""Seconds a call waits for the warm-up it needs before it is answered as "still starting"."""


@dataclass(frozen=True, slots=True)
class Answer:
    """How one call is answered: the resolution behind it and the result JSON or JSON-RPC error."""

    name: str
    """The tool, prompt or resource the call asked for."""
    resolution: Resolution
    reply: Reply
    """The result's wire JSON or the JSON-RPC error the client gets."""
    refused: bool = False
    """The real server would refuse the call (unknown tool, invalid arguments); answered its way."""
    pending: bool = False
    """The answer asks the (2026-era) client for input first; the call is not answered yet."""
    fault: FaultKind | None = None
    """The fault injected instead of the recorded answer, if any."""

    @property
    def status(self) -> str:
        """The tier for metrics: the provenance status, ``refused`` or ``fault``."""
        if self.fault is not None:
            return FAULT_STATUS
        return "refused" if self.refused else status_of(self.resolution)


class Replay:
    """Replay servers for every recorded server of a store.

    Args:
        store: The recording store (or a snapshot's, opened read-only).
        resolver: The resolver; a plain :class:`Resolver` over ``store`` when None.
        miss: Miss policy name, or a ready :class:`MissPolicy`.
        settings: What the miss policy needs (the live forwarder, the LLM URL); defaults to the store only.
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
        miss: str | MissPolicy = MissPolicyName.ERROR,
        settings: MissSettings | None = None,
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
        self.settings = settings or MissSettings(store=store)
        if self.settings.lookup is None:  # what the sandbox policy re-plays an episode's state from
            self.settings.lookup = self.resolver.lookup
        self.miss_policy_name = str(miss) if isinstance(miss, str) else type(miss).__name__
        self.policy = make_policy(miss, self.settings) if isinstance(miss, str) else miss
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
        self.prepared = Prepared(self)
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
        if self.settings.connections is not None:
            await stack.enter_async_context(self.settings.connections)
        if isinstance(self.policy, AbstractAsyncContextManager):  # the sandbox policy's instances
            await stack.enter_async_context(self.policy)

    async def serve_stdio(self, name: str) -> None:
        """Replay server ``name`` to one client over this process's stdin/stdout until it hangs up.

        Raises:
            ConfigError: No server of that name was recorded.
        """
        server = self.server(name)
        async with contextlib.AsyncExitStack() as stack:
            await self.enter(stack)
            self.resolver.warm(wait=False)  # in the background: exact hits are answered at once
            stack.enter_context(one_client())  # before the stream's tasks start: they inherit it
            client = stack.enter_context(stdio_client())
            fast = StdioFastPath(self.prepared, name, server, client)
            read_stream, write_stream = await stack.enter_async_context(native_stdio(shortcut=fast))
            await server.run(read_stream, write_stream, server.create_initialization_options())

    # -- answering ------------------------------------------------------------------------------

    def scope(self, ctx: ServerRequestContext[Any, Any]) -> str | Hashable | None:
        """Whose history a request extends (see :func:`~replay_sim.replay.histories.scope`).

        A connection is keyed as the fast path keys it: a handshake-era HTTP session by its
        transport (which the router passes on), the one client of a stdio server by itself.
        """
        found = history_scope(ctx)
        return found if found is None or isinstance(found, str) else connection_key(ctx, found)

    async def answer(self, server: str, method: str, ctx: ServerRequestContext[Any, Any]) -> dict[str, Any]:
        """Answer one replayed request of an MCP client (the handlers' common body).

        Returns:
            The result's wire JSON with provenance in ``_meta``.

        Raises:
            MCPError: The recording is a JSON-RPC error, the real server would refuse the call that
                way, a miss of a method whose failures are protocol errors, the store cannot be
                read (a corrupt recording: the error names it and the store), or the request
                nests deeper than :data:`~replay_sim.untrusted.MAX_DEPTH` (``-32600``).
        """
        started = time.perf_counter()
        untrusted.check_request(ctx.params)
        params = {k: v for k, v in (ctx.params or {}).items() if k != "_meta"}
        try:
            history = self.histories.history(self.scope(ctx))
        except EpisodeError as exc:
            code = types.INVALID_REQUEST if exc.status == 400 else -32000
            raise MCPError(code, str(exc)) from exc
        trail = None if history is None else history.trail(server)
        fault = self.injector.draw(history, server, method, params)
        if fault is not None:
            name = str(params.get("name", ""))
            reply, why = self.injector.fail(server, name, fault)
            answer = Answer(name, Resolution(Tier.MISS, 0.0, reason=why), reply, fault=fault)
        else:
            try:
                answer = await self.resolve(server, method, params, trail, owner=history)
                if answer.resolution.recording is not None:
                    answer = await self._converse(ctx, server, method, params, answer, trail or ())
            except EpisodeLost as exc:  # its sandbox instance died: no answer is faithful any more
                self.metrics.observe(server, method, str(params.get("name", "")), "lost", 0.0)
                raise MCPError(LOST_CODE, str(exc), {"status": 410}) from exc
            except StoreError as exc:  # a corrupt row: a JSON-RPC error naming it, not a bare 500
                raise MCPError(
                    types.INTERNAL_ERROR, f"replay-sim cannot answer from the store: {exc}"
                ) from exc
            if answer.pending:  # the client retries the call with its answers: that is the call
                assert isinstance(answer.reply, dict)
                return answer.reply
            if trail is not None and not answer.refused:  # a refusal changed nothing on the real server
                self.resolver.advance(trail, answer.resolution)
        if history is not None:
            history.called(server)
        self.metrics.observe(server, method, answer.name, answer.status, time.perf_counter() - started)
        if isinstance(history, Episode):
            history.count(server, answer.name, answer.status, fault, answer.resolution.reason)
        recording = answer.resolution.recording
        recorded_ms = recording.latency_ms if recording else None
        if fault == FaultKind.TIMEOUT or (fault is None and self.injector.latency.seconds(recorded_ms) > 0):
            await stream_now(ctx)  # a held answer: the client sees its response begin
        await self.injector.deliver(ctx, answer.reply, fault, recorded_ms)
        if isinstance(answer.reply, MCPError):
            raise answer.reply
        return answer.reply

    async def resolve(
        self,
        server: str,
        method: str,
        params: dict[str, Any],
        history: Sequence[str] | Trail | None = (),
        *,
        owner: History | None = None,
    ) -> Answer:
        """Resolve a call and render its answer (usable without an MCP connection).

        Args:
            server: Recorded server name.
            method: One of ``tools/call``, ``resources/read``, ``prompts/get``, ``completion/complete``.
            params: Request params, wire JSON without ``_meta``.
            history: The episode's trail (or its steps so far, oldest first); not advanced here.
                None when the request has no history at all (no episode, no session): a call
                whose answer depends on the server's state is then a miss naming the fix.
            owner: The episode or connection history ``history`` belongs to (what a sandbox counts in).

        Returns:
            The resolution and what to answer with.

        Raises:
            EpisodeLost: The episode's sandbox instance died; its state is gone.
        """
        surface = self.surfaces[server]
        # Recordings were redacted before they were keyed: look the call up the same way, but hand
        # a miss policy the real params (a live upstream needs the real credentials).
        redacted = self.redactor.redact(params)
        name, arguments = call_identity(method, redacted)
        steps = () if history is None else history
        resolution = self.resolver.resolve_now(server, method, redacted, steps)
        loading = False
        if resolution is None:  # it needs the model or index still loading: wait off the event loop
            if await anyio.to_thread.run_sync(self.resolver.warmup.wait, self.warm_wait):
                resolve = self.resolver.resolve
                resolution = await anyio.to_thread.run_sync(resolve, server, method, redacted, steps)
            else:
                # The cache tiers that can answer now did not: a policy that asks the real server
                # still gives the faithful answer; any other serves this miss (nothing kept).
                loading = True
                resolution = Resolution(
                    Tier.MISS, 0.0, reason=still_loading(self.resolver.warmup, self.warm_wait)
                )
                asks = getattr(self.policy, "asks_real_server", None)
                if asks is None or not asks(server):
                    return Answer(name, resolution, self._reply(server, method, name, resolution))
        if not resolution.hit and method == "tools/call":
            # Checked only when nothing answers: a recorded answer is the real server's own verdict.
            refused = surface.refusal(method, name, arguments, self.snapshot)
            if refused is not None:
                answer = Answer(name, *refused, refused=True)
                self.misses.keep(server, method, name, arguments, answer.status, answer.resolution)
                return answer
        if history is None:  # answered from the initial state: a guess when the state matters
            sessionless = needs_history(self.resolver, server, method, name, arguments, resolution)
            if sessionless is not None:
                answer = Answer(name, sessionless, self._reply(server, method, name, sessionless))
                self.misses.keep(server, method, name, arguments, answer.status, sessionless, kept=None)
                return answer
        miss = resolution
        trail = history if isinstance(history, Trail) else None
        if not resolution.hit or self.claimed(server, method, name, arguments, trail):
            tool = surface.tools.get(name) if method == "tools/call" else surface.prompts.get(name)
            try:
                resolution = await self.policy.answer(Miss(server, method, params, miss, tool, trail, owner))
            except EpisodeLost:
                raise
            except ReplaySimError as exc:  # an upstream or LLM failure is the client's miss, not a crash
                failed = f"{miss.reason}; miss policy {self.miss_policy_name!r} failed: {exc}".lstrip("; ")
                resolution = dataclasses.replace(miss, reason=failed)
        answer = Answer(name, resolution, self._reply(server, method, name, resolution))
        if not miss.hit and not loading:
            self.misses.keep(server, method, name, arguments, answer.status, miss, kept=history)
        return answer

    def claimed(
        self, server: str, method: str, name: str, arguments: dict[str, Any], trail: Trail | None
    ) -> bool:
        """Whether the miss policy takes a call the cache answers (an episode bound to a sandbox)."""
        claims = getattr(self.policy, "claims", None)
        return (
            trail is not None and claims is not None and bool(claims(server, method, name, arguments, trail))
        )

    async def _converse(
        self,
        ctx: ServerRequestContext[Any, Any],
        server: str,
        method: str,
        params: dict[str, Any],
        answer: Answer,
        trail: Trail | Sequence[str],
    ) -> Answer:
        """Serve the recording made for a client like this one, re-enacting what its server sent.

        See :mod:`replay_sim.replay.conversation`. Recordings whose server asked the client nothing
        and sent no notification (nearly all) pass straight through.
        """
        hit = answer.resolution
        assert hit.recording is not None
        same = self.resolver.alternatives(hit.recording, trail)
        if not any(r.notifications for r in same):
            return answer
        chosen = suited(same, declared(ctx))
        if chosen is None:
            why = f"no recording of it was made for a client declaring {sorted(declared(ctx)) or 'nothing'}"
            return self._answered_otherwise(server, method, params, answer, why)
        if chosen is not hit.recording:
            hit = dataclasses.replace(hit, recording=chosen, step=chosen.key)
            answer = Answer(answer.name, hit, self._reply(server, method, answer.name, hit))
        # A 2026-era request has no stream to ask on: one input_required round per question.
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and bool(questions(chosen.notifications))
        rounds = None
        if modern:
            key = call_key(server, method, *call_identity(method, self.redactor.redact(params)))
            rounds = self.rounds.next(chosen, ctx.params or {}, bound_to(self.scope(ctx), key))
        if isinstance(rounds, dict):
            asking = {**rounds, "_meta": {MATCH_META_KEY: provenance(hit, self.snapshot)}}
            return Answer(answer.name, hit, asking, pending=True)
        otherwise = rounds or await reenact(ctx, chosen.notifications, ask=not modern)
        if otherwise is not None:
            return self._answered_otherwise(server, method, params, answer, otherwise)
        return answer

    def _answered_otherwise(
        self, server: str, method: str, params: dict[str, Any], answer: Answer, why: str
    ) -> Answer:
        """The miss for a recorded call whose client answered the server's questions otherwise.

        The real server's result depended on those answers, so the recording no longer says what
        it would have answered; and if the call changes state, what state it left is unknown.
        """
        hit = answer.resolution
        assert hit.recording is not None
        _, arguments = call_identity(method, self.redactor.redact(params))
        schema = self.resolver.tool_schema(server, answer.name)
        changes = method == "tools/call" and (schema is None or schema.changes_state(arguments))
        step = DIVERGED + hit.key if changes else hit.key
        miss = Resolution(
            Tier.MISS, 0.0, candidates=[Candidate(hit.recording.id, hit.score)], key=hit.key, step=step,
            reason=f"recording {hit.recording.id} answers this call, but {why}",
        )  # fmt: skip
        missed = Answer(answer.name, miss, self._reply(server, method, answer.name, miss))
        self.misses.keep(server, method, answer.name, arguments, missed.status, miss)
        return missed

    def _reply(self, server: str, method: str, name: str, resolution: Resolution) -> Reply:
        """The reply for a resolution, citing this replay's snapshot in its provenance."""
        return render(server, method, name, resolution, self.snapshot, self.miss_detail)
