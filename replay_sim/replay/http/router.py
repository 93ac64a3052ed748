"""The replay app's front door: the MCP endpoints straight to their server's MCP session manager.

``/mcp/<server>`` and the episode-scoped ``/episodes/<id>/mcp/<server>`` are the hot path, so they
skip the admin app's routing table and middleware; every other request (admin API, dashboard,
docs, metrics) and the lifespan go to the admin app. Every request passes the Host/Origin check
(:class:`~replay_sim.listener.HostGuard`) and the body read timeout first; MCP requests then
:class:`~replay_sim.replay.http.admission.Admission`.

An MCP request may name its episode in the URL, the ``X-Replay-Episode`` header and
``_meta["replay-sim/episode"]``: a POST's body is read first (by the admission's
:func:`~replay_sim.replay.http.admission.peek`), so a malformed id or two different ids get
``400`` and a new episode past the cap (or the creation rate, the server's or its client's)
gets ``503``, each with a JSON-RPC error, before the MCP SDK sees the request. A new episode is
created only once its request is answered as valid: made-up traffic (an unknown session's 404)
creates none. The episode URL's id travels on to the handlers in the ASGI scope
(:data:`~replay_sim.replay.core.histories.URL_EPISODE`), and so does a handshake-era request's
session (:data:`~replay_sim.replay.core.connections.SESSION_KEY`).

When a handshake-era MCP session ends at the client's ``DELETE``, the router tells the replay
(``ended``) which scopes it served — its connection and the episodes its requests named — so that
their sandbox instances are given back at once, not when the collector frees the session.

A replayed call the fast path can answer from prepared bytes never reaches the SDK
(:mod:`~replay_sim.replay.http.fastpath`); every other handshake-era POST gets the SDK's answer as one
JSON body unless it streams (:mod:`~replay_sim.replay.http.responses`).
"""

from __future__ import annotations

import functools
import json
import weakref
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any

import anyio
import mcp_types as types
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import Message, Receive, Scope, Send

from replay_sim import untrusted
from replay_sim.errors import EpisodeError
from replay_sim.listener import HostCheck, HostGuard
from replay_sim.protocol import EPISODE_HEADER, EPISODE_META_KEY, EPISODES_PATH, agreed_episode
from replay_sim.replay.core.connections import SESSION_KEY
from replay_sim.replay.core.episodes import Episodes
from replay_sim.replay.core.histories import URL_EPISODE
from replay_sim.replay.http.admission import Admission, BodyTimeout, peek, replaying
from replay_sim.replay.http.fairness import ClientBuckets, client_of
from replay_sim.replay.http.fastpath import FastPath
from replay_sim.replay.http.instanced import InstanceAnswers
from replay_sim.replay.http.responses import JsonUnlessStreamed, prefers_json
from replay_sim.replay.observe.readiness import Readiness
from replay_sim.replay.options import Limits
from replay_sim.replay.shaping.faults import Hangup

__all__ = ["ReplayApp"]


_EPISODE_KEY = EPISODE_META_KEY.encode()
_EPISODE_HEADER = EPISODE_HEADER.encode()
_SESSION_HEADER = b"mcp-session-id"
_VERSION_HEADER = b"mcp-protocol-version"
_SSE_START: Message = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
}


