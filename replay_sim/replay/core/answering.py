"""Answering one replayed call: resolve it, refuse it as the real server would, or hand it to the miss
policy; re-enact what the real server sent during the recorded call; advance the episode's history,
count the answer and deliver it with the latency and faults asked for. :class:`Answering` is the half
of :class:`~replay_sim.replay.core.replay.Replay` that answers calls (the replay holds what it reads).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from replay_sim import untrusted
from replay_sim.canonical import call_identity, call_key
from replay_sim.errors import EpisodeError, EpisodeLost, ReplaySimError, StoreError
from replay_sim.protocol import LOST_CODE, MATCH_META_KEY, MIN_CONFIDENCE_META_KEY, declared
from replay_sim.redaction import Redactor
from replay_sim.replay.core.connections import connection_key, stream_now
from replay_sim.replay.core.conversation import Rounds, bound_to, questions, reenact, suited
from replay_sim.replay.core.episodes import Episode, History
from replay_sim.replay.core.handover import handed_over
from replay_sim.replay.core.histories import Histories, needs_history
from replay_sim.replay.core.histories import scope as history_scope
from replay_sim.replay.core.keeper import MissKeeper
from replay_sim.replay.core.misses import Miss, MissPolicy
from replay_sim.replay.core.provenance import FAULT_STATUS, Reply, fault_reply, provenance, render, status_of
from replay_sim.replay.core.surface import Surface
from replay_sim.replay.observe.metrics import Metrics
from replay_sim.replay.observe.readiness import model_loading, still_loading
from replay_sim.replay.options import MissDetail
from replay_sim.replay.shaping.faults import FaultKind
from replay_sim.replay.shaping.injection import Injector
from replay_sim.resolve.lineage import DIVERGED, Trail
from replay_sim.resolve.resolution import Candidate, Resolution, Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store

__all__ = ["Answer", "Answering"]


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


class Answering:
    """How a replay answers a call (the handlers' common body); :class:`Replay` holds the state."""

    store: Store
    resolver: Resolver
    redactor: Redactor
    policy: MissPolicy
    miss_policy_name: str
    snapshot: str | None
    miss_detail: MissDetail
    warm_wait: float
    histories: Histories
    rounds: Rounds
    metrics: Metrics
    misses: MissKeeper
    surfaces: dict[str, Surface]
    injector: Injector

    def scope(self, ctx: ServerRequestContext[Any, Any]) -> str | Hashable | None:
        """Whose history a request extends (see :func:`~replay_sim.replay.core.histories.scope`).

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
        point = operating_point((ctx.params or {}).get("_meta"))
        try:
            history = self.histories.history(self.scope(ctx))
        except EpisodeError as exc:
            code = types.INVALID_REQUEST if exc.status == 400 else -32000
            raise MCPError(code, str(exc)) from exc
        trail = None if history is None else history.trail(server)
        handed = handed_over(ctx)  # a fast path asked the instance already (no fault was drawn)
        fault = None if handed is not None else self.injector.draw(history, server, method, params)
        if fault is not None:
            name = str(params.get("name", ""))
            reply, why = fault_reply(server, name, fault, self.injector.faults.hold, self.snapshot)
            self.metrics.count_fault(server, name, fault)
            answer = Answer(name, Resolution(Tier.MISS, 0.0, reason=why), reply, fault=fault)
        else:
            try:
                answer = await (
                    handed.outcome()
                    if handed is not None
                    else self.resolve(server, method, params, trail, owner=history, min_confidence=point)
                )
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
        self.settle(server, method, params, answer, history, started, fault)
        recording = answer.resolution.recording
        recorded_ms = recording.latency_ms if recording else None
        if fault == FaultKind.TIMEOUT or (fault is None and self.injector.latency.seconds(recorded_ms) > 0):
            await stream_now(ctx)  # a held answer: the client sees its response begin
        await self.injector.deliver(ctx, answer.reply, fault, recorded_ms)
        if isinstance(answer.reply, MCPError):
            raise answer.reply
        return answer.reply

    def settle(
        self,
        server: str,
        method: str,
        params: dict[str, Any],
        answer: Answer,
        history: History | None,
        started: float,
        fault: FaultKind | None = None,
    ) -> None:
        """What an answered call leaves: its episode's trail advanced (not for a fault or a refusal,
        which changed nothing on the real server), the call counted in metrics and episode stats."""
        trail = None if history is None else history.trail(server)
        if fault is None and trail is not None and not answer.refused:
            diverged = trail.diverged
            self.resolver.advance(trail, answer.resolution)
            if trail.diverged and not diverged:  # a later miss names this call, by tool and arguments
                _, arguments = call_identity(method, self.redactor.redact(params))
                trail.blamed = self.resolver.lookup.blame(server, answer.name, arguments)
        if history is not None:
            history.called(server)
        self.metrics.observe(server, method, answer.name, answer.status, time.perf_counter() - started)
        if isinstance(history, Episode):
            history.count(server, answer.name, answer.status, fault, answer.resolution.reason)

    async def resolve(
        self,
        server: str,
        method: str,
        params: dict[str, Any],
        history: Sequence[str] | Trail | None = (),
        *,
        owner: History | None = None,
        min_confidence: float | None = None,
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
            min_confidence: The request's own operating point (``_meta``), if it gave one.

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
        # A sandbox server's calls are looked up exactly only (the resolver's lookup is strict for them).
        resolution = self.resolver.resolve_now(server, method, redacted, steps, min_confidence)
        loading = False
        if resolution is None:
            # It needs an embedding (resolved in a thread: its cost grows with the call), or what
            # still loads (waited for off the event loop, a bounded time).
            resolution, loading = await self._resolve_off_loop(
                server, method, redacted, steps, min_confidence
            )
            # Still loading: the cache tiers that can answer now did not. A policy that asks the
            # real server still gives the faithful answer; any other serves this miss (nothing kept).
            if loading and not self.asks_real_server(server):
                return Answer(name, resolution, self._reply(server, method, name, resolution))
        if not resolution.hit and method == "tools/call" and not self.asks_real_server(server):
            # Checked only when nothing answers: a recorded answer is the real server's own verdict,
            # and so is the answer of the real server a miss policy asks (a sandbox, live).
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
        trail = history if isinstance(history, Trail) else None
        if not resolution.hit or self.claimed(server, method, name, arguments, trail):
            return await self.ask_policy(server, method, params, resolution, history, owner, loading)
        return Answer(name, resolution, self._reply(server, method, name, resolution))

    async def ask_policy(
        self,
        server: str,
        method: str,
        params: dict[str, Any],
        miss: Resolution,
        history: Sequence[str] | Trail | None,
        owner: History | None,
        loading: bool = False,
    ) -> Answer:
        """The miss policy's answer to a call the cache misses (``miss``) or the policy claims; args as
        :meth:`resolve`'s. Raises: EpisodeLost: the episode's sandbox instance died."""
        name, arguments = call_identity(method, self.redactor.redact(params))
        trail = history if isinstance(history, Trail) else None
        surface = self.surfaces[server]
        tool = surface.tools.get(name) if method == "tools/call" else surface.prompts.get(name)
        try:
            resolution = await self.policy.answer(Miss(server, method, params, miss, tool, trail, owner))
        except EpisodeLost:
            raise
        except ReplaySimError as exc:  # an upstream or LLM failure is the client's miss, not a crash
            failed = f"{miss.reason}; miss policy {self.miss_policy_name!r} failed: {exc}".lstrip("; ")
            resolution = dataclasses.replace(miss, reason=failed)
        judge = self.resolver.confidence.judge_miss  # no sandbox answered it: how sure its best candidate is
        resolution = judge(self.resolver, server, method, name, arguments, history or (), resolution)
        answer = Answer(name, resolution, self._reply(server, method, name, resolution))
        if not miss.hit and not loading:
            self.misses.keep(server, method, name, arguments, answer.status, miss, kept=history)
        return answer

    async def _resolve_off_loop(
        self,
        server: str,
        method: str,
        params: dict[str, Any],
        steps: Sequence[str] | Trail,
        min_confidence: float | None = None,
    ) -> tuple[Resolution, bool]:
        """:meth:`Resolver.resolve` in a worker thread, waiting at most :attr:`warm_wait` for what loads.

        What the warm-up loads (the index), and the embedding model the first call that embeds a
        query loads (seconds; a minute on a busy machine), are waited for a bounded time: then the
        call is a miss saying so, and the loading goes on for later calls.

        Returns:
            The resolution, and whether it is that miss (not a miss of the recordings).
        """
        warmup = self.resolver.warmup
        if warmup.warming and not await anyio.to_thread.run_sync(warmup.wait, self.warm_wait):
            return Resolution(Tier.MISS, 0.0, reason=still_loading(warmup, self.warm_wait)), True
        resolve = functools.partial(self.resolver.resolve, server, method, params, steps, min_confidence)
        if self.resolver.model_loaded:
            return await anyio.to_thread.run_sync(resolve), False
        with anyio.move_on_after(self.warm_wait):  # the thread goes on loading the model
            return await anyio.to_thread.run_sync(resolve, abandon_on_cancel=True), False
        return Resolution(Tier.MISS, 0.0, reason=model_loading(self.warm_wait)), True

    def asks_real_server(self, server: str) -> bool:
        """Whether the miss policy answers ``server``'s misses by asking the real server (sandbox, live)."""
        asks = getattr(self.policy, "asks_real_server", None)
        return asks is not None and bool(asks(server))

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

        See :mod:`replay_sim.replay.core.conversation`. Recordings whose server asked the client nothing
        and sent no notification (nearly all) pass straight through.
        """
        hit = answer.resolution
        assert hit.recording is not None
        same = self.resolver.lookup.alternatives(hit.recording, trail)
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


def operating_point(meta: Any) -> float | None:
    """A request's own operating point (``_meta["replay-sim/min-confidence"]``), or None.

    Raises:
        MCPError: It is not a number in [0, 1] (``-32602``, naming the key).
    """
    point = meta.get(MIN_CONFIDENCE_META_KEY) if isinstance(meta, dict) else None
    if point is None:
        return None
    if isinstance(point, bool) or not isinstance(point, int | float) or not 0.0 <= point <= 1.0:
        raise MCPError(types.INVALID_PARAMS, f"_meta[{MIN_CONFIDENCE_META_KEY!r}] must be a number in [0, 1]")
    return float(point)
