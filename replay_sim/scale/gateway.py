"""Each replica's front door: reads a request, finds what it belongs to, serves it here or forwards it.

Serve's proxy has already routed the request by its URL and headers (:mod:`~replay_sim.scale.router`),
so a request of an MCP session or of an episode named in the URL or a header is normally this
replica's own. But the proxy routes before it reads a body, and an episode may be named only there
(``_meta["replay-sim/episode"]``), or the live set may have changed since the episode started. Per
request the gateway:

1. reads the body (at most ``max_body`` bytes, else 413) and, for a JSON POST of at most 1 MiB,
   its ``_meta`` (:func:`~replay_sim.scale.affinity.affinity`) — one ``json.loads`` per call;
2. picks the target: the replica minting the request's MCP session (or the one an
   ``X-Replay-Replica`` request header names), else the replica it last saw answer the episode
   (remembered from ``X-Replay-Replica``, least recently used forgotten beyond ``max_holders``),
   else none — this replica then claims the episode, or learns its holder;
3. refuses at once, naming the episode, a target that is no longer among the live replicas
   (:func:`~replay_sim.scale.lost.lost`), and a replica that dies under the request — also when
   the target leaves the live replicas while its answer is awaited (a call Ray finds dead is
   retried by Serve, and a retry may wait without end);
4. follows a redirect once: an episode held by another live replica is forwarded there, never
   started afresh here.

``/scale/replicas`` lists the live replicas' ids. ``dispatch`` serves an
:class:`~replay_sim.scale.wire.Envelope` here or on its target replica (an async iterator of ASGI
message batches); the Serve deployment supplies it (:mod:`~replay_sim.scale.deploy`). No Ray here.
"""

from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import anyio
from starlette.types import Message, Receive, Scope, Send

from replay_sim.scale.affinity import REPLICA_HEADER, Affinity, affinity
from replay_sim.scale.lost import conflict, error_messages, lost, unavailable
from replay_sim.scale.wire import REDIRECT, Envelope, scope_for_wire

__all__ = ["DEFAULT_MAX_BODY", "REPLICAS_PATH", "Gateway", "ReplicaGone"]

REPLICAS_PATH = "/scale/replicas"
"""The gateway's own endpoint: the ids of the live replicas (for scraping each one's ``/metrics``)."""
DEFAULT_MAX_BODY = 32 << 20
"""The largest request body the gateway forwards (32 MiB, as a stdio request line)."""
DEFAULT_MAX_HOLDERS = 200_000
"""How many episodes' holders a gateway remembers."""
LIVENESS_POLL_S = 0.2
"""How often a request forwarded to another replica checks, until its answer starts, that the
replica is still live."""
_REPLICA = REPLICA_HEADER.encode()
_GONE = b"\x00gone"  # a sentinel no body compares identical to

Dispatch = Callable[[Envelope], AsyncIterator[list[Message]]]


class ReplicaGone(Exception):
    """The replica serving a request died (or became unreachable) under it.

    Args:
        replica: Its id, when known.
    """

    def __init__(self, replica: str | None = None) -> None:
        super().__init__(f"replay replica {replica or '?'} is gone")
        self.replica = replica