class ReplayApp:
    """The ASGI entry point: the MCP endpoints go straight to their server's session manager.

    Everything else (admin API, dashboard, docs, metrics, and the lifespan that starts the session
    managers) is the FastAPI app's, reachable as :attr:`admin`.

    Args:
        admin: The admin app (built by :func:`~replay_sim.replay.http.app.create_app`).
        managers: Each recorded server's streamable HTTP session manager, by server name.
        admission: What the MCP endpoints take on (default: :class:`Limits`' defaults).
        hosts: Which Host and Origin headers are answered (default: a loopback server's).
        episodes: The live named episodes (a new one past their cap is refused here).
        hangups: Whether a call may have its connection dropped (``disconnect`` faults).
        fast: Answers the replayed calls it can from prepared bytes (None: the SDK answers all).
        readiness: Whether every tier answers at its usual speed (None: ready once started).
        clients: Each client's share of the episode creation rate (None: only the server's bound).
        ended: Told the scopes of an MCP session that ended (its transport, the episodes it named).

    Attributes:
        readiness: As given.
    """

    def __init__(
        self,
        admin: FastAPI,
        managers: dict[str, StreamableHTTPSessionManager],
        admission: Admission | None = None,
        hosts: HostCheck | None = None,
        episodes: Episodes | None = None,
        hangups: bool = False,
        fast: FastPath | None = None,
        readiness: Readiness | None = None,
        clients: ClientBuckets | None = None,
        ended: Callable[[Iterable[str | Hashable]], object] | None = None,
    ) -> None:
        self.admin = admin
        self.ended = ended
        # A session's transport -> the episodes its requests named (told when it ends).
        self._named: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
        self.managers = managers
        self.admission = admission or Admission(Limits())
        self.episodes = episodes if episodes is not None else Episodes()
        self.hangups = hangups
        self.fast = fast
        self.readiness = readiness
        self.clients = clients
        timeout = self.admission.limits.body_timeout
        routed = self._route if timeout is None else BodyTimeout(self._route, timeout)
        self._guarded = HostGuard(routed, hosts or HostCheck())

    def load(self) -> dict[str, Any]:
        """Requests in flight, reading their body and waiting, sessions, episodes: for ``/metrics``."""
        return {
            "in_flight": self.admission.in_flight,
            "reading": self.admission.reading,
            "waiting": self.admission.waiting,
            # The SDK keeps no public count of its sessions; its registry is the truth.
            "sessions": {name: len(m._server_instances) for name, m in sorted(self.managers.items())},
            "episodes": len(self.episodes),
            "episodes_expired": self.episodes.expired,
            "episodes_refused": self.episodes.refused,
            "episodes_refused_per_client": 0 if self.clients is None else self.clients.refused,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._guarded(scope, receive, send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http":
            await self.admin(scope, receive, send)
            return
        if path.startswith("/mcp/"):
            url_episode, name = None, path[len("/mcp/") :].rstrip("/")
        elif path.startswith(EPISODES_PATH):
            tail = path[len(EPISODES_PATH) :]
            cut = tail.find("/mcp/")
            if cut < 0:
                said = f"no endpoint {path!r}: episode endpoints are /episodes/<id>/mcp/<server>"
                await _refuse(send, 404, said)
                return
            url_episode, name = tail[:cut], tail[cut + len("/mcp/") :].rstrip("/")
        else:
            await self.admin(scope, receive, send)
            return
        manager = self.managers.get(name)
        if manager is None:
            known = ", ".join(sorted(self.managers)) or "none"
            response = JSONResponse(
                {"error": f"no recorded server {name!r}; serving: {known}"}, status_code=404
            )
            await response(scope, receive, send)
            return
        await self.admission(functools.partial(self._mcp, name, manager, url_episode), scope, receive, send)

    async def _mcp(
        self,
        name: str,
        manager: StreamableHTTPSessionManager,
        url_episode: str | None,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Check the episode a request names (URL, header, ``_meta``); answer fast, or hand it to the SDK."""
        meta = None
        post = scope["method"] == "POST"
        messages: list[Message] = []
        body = None
        raw = receive  # past the body: only a client closing the connection
        if post:
            messages = await peek(receive)  # read by the admission already: handed out again
            receive = replaying(messages, receive)
            body = _whole_body(messages)
            if body is not None and untrusted.too_deep(body):  # the SDK's 2026-era path would read it
                await _refuse(send, 400, f"Parse error: {untrusted.TOO_DEEP}", code=types.PARSE_ERROR)
                return
            meta = _meta(body)
        header = session = version = None
        accept = ""
        for key, value in scope["headers"]:
            if key == _EPISODE_HEADER:
                header = value.decode("latin-1")
            elif key == _SESSION_HEADER:
                session = value.decode("latin-1")
            elif key == _VERSION_HEADER:
                version = value.decode("latin-1")
            elif key == b"accept":
                accept = value.decode("latin-1")
        try:
            episode = agreed_episode(url_episode, header, meta)
            if episode is not None and post:
                self.episodes.admit(episode)  # refused here (503) past the cap, not mid-call
                client = None
                if self.clients is not None and self.episodes.get(episode) is None:
                    client = client_of(scope)  # a new episode: its client's share, too
                    self.clients.check(client, episode)
                send = _creating(self.episodes, episode, send, self.clients, client)
        except EpisodeError as exc:
            retry = [(b"retry-after", str(self.admission.limits.retry_after).encode())]
            await _refuse(send, exc.status, str(exc), retry if exc.status == 503 else [], code=_code(exc))
            return
        if url_episode is not None:
            scope[URL_EPISODE] = url_episode
        handshake = version is None or version in HANDSHAKE_PROTOCOL_VERSIONS
        transport = None
        if handshake and session is not None:
            transport = manager._server_instances.get(session)  # its history's key, while it lives
            if transport is not None:
                scope[SESSION_KEY] = transport
                if episode is not None and self.ended is not None:
                    self._named.setdefault(transport, set()).add(episode)
        instances = None if self.fast is None else self.fast.instances
        if scope["method"] == "DELETE" and transport is not None and self.ended is not None:
            await manager.handle_request(scope, receive, send)
            if transport.is_terminated:  # the session ended: its sandbox instances are given back
                if instances is not None:
                    instances.ended(transport)  # its calls in flight on the fast path are cancelled
                self.ended([transport, *sorted(self._named.pop(transport, ()))])
            return
        if post and transport is not None and instances is not None:
            _cancelling(instances, transport, body)
        app: Callable[[Scope, Receive, Send], Awaitable[None]] = manager.handle_request
        if post and handshake and prefers_json(accept):
            app = JsonUnlessStreamed(app)
        if self.hangups and post:
            app = _hanging_up(app)
        if post and self.fast is not None:
            sdk = functools.partial(app, scope, receive, send)
            if await self.fast(name, manager, episode, scope, messages, send, raw, sdk):
                return
        await app(scope, receive, send)


def _cancelling(instances: InstanceAnswers, transport: object, body: bytes | None) -> None:
    """Tell ``instances`` of a session's ``notifications/cancelled``, alone or in a batch (the SDK
    is told too, and answers the body as it does)."""
    if body is None or b"notifications/cancelled" not in body:
        return
    try:
        decoded = untrusted.loads(body)
    except ValueError:
        return
    for item in decoded if isinstance(decoded, list) else [decoded]:
        params = item.get("params") if isinstance(item, dict) else None
        if isinstance(params, dict) and item.get("method") == "notifications/cancelled":
            instances.cancel(transport, params.get("requestId"))


def _creating(
    episodes: Episodes,
    episode: str,
    send: Send,
    clients: ClientBuckets | None = None,
    client: str | None = None,
) -> Send:
    """``send``, creating ``episode`` once the request is answered as valid (not 4xx/5xx).

    A request the MCP server refuses (an unknown session's 404, a malformed body's 400) creates
    nothing, so made-up traffic cannot fill the cap of live episodes. A new episode is counted
    against ``client``'s share (when given) once created.
    """

    async def created(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] < 400:
            new = client is not None and episodes.get(episode) is None
            try:
                episodes.open(episode)
            except EpisodeError:  # cap or rate reached meanwhile: its next call says
                pass
            else:
                if new and clients is not None and client is not None:
                    clients.spend(client)
        await send(message)

    return created


def _code(exc: EpisodeError) -> int:
    """The JSON-RPC error code of an episode refusal: invalid request (400), else server-defined."""
    return -32600 if exc.status == 400 else -32000


async def _refuse(
    send: Send,
    status: int,
    message: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    code: int = -32600,
) -> None:
    """Answer an MCP request with ``status`` and a JSON-RPC error saying ``message``."""
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


def _whole_body(messages: list[Message]) -> bytes | None:
    """A request's body, when the messages read hold all of it."""
    last = messages[-1]
    if last["type"] != "http.request" or last.get("more_body", False):
        return None
    return b"".join(m.get("body", b"") for m in messages)


def _meta(body: bytes | None) -> Any:
    """The ``_meta`` of a whole body's JSON-RPC message naming an episode there (cheap when none does)."""
    if body is None or _EPISODE_KEY not in body:
        return None  # not the whole body: the handler checks what it names
    try:
        decoded = untrusted.loads(body)
    except ValueError:
        return None  # the SDK answers a body that is not JSON
    for item in decoded if isinstance(decoded, list) else [decoded]:
        params = item.get("params") if isinstance(item, dict) else None
        meta = params.get("_meta") if isinstance(params, dict) else None
        if isinstance(meta, dict) and meta.get(EPISODE_META_KEY) not in (None, ""):
            return meta
    return None


def _hanging_up(
    app: Callable[[Scope, Receive, Send], Awaitable[None]],
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """``app``, able to drop the connection of a request whose call asks (a ``disconnect`` fault).

    The call sets its :class:`~replay_sim.replay.shaping.faults.Hangup`; the request is stopped, its
    response started if it was not, and left unfinished, so the server closes the connection.
    """

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        hangup = scope[Hangup.KEY] = Hangup()
        started = False

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if hangup.asked.is_set():
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        async with anyio.create_task_group() as tg:

            async def handle() -> None:
                await app(scope, receive, guarded_send)
                tg.cancel_scope.cancel()

            tg.start_soon(handle)
            await hangup.asked.wait()
            tg.cancel_scope.cancel()
        if hangup.asked.is_set():
            if not started:
                await send(_SSE_START)
            hangup.done.set()  # returning with the response unfinished: the connection is closed

    return serve
