"""Exact and canonical hits answered from bytes prepared once: the fast path's resolution and wire form.

The SDK path validates each request into models, runs the middleware chain, shapes a result and
serialises a response envelope for every call. A replayed exact or canonical hit needs none of
that: its answer is the recorded result with the provenance spliced in, which only changes with
the recording, the status, the score and the differences. :class:`Prepared` resolves a call the
way :meth:`Replay.answer <replay_sim.replay.core.replay.Replay.answer>` does and, when nothing but the
recorded result is to be sent (no fault, no delay, no notifications or questions to re-enact, a
recorded result rather than an error), advances the episode, counts the call and hands back the
result's JSON, serialised once per provenance and protocol version by the SDK's own serialisers:
the same bytes as the SDK path. Anything else is the SDK path's (None).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Hashable
from enum import StrEnum
from typing import Any, cast

from mcp.server import Server
from mcp.server.runner import ServerRunner
from mcp_types import JSONRPCResponse

from replay_sim.canonical import call_identity
from replay_sim.errors import EpisodeError, StoreError
from replay_sim.protocol import FAST_CALL_PARAMS, MATCH_META_KEY
from replay_sim.replay.core.answering import Answering
from replay_sim.replay.core.episodes import Episode
from replay_sim.replay.core.histories import needs_history
from replay_sim.replay.core.provenance import provenance, status_of
from replay_sim.replay.core.wire import overlay, stand_in
from replay_sim.resolve.resolution import Resolution, Tier

__all__ = ["FAST_METHODS", "Again", "Prepared", "Style", "envelope"]

FAST_METHODS = frozenset(FAST_CALL_PARAMS)
"""The requests the fast path answers (everything else is the SDK's)."""
_FAST_TIERS = frozenset({Tier.EXACT, Tier.CANONICAL})
_MAX_ENTRIES = 4096
_MAX_BYTES = 64 << 20  # prepared answers kept at most (a larger one is prepared per call)


class Style(StrEnum):
    """How the SDK serialises a response on a wire, so the fast path writes the same bytes."""

    PYDANTIC = "pydantic"
    """``model_dump_json``: handshake-era streamable HTTP, and stdio in both eras."""
    JSON = "json"
    """``json.dumps`` of ``model_dump(mode="json", exclude_none=True)``: 2026-era streamable HTTP."""


def _dump(response: JSONRPCResponse, style: Style) -> bytes:
    if style is Style.PYDANTIC:
        return response.model_dump_json(by_alias=True, exclude_unset=True).encode()
    dumped = response.model_dump(mode="json", by_alias=True, exclude_none=True)
    return json.dumps(dumped, separators=(",", ":")).encode()


def _id_json(id_: int | str, style: Style) -> bytes:
    if style is Style.PYDANTIC:
        return _dump(JSONRPCResponse(jsonrpc="2.0", id=id_, result={}), style)[len(_HEAD) : -len(_EMPTY)]
    return json.dumps(id_).encode()


_HEAD = b'{"jsonrpc":"2.0","id":'
_EMPTY = b',"result":{}}'


def envelope(id_: int | str, result: bytes, style: Style) -> bytes:
    """The JSON-RPC response carrying ``result`` (prepared JSON) for request ``id_``, as the SDK writes it."""
    pydantic_int = type(id_) is int and style is Style.PYDANTIC
    id_bytes = str(id_).encode() if pydantic_int else _id_json(id_, style)
    return b"".join((_HEAD, id_bytes, b',"result":', result, b"}"))


class Again:
    """A call answered from prepared bytes, and what its answer depended on: the same call again
    gets the same answer while the store is unchanged and the episode is in the same state.

    Only an exact hit of a call recorded once is kept: the resolver chooses that recording
    whenever the episode's state is the one it was made from, whatever else the episode did
    (ties between recordings are what its other steps decide).
    """

    __slots__ = (
        "arguments",
        "body",
        "call",
        "judged",
        "latency_ms",
        "method",
        "name",
        "resolution",
        "server",
        "state",
        "status",
        "stored",
    )

    def __init__(
        self,
        server: str,
        method: str,
        call: dict[str, Any],
        name: str,
        arguments: dict[str, Any],
        resolution: Resolution,
        status: str,
        body: bytes,
    ) -> None:
        assert resolution.recording is not None
        self.server = server
        self.method = method
        self.call = call
        self.name = name
        self.arguments = arguments
        self.resolution = resolution
        self.status = status
        self.body = body
        self.latency_ms = resolution.recording.latency_ms
        self.state: tuple[str, ...] = ()
        """The state-changing calls the recording was made after (the episode's must be these)."""
        self.stored: tuple[int, int] = (-1, -1)
        """The store's generation and data version before the call was resolved."""
        self.judged: object = None
        """The confidence model that judged it (a refit of a growing store's model replaces it)."""


class Prepared:
    """The fast path's answers for one replay: resolved as the SDK path would, served as prepared bytes.

    Args:
        replay: The replay whose resolver, histories, metrics and injector answer.
        server: Its SDK server of a recorded server, by name (what the SDK path would run).
    """

    def __init__(self, replay: Answering, server: Callable[[str], Server[Any]]) -> None:
        self.replay = replay
        self.server = server
        self._answers: dict[Hashable, bytes] = {}
        self._size = 0
        self._shapes: dict[tuple[str, str, str], dict[str, Any]] = {}

    def answer(
        self,
        server: str,
        method: str,
        params: dict[str, Any],
        scope: Hashable | None,
        version: str,
        style: Style,
    ) -> bytes | None:
        """The result JSON of a call answered by an exact or canonical hit with nothing else to do.

        Everything :meth:`Replay.answer <replay_sim.replay.core.replay.Replay.answer>` does for such a
        call is done here — the episode's trail advanced, its call counted, metrics and episode
        stats updated — and nothing is done when the answer is None.

        Args:
            server: Recorded server name.
            method: One of :data:`FAST_METHODS`.
            params: The request's params (wire JSON, ``_meta`` included).
            scope: Whose history the call extends (an episode id, a session or stdio client's key),
                None for none.
            version: The protocol version the request is served at.
            style: The wire's serialiser.

        Returns:
            The result's JSON bytes, or None when the SDK path must answer (as it does when the
            store cannot be read: its answer is the error naming the recording and the store).
        """
        try:
            answered = self._answer(server, method, params, scope, version, style, None)
        except StoreError:
            return None
        return None if answered is None else answered[0]

    def answer_again(
        self,
        server: str,
        method: str,
        params: dict[str, Any],
        scope: Hashable | None,
        version: str,
        style: Style,
    ) -> tuple[bytes, Again | None] | None:
        """:meth:`answer`, and how to answer the same call again without resolving it (:meth:`again`).

        Returns:
            The result's JSON bytes and, when the call's answer depends on nothing but the store
            and the episode's state, its :class:`Again`; None when the SDK path must answer.
        """
        try:
            stored: tuple[int, int] | None = self.replay.store.version()
        except StoreError:
            stored = None  # nothing is kept: the store's changes cannot be seen
        try:
            return self._answer(server, method, params, scope, version, style, stored)
        except StoreError:
            return None

    def again(self, again: Again, scope: Hashable) -> bytes | None:
        """The result JSON of a call answered before (``again``), answered the same way, or None.

        None when anything the first answer depended on may differ — the store changed, the
        episode is in another state, a fault or delay is to be injected, a sandbox claims the
        call — and the call must be answered afresh (:meth:`answer`). Everything else
        :meth:`answer` does for the call is done.
        """
        replay = self.replay
        started = time.perf_counter()
        try:
            if (
                self.replay.store.version() != again.stored
                or again.judged is not replay.resolver.confidence.model
            ):
                return None
            history = replay.histories.history(scope)
        except (StoreError, EpisodeError):
            return None
        if history is None:
            return None
        server, method, resolution = again.server, again.method, again.resolution
        trail = history.trail(server)
        if trail.diverged is not None or trail.state != again.state:
            return None
        if replay.injector.draw(history, server, method, again.call) is not None:
            return None
        if replay.injector.latency.seconds(again.latency_ms) > 0:
            return None
        if replay.claimed(server, method, again.name, again.arguments, trail):
            return None
        replay.resolver.advance(trail, resolution)
        history.called(server)
        replay.metrics.observe(server, method, again.name, again.status, time.perf_counter() - started)
        if isinstance(history, Episode):
            history.count(server, again.name, again.status, None, resolution.reason)
        return again.body

    def _answer(
        self,
        server: str,
        method: str,
        params: dict[str, Any],
        scope: Hashable | None,
        version: str,
        style: Style,
        stored: tuple[int, int] | None,
    ) -> tuple[bytes, Again | None] | None:
        replay = self.replay
        started = time.perf_counter()
        call = {k: v for k, v in params.items() if k != "_meta"}
        try:
            history = replay.histories.history(scope)
        except EpisodeError:
            return None  # the SDK path says why
        trail = None if history is None else history.trail(server)
        if replay.injector.draw(history, server, method, call) is not None:
            return None
        redacted = replay.redactor.redact(call)
        resolution = replay.resolver.resolve_now(server, method, redacted, () if trail is None else trail)
        if resolution is None or resolution.tier not in _FAST_TIERS:
            return None
        recording = resolution.recording
        if recording is None or recording.result is None or recording.error is not None:
            return None
        name, arguments = call_identity(method, redacted)
        if replay.claimed(server, method, name, arguments, trail):
            return None  # its sandbox instance answers it
        if history is None and needs_history(replay.resolver, server, method, name, arguments, resolution):
            return None
        if recording.notifications or replay.injector.latency.seconds(recording.latency_ms) > 0:
            return None
        alternatives = replay.resolver.lookup.alternatives(recording, () if trail is None else trail)
        if len(alternatives) > 1 and any(r.notifications for r in alternatives):
            return None  # which one answers depends on what the client can be asked
        body = self._prepared(server, method, resolution, version, style)
        status = status_of(resolution)
        again = None
        lookup = replay.resolver.lookup
        if (
            trail is not None
            and stored is not None
            and resolution.tier is Tier.EXACT
            and len(lookup.by_key(recording.key)) == 1  # no other recording of it to choose
            and len(body) <= _MAX_BYTES // 1024
        ):
            again = Again(server, method, call, name, arguments, resolution, status, body)
            again.state, again.stored = lookup.state_of(recording), stored
            again.judged = replay.resolver.confidence.model
        if trail is not None:
            replay.resolver.advance(trail, resolution)
        if history is not None:
            history.called(server)
        replay.metrics.observe(server, method, name, status, time.perf_counter() - started)
        if isinstance(history, Episode):
            history.count(server, name, status, None, resolution.reason)
        return body, again

    def _prepared(
        self, server: str, method: str, resolution: Resolution, version: str, style: Style
    ) -> bytes:
        """The result JSON of a hit: prepared once per recording, provenance and protocol version."""
        recording = resolution.recording
        assert recording is not None and recording.result is not None
        status = status_of(resolution)
        match = provenance(resolution, self.replay.snapshot) if resolution.differences else None
        spelled = json.dumps(match["differences"]) if match is not None else ""
        key = (
            server,
            method,
            recording.id,
            status,
            resolution.score,
            resolution.confidence,
            spelled,
            version,
            style,
        )
        found = self._answers.get(key)
        if found is not None:
            return found
        result = dict(recording.result)
        match = match or provenance(resolution, self.replay.snapshot)
        result["_meta"] = {**(result.get("_meta") or {}), MATCH_META_KEY: match}
        shaped = overlay(result, self._shape(server, method, version))
        prepared = _dump(JSONRPCResponse(jsonrpc="2.0", id=0, result=shaped), style)
        head = _HEAD + b'0,"result":'
        assert prepared.startswith(head) and prepared.endswith(b"}")
        body = prepared[len(head) : -1]
        if len(body) <= _MAX_BYTES // 16:
            while self._answers and (
                len(self._answers) >= _MAX_ENTRIES or self._size + len(body) > _MAX_BYTES
            ):
                self._size -= len(self._answers.pop(next(iter(self._answers))))
            self._answers[key] = body
            self._size += len(body)
        return body

    def dumped(self, server: str, method: str, result: dict[str, Any], version: str, style: Style) -> bytes:
        """A replayed result's JSON (not kept), shaped and serialised as the SDK path does both."""
        shaped = overlay(result, self._shape(server, method, version))
        whole = _dump(JSONRPCResponse(jsonrpc="2.0", id=0, result=shaped), style)
        return whole[len(_HEAD + b'0,"result":') : -1]

    def _shape(self, server: str, method: str, version: str) -> dict[str, Any]:
        """What the SDK's result shaping adds to a replayed result of ``method`` at ``version``.

        The SDK path shapes a stand-in (:func:`~replay_sim.replay.core.wire.stand_in`) and overlays the
        recorded result on it; the same pipeline (``ServerRunner``'s own shaping, which reads only
        the server) is run here once per server, method and version.
        """
        key = (server, method, version)
        shape = self._shapes.get(key)
        if shape is None:
            runner = ServerRunner(server=self.server(server), connection=cast(Any, None), lifespan_state=None)
            shape = self._shapes[key] = runner._serialize(method, version, stand_in(method, version))
        return shape