class Gateway:
    """A replica's ASGI ingress (see the module docstring).

    Args:
        dispatch: Serves an envelope here (no target, or this replica) or on its target replica;
            yields the message batches; raises :class:`ReplicaGone` when that replica dies.
        live: The ids of the replicas running now (empty when not yet known).
        replica: This replica's id: requests served here are not watched for their target leaving.
        max_body: The largest request body accepted.
        max_holders: How many episodes' holders to remember.
    """

    def __init__(
        self,
        dispatch: Dispatch,
        live: Callable[[], frozenset[str]],
        *,
        replica: str | None = None,
        max_body: int = DEFAULT_MAX_BODY,
        max_holders: int = DEFAULT_MAX_HOLDERS,
    ) -> None:
        self.dispatch = dispatch
        self.live = live
        self.replica = replica
        self.max_body = max_body
        self.max_holders = max_holders
        self._holders: OrderedDict[str, str] = OrderedDict()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # no websockets: the MCP transport is HTTP
        if scope.get("path") == REPLICAS_PATH:
            listed = json.dumps({"replicas": sorted(self.live())}).encode()
            await _send_all(send, _json(200, listed))
            return
        body = await self._read(receive)
        if body is _GONE:
            return  # the client left before sending its whole request
        if body is None:
            await _send_all(
                send, error_messages(413, -32600, f"request body over {self.max_body} bytes", b"")
            )
            return
        found = affinity(scope["method"], scope.get("path", ""), scope.get("headers", []), body)
        target = found.replica
        if target is None and found.episode is not None:
            target = self._holders.get(found.episode)
        envelope = Envelope(scope_for_wire(scope), body, found, target)
        async with anyio.create_task_group() as group:
            group.start_soon(_watch_disconnect, receive, group.cancel_scope)
            try:
                await self._forward(envelope, send)
            finally:
                group.cancel_scope.cancel()

    async def _forward(self, envelope: Envelope, send: Send) -> None:
        found, body = envelope.affinity, envelope.body
        retried = redirected = False
        while True:
            live = self.live()
            if envelope.target is not None and live and envelope.target not in live:
                await _send_all(send, lost(found, envelope.target, body))
                return
            try:
                holder = await self._relay(envelope, send)
            except ReplicaGone as gone:
                if envelope.target is None and not retried:
                    # The router chose a replica that had just died: nothing held there is known to
                    # this request, so ask again; a replica that finds the episode held by the dead
                    # one redirects, and the redirect ends in "lost" below.
                    retried = True
                    continue
                await _send_all(send, self._gone(envelope, gone.replica or envelope.target))
                return
            if holder is None:
                return
            if found.replica is not None:  # the session lives elsewhere than the episode
                await _send_all(send, conflict(found, holder, found.replica, body))
                return
            if redirected:
                await _send_all(send, unavailable(f"{found.describe()} was redirected twice", body))
                return
            redirected = True
            envelope = replace(envelope, target=holder)

    async def _relay(self, envelope: Envelope, send: Send) -> str | None:
        """Stream one replica's answer to the client; returns the holder when it redirected instead.

        Raises:
            ReplicaGone: The replica died before answering (after it started, the connection is cut).
        """
        started = False
        batches = self.dispatch(envelope)
        if envelope.target not in (None, self.replica):
            batches = _until_gone(batches, envelope.target, self.live)
        try:
            async for batch in batches:
                for message in batch:
                    if message["type"] == REDIRECT:
                        return str(message["replica"])
                    if message["type"] == "http.response.start":
                        started = True
                        self._learn(envelope.affinity, message)
                    await send(message)
        except ReplicaGone:
            if started:
                raise RuntimeError("the replay replica died while answering") from None
            raise
        return None

    def _gone(self, envelope: Envelope, replica: str | None) -> list[Message]:
        """The answer when the replica serving a request died under it."""
        if envelope.affinity.episode is None and envelope.affinity.session is None:
            return unavailable(f"replica {replica or '?'} died under it; retry", b"")
        return lost(envelope.affinity, replica, envelope.body)

    def _learn(self, found: Affinity, start: Message) -> None:
        """Remember which replica answered an episode (only answers the replica itself gave)."""
        if found.episode is None:
            return
        for name, value in start.get("headers", []):
            if name == _REPLICA:
                self._holders[found.episode] = value.decode()
                self._holders.move_to_end(found.episode)
                while len(self._holders) > self.max_holders:
                    self._holders.popitem(last=False)
                return

    async def _read(self, receive: Receive) -> bytes | None:
        """The whole request body; None when it is larger than ``max_body``, :data:`_GONE` when the
        client disconnected first."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return _GONE
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


async def _until_gone(
    batches: AsyncIterator[list[Message]], target: str, live: Callable[[], frozenset[str]]
) -> AsyncIterator[list[Message]]:
    """``batches``; but :class:`ReplicaGone` if ``target`` leaves the live replicas before the first.

    Ray tells a call to a dead replica so, and Serve then routes the call again: a forward's retry
    ends in "lost" at the replica it lands on, yet it has been seen to wait without end. The live
    set drops a replica the moment any call of this process finds it dead.
    """
    first: list[list[Message] | None] = []
    failed: list[Exception] = []
    async with anyio.create_task_group() as group:

        async def take() -> None:
            try:
                first.append(await anext(batches, None))
            except Exception as error:  # re-raised below, outside the task group
                failed.append(error)
            group.cancel_scope.cancel()

        group.start_soon(take)
        while target in live() or not live():  # (an empty set: not known yet)
            await anyio.sleep(LIVENESS_POLL_S)
        group.cancel_scope.cancel()
    if failed:
        raise failed[0]
    if not first:
        raise ReplicaGone(target)
    if first[0] is None:
        return
    yield first[0]
    async for batch in batches:
        yield batch


async def _watch_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    """Cancel the forwarding when the client goes away (the replica's stream is then cancelled too)."""
    with contextlib.suppress(Exception):
        while (await receive())["type"] != "http.disconnect":
            pass
        scope.cancel()


def _json(status: int, payload: bytes) -> list[Message]:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    return [
        {"type": "http.response.start", "status": status, "headers": headers},
        {"type": "http.response.body", "body": payload, "more_body": False},
    ]


async def _send_all(send: Send, messages: list[Message]) -> None:
    for message in messages:
        await send(message)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
