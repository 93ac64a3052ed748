"""Which replica a request belongs to: its affinity key, read from the URL, the headers and the body.

Episode history lives in the replica that served the episode's first request, so every later
request of that episode — and every request of an MCP session, whose transport lives there too —
must reach the same replica. A request names what it belongs to in one of four places, read in
this order:

1. the MCP session (``Mcp-Session-Id``, on POST, the GET stream and DELETE alike): a session id
   minted on a replica carries that replica's id (:func:`session_id_for`), so it is routed straight
   to it — the session's transport exists nowhere else;
2. the episode URL ``/episodes/<id>/mcp/<server>`` (and the episode admin API,
   ``/api/episodes/<id>`` and ``POST /api/episodes {"id": ...}``);
3. ``_meta["replay-sim/episode"]`` in a POSTed JSON-RPC body;
4. the ``X-Replay-Episode`` header (the replay server, too, lets ``_meta`` win over the header).

A request may also name a replica itself (``X-Replay-Replica``, the header every answer carries):
that is how a scraper reads each replica's ``/metrics`` and admin API.

Reading the body is the replica front's one extra cost (Serve's proxy routes by URL and headers
alone): it is parsed only for a POST whose content type
is JSON and whose body is at most :data:`MAX_PEEK_BYTES` (a JSON-RPC call; a larger body is
forwarded unread and routed by the URL and headers alone). No Ray here: this is plain parsing,
tested on its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from replay_sim import untrusted
from replay_sim.protocol import EPISODE_HEADER, episode_id

__all__ = [
    "MAX_PEEK_BYTES",
    "REPLICA_HEADER",
    "SESSION_HEADER",
    "Affinity",
    "affinity",
    "episode_from_path",
    "session_id_for",
    "split_session_id",
]

MAX_PEEK_BYTES = 1 << 20
"""The largest POST body whose JSON is read for ``_meta["replay-sim/episode"]`` (1 MiB)."""
SESSION_HEADER = "mcp-session-id"
"""The streamable HTTP session header (lower case, as ASGI carries header names)."""
REPLICA_HEADER = "x-replay-replica"
"""Names the replica that answered (response); asks for one replica (request: its ``/metrics``, ``/api``)."""
_SESSION_MARK = "r-"
_SESSION_SEP = "."
_EPISODES = "/episodes/"
_EPISODES_API = "/api/episodes"


@dataclass(frozen=True)
class Affinity:
    """What a request belongs to, and so where it must be served.

    Attributes:
        episode: The episode id the request names (URL, ``_meta`` or header), or None.
        session: The MCP session id as the client sent it (replica prefix included), or None.
        replica: The replica that must serve the request because it holds its MCP session (or the
            client asked for it with an ``X-Replay-Replica`` header, to read its metrics), or None.
    """

    episode: str | None = None
    session: str | None = None
    replica: str | None = None

    @property
    def key(self) -> str | None:
        """The episode id hashed onto the replicas when no session pins the request (None: any replica)."""
        return self.episode

    def describe(self) -> str:
        """How an error message names what this request belongs to."""
        if self.episode is not None and self.session is not None:
            return f"episode {self.episode!r} (MCP session {self.session!r})"
        if self.episode is not None:
            return f"episode {self.episode!r}"
        if self.session is not None:
            return f"MCP session {self.session!r}"
        return "this request"


def session_id_for(replica: str, session: str) -> str:
    """The session id a client sees for an SDK session minted on ``replica`` (``r-<replica>.<session>``)."""
    return f"{_SESSION_MARK}{replica}{_SESSION_SEP}{session}"


def split_session_id(value: str) -> tuple[str | None, str]:
    """A client's session id split into the replica that minted it (or None) and the SDK's own id."""
    if value.startswith(_SESSION_MARK) and _SESSION_SEP in value:
        replica, _, session = value[len(_SESSION_MARK) :].partition(_SESSION_SEP)
        if replica and session:
            return replica, session
    return None, value


def episode_from_path(path: str) -> str | None:
    """The episode of an episode-scoped URL (``/episodes/<id>/mcp/<server>``) or of the episode
    admin API (``/api/episodes/<id>``), else None."""
    if path.startswith(_EPISODES):
        episode, slash, _ = path[len(_EPISODES) :].partition("/")
        return unquote(episode) if episode and slash else None
    if path.startswith(_EPISODES_API + "/"):
        episode = path[len(_EPISODES_API) + 1 :].partition("/")[0]
        return unquote(episode) or None
    return None


def affinity(method: str, path: str, headers: Iterable[tuple[bytes, bytes]], body: bytes = b"") -> Affinity:
    """Read what a request belongs to from its method, path, ASGI headers and (POST) body.

    Args:
        method: The HTTP method.
        path: The request path (ASGI ``scope["path"]``).
        headers: The ASGI header pairs (lower-case names).
        body: The request body, read only for a JSON POST of at most :data:`MAX_PEEK_BYTES`.

    Returns:
        The request's :class:`Affinity` (all None: any replica may serve it).
    """
    named: dict[str, str] = {}
    content_type = ""
    for name, value in headers:
        key = name.decode("latin-1").lower()
        if key in (SESSION_HEADER, EPISODE_HEADER, REPLICA_HEADER):
            named[key] = value.decode("latin-1")
        elif key == "content-type":
            content_type = value.decode("latin-1").lower()
    session = named.get(SESSION_HEADER) or None
    replica = split_session_id(session)[0] if session else named.get(REPLICA_HEADER) or None
    episode = episode_from_path(path)
    if episode is None and method == "POST" and path == _EPISODES_API:
        episode = _created_id(body)  # POST /api/episodes {"id": ...}: created where it will be served
    elif episode is None:
        meta = _meta(body) if method == "POST" and "json" in content_type else None
        episode = episode_id(meta, named)
    return Affinity(episode=episode, session=session, replica=replica)


def _created_id(body: bytes) -> str | None:
    """The ``id`` a ``POST /api/episodes`` body asks for, if any."""
    if not body or len(body) > MAX_PEEK_BYTES:
        return None
    try:
        asked = untrusted.loads(body)
    except ValueError:
        return None
    value = asked.get("id") if isinstance(asked, dict) else None
    return value if isinstance(value, str) and value else None


def _meta(body: bytes) -> Any:
    """The ``_meta`` of the first JSON-RPC message in a body that carries one (bounded, never raises)."""
    if not body or len(body) > MAX_PEEK_BYTES or b"_meta" not in body:
        return None
    try:
        message = untrusted.loads(body)
    except ValueError:
        return None
    for item in message if isinstance(message, list) else [message]:
        params = item.get("params") if isinstance(item, dict) else None
        if isinstance(params, dict) and isinstance(params.get("_meta"), dict):
            return params["_meta"]
    return None
