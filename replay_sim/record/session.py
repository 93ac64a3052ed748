"""One recorded client session: forwarding its requests upstream, recording what comes back.

A :class:`Session` pairs one downstream MCP session (or a 2026-era episode) with its own upstream
connection and store session. It forwards requests raw and records each answered call with the
notifications that belong to it (:class:`~replay_sim.record.relay.Relay` routes those, and the
server's questions to the client, to the call in flight); runs a 2026-era client's call as
``input_required`` rounds (:class:`~replay_sim.record.inflight.Round`); and, when exploring, asks
which tools change state and the variants of a read-only call
(:mod:`replay_sim.record.effect_probes`, :mod:`replay_sim.record.explore`). What it needs
from the proxy that owns it is a :class:`SessionHost`
(:class:`~replay_sim.record.proxy.ServerProxy` is one).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Coroutine, Mapping
from functools import partial
from typing import Any, Protocol, TypeVar

from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from replay_sim import untrusted
from replay_sim.canonical import answer_text
from replay_sim.errors import UpstreamError
from replay_sim.protocol import CALL_METHODS, EPISODE_META_KEY, INPUT_KEY, LISTING_FIELDS, LISTING_METHODS
from replay_sim.record.explore import Explorer
from replay_sim.record.inflight import Call, Round
from replay_sim.record.relay import Relay
from replay_sim.record.upstream import Upstream
from replay_sim.redaction import Redactor
from replay_sim.schema import tool_schemas
from replay_sim.store import Origin, Store, utc_now
from replay_sim.store.writer import PreparedCall

__all__ = ["Session", "SessionHost", "recorded_what", "split_params", "upstream_params"]

T = TypeVar("T")

_RESERVED_META_PREFIX = "io.modelcontextprotocol/"


class SessionHost(Protocol):
    """What a :class:`Session` needs from the proxy that owns it.

    Attributes:
        name: The recorded server name.
        store: Where the session's calls are recorded.
        redactor: Applied to everything recorded.
        explorer: Decides which effect probes and variant calls to make; None when not exploring.
    """

    name: str
    store: Store
    redactor: Redactor
    explorer: Explorer | None

    async def write(self, fn: Callable[[], T], what: str) -> T:
        """Run one store write; a failure becomes an ``MCPError`` naming ``what`` was not recorded."""
        ...

    async def record(self, what: str, **call: Any) -> int:
        """Commit one call (``Store.record_call``'s arguments); a failure is an ``MCPError`` as for writes."""
        ...

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in the background, beyond the request that starts it."""
        ...

    def modern_result(self, method: str, result: dict[str, Any]) -> dict[str, Any]:
        """The upstream's ``result`` as a 2026-era answer to ``method``."""
        ...


class Session:
    """One downstream MCP session: its upstream connection and its store session."""

    def __init__(self, proxy: SessionHost, upstream: Upstream, store_session: str, outbound: Any) -> None:
        self.proxy = proxy
        self.upstream = upstream
        self.store_session = store_session
        self.inflight: dict[str, Call] = {}
        self.rounds: dict[str, Round] = {}  # requestState -> a 2026-era call waiting for its retry
        self._round_ids = itertools.count(1)
        self.pages: dict[str, dict[str, Any]] = {}
        self.relay = Relay(self.inflight, outbound)  # outbound: the connection's standalone channel
        upstream.on_notification = self.relay.on_notification
        upstream.on_request = self.relay.on_request

    async def close(self) -> None:
        await self.upstream.close()

    async def forward(self, ctx: ServerRequestContext[Any, Any]) -> dict[str, Any]:
        """Send one downstream request upstream, record it, and return the result to hand back."""
        method = ctx.method
        untrusted.check_request(ctx.params)  # nothing deeper is forwarded, redacted or recorded
        params, meta = split_params(ctx.params)
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and method in CALL_METHODS:
            outcome = await self._modern_call(ctx, method, params, meta)
            if isinstance(outcome, dict):
                return self.proxy.modern_result(method, outcome)
            call = outcome
        else:
            call = await self._exchange(method, params, meta, ctx)
            if method in CALL_METHODS:
                await self._recorded(method, params, call)
        result, error = call.result, call.error
        if method in LISTING_METHODS and result is not None:
            await self._record_listing(method, params, result)
        if error is not None:
            raise MCPError(code=error["code"], message=error["message"], data=error["data"])
        assert result is not None
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return self.proxy.modern_result(method, result)
        return result

    async def _recorded(self, method: str, params: dict[str, Any], call: Call) -> None:
        """Record a client's answered call, then explore its effect and variants (when exploring)."""
        await self._record(method, params, call, Origin.LIVE)
        explorer = self.proxy.explorer
        if explorer is None:
            return
        if not explorer.effects.declared:  # the listing is recorded before any client call
            explorer.declare(tool_schemas(self.proxy.store.listings(self.proxy.name).get("tools/list")))
        explorer.effects.observe(self.store_session, method, params, call.result, call.error)
        if method == "tools/call" and call.result is not None and not call.result.get("isError"):
            await self._probe_effect(params)
            await self._explore(params, call.result)

    async def _probe_effect(self, params: dict[str, Any]) -> None:
        """Ask again what shows whether the call just answered changed state (its effect unsettled).

        Like the variants, before the client gets its answer and only when no other call of this
        session is in flight. A failure here costs the probe, never the client's answer.
        """
        assert self.proxy.explorer is not None
        effects, name = self.proxy.explorer.effects, params.get("name")
        arguments = params.get("arguments")
        if self.inflight or not isinstance(name, str) or not isinstance(arguments, dict):
            return
        planned = effects.plan(self.store_session, name, arguments)
        if not planned:
            return
        try:
            for probe in planned:
                answered = await self._exchange(probe.method, probe.params, {}, None)
                await self._record(probe.method, probe.params, answered, Origin.EXPLORE)
                effects.observe(
                    self.store_session, probe.method, probe.params, answered.result, answered.error, True
                )
        except (MCPError, UpstreamError):
            pass
        effects.probed(name)

    async def _modern_call(
        self, ctx: ServerRequestContext[Any, Any], method: str, params: dict[str, Any], meta: dict[str, Any]
    ) -> Call | dict[str, Any]:
        """A 2026-era client's call, or its retry: the answered call, or an ``input_required`` result.

        The upstream call runs in the background, so that a question from the server can end the
        client's request with ``input_required``; the retry (same ``requestState``) brings the
        answer and waits for what comes next.
        """
        state = str(params.get("requestState"))
        call_params = {k: v for k, v in params.items() if k not in ("inputResponses", "requestState")}
        round_ = self.rounds.get(state)
        if round_ is not None and round_.params == call_params:  # the retry of the call asking
            del self.rounds[state]
            await round_.answers.send(params.get("inputResponses"))
        else:  # a new call (a requestState of another call, or an expired one, is not its answer)
            round_ = Round(call_params)
            self.proxy.spawn(self._run_round, round_, method, call_params, meta, ctx)
        kind, value = await round_.next()
        if kind == "failed":
            raise value
        if kind == "done":
            return value  # type: ignore[no-any-return]
        token = f"round-{next(self._round_ids)}"
        self.rounds[token] = round_
        return {"resultType": "input_required", "inputRequests": {INPUT_KEY: value}, "requestState": token}

    async def _run_round(
        self,
        round_: Round,
        method: str,
        params: dict[str, Any],
        meta: dict[str, Any],
        ctx: ServerRequestContext[Any, Any],
    ) -> None:
        """The upstream side of a 2026-era call: exchange, record, hand the outcome to the client."""
        call: Call | MCPError
        try:
            call = await self._exchange(method, params, meta, ctx, round_)
        except MCPError as exc:  # the upstream timed out: nothing to record, the client is told
            call = exc
        for token in [t for t, r in self.rounds.items() if r is round_]:  # a question nobody answered
            del self.rounds[token]
        if isinstance(call, MCPError):
            await round_.events.send(("failed", call))
            return
        try:
            await self._recorded(method, params, call)
        except MCPError as exc:  # not recorded, so not answered
            await round_.events.send(("failed", exc))
            return
        await round_.events.send(("done", call))

    async def _exchange(
        self,
        method: str,
        params: dict[str, Any],
        meta: dict[str, Any],
        ctx: ServerRequestContext[Any, Any] | None,
        round_: Round | None = None,
    ) -> Call:
        """Send one request upstream and wait for its answer (and the notifications before it)."""
        request_id = self.upstream.next_request_id()
        call = Call(ctx, round=round_)
        self.inflight[request_id] = call
        try:
            answer = await self.upstream.exchange(
                method, upstream_params(method, params, meta, request_id), request_id=request_id
            )
        finally:
            del self.inflight[request_id]
        call.result, call.error, call.latency_ms = answer.result, answer.error, answer.latency_ms
        call.answered_at = utc_now()
        return call

    async def _record(self, method: str, params: dict[str, Any], call: Call, origin: Origin) -> None:
        """Commit one answered call (redacted) to this session."""
        await self.proxy.record(recorded_what(method, params), **self.row(method, params, call, origin))

    def prepare(self, method: str, redacted: dict[str, Any]) -> PreparedCall:
        """The request columns of a client's call from its redacted params, before its answer is in."""
        return self.proxy.store.prepare_call(self.proxy.name, method, redacted)

    def row(
        self,
        method: str,
        params: dict[str, Any],
        call: Call,
        origin: Origin,
        prepared: PreparedCall | None = None,
    ) -> dict[str, Any]:
        """An answered call as it is committed (redacted): :meth:`Store.record_call`'s arguments."""
        redact = self.proxy.redactor.redact
        return {
            "server": self.proxy.name,
            "method": method,
            "params": params if prepared is not None else redact(params),  # prepared: the caller redacted
            "result": redact(call.result),
            "error": redact(call.error),
            "session": self.store_session,
            "latency_ms": round(call.latency_ms, 3),
            "recorded_at": call.answered_at,  # when the answer came, not when it was committed
            "origin": origin,
            "notifications": redact(call.notifications),
            "prepared": prepared,
        }

    async def _explore(self, params: dict[str, Any], result: dict[str, Any]) -> None:
        """Ask the variants of a successful read-only call the explorer still wants answered.

        Runs before the client gets its answer, and only when no other call of this session is
        in flight, so every variant sees the state the original call saw. A failure here costs
        the exploration, never the client's answer.
        """
        explorer, name = self.proxy.explorer, params.get("name")
        arguments = params.get("arguments")
        if (
            explorer is None
            or not isinstance(name, str)
            or not explorer.effects.read_only(name)  # annotated and not refuted, or shown
            or self.inflight
            or not isinstance(arguments, dict)
        ):
            return
        tool = explorer.tools.get(name)
        wanted = explorer.variants(name, arguments, None if tool is None else tool.input_schema)
        if not wanted:  # the usual case once the explorer has settled this tool
            return
        # A secret is never varied: its variant (" TOKEN ") may escape the redaction rules.
        redacted = self.proxy.redactor.redact(arguments)
        wanted = [v for v in wanted if redacted.get(v.argument) == arguments[v.argument]]

        async def ask(varied_arguments: dict[str, Any]) -> str:
            varied = {**params, "arguments": varied_arguments}
            call = await self._exchange("tools/call", varied, {}, None)
            await self._record("tools/call", varied, call, Origin.EXPLORE)
            explorer.effects.observe(self.store_session, "tools/call", varied, call.result, call.error, True)
            return answer_text(call.result, call.error)

        try:
            await explorer.explore(wanted, answer_text(result, None), ask)
        except (MCPError, UpstreamError):
            return

    async def _record_listing(self, method: str, params: dict[str, Any], result: dict[str, Any]) -> None:
        """Record a listing; cursor pages are merged and recorded once the last page arrives."""
        items = LISTING_FIELDS[method]
        if params.get("cursor") is None:
            merged = {k: v for k, v in result.items() if k != "nextCursor"}
        else:
            previous = self.pages.get(method)
            if previous is None:
                return  # a page of a listing whose first page we did not see
            merged = {**previous, items: [*previous.get(items, []), *result.get(items, [])]}
        if result.get("nextCursor") is not None:
            self.pages[method] = merged
            return
        self.pages.pop(method, None)
        redacted = self.proxy.redactor.redact(merged, keys=False)
        store, name = self.proxy.store, self.proxy.name
        await self.proxy.write(partial(store.put_listing, name, method, redacted), method)


def split_params(raw: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A client request's params without ``_meta``, and the ``_meta`` its upstream is sent.

    The 2026 envelope, our episode key and the client's progress token are not the upstream's
    business (the recorder asks for progress with a token of its own).
    """
    raw = raw or {}
    params = {k: v for k, v in raw.items() if k != "_meta"}
    meta = raw.get("_meta") or {}
    return params, {
        k: v
        for k, v in meta.items()
        if not k.startswith(_RESERVED_META_PREFIX) and k not in (EPISODE_META_KEY, "progressToken")
    }


def upstream_params(
    method: str, params: dict[str, Any], meta: dict[str, Any], request_id: str
) -> dict[str, Any]:
    """A request's params as the upstream is sent them (``request_id`` as the progress token of a call)."""
    if method in CALL_METHODS:
        meta = {**meta, "progressToken": request_id}  # always ask, so the recording holds the progress
    return {**params, "_meta": meta} if meta else params


def recorded_what(method: str, params: dict[str, Any]) -> str:
    """What a call is, for an error saying it could not be recorded."""
    return f"{method} {params.get('name') or params.get('uri') or ''}".strip()
