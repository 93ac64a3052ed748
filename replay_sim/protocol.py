"""The MCP vocabulary both sides of the product share, and what they say on the wire besides plain MCP.

The methods replay-sim records and replays, the listing methods and the item field of each;
replay-sim's additions — how a client names an episode, and provenance — and what a recorded
server→client request (sampling, elicitation, roots) holds. The recorder groups a modern-era
client's requests by episode and records a real server's server→client requests; the replay server
keeps history per episode, stamps every answer's provenance and asks the recorded server→client
requests again (:mod:`replay_sim.asking`). So they live here. It imports no MCP SDK: a stdio
replay's start reads it before the SDK is loaded.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from replay_sim.errors import EpisodeError

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext
    from mcp.shared.exceptions import MCPError

__all__ = [
    "CALL_METHODS",
    "EPISODES_PATH",
    "EPISODE_HEADER",
    "EPISODE_ID_GRAMMAR",
    "EPISODE_META_KEY",
    "FAST_CALL_PARAMS",
    "FORWARDED_CAPABILITIES",
    "INPUT_KEY",
    "LISTING_FIELDS",
    "LISTING_METHODS",
    "LOST_CODE",
    "MATCH_META_KEY",
    "MAX_EPISODE_ID",
    "agreed_episode",
    "declared",
    "episode_id",
    "episode_path",
    "episode_problem",
    "error_json",
    "is_client_request",
    "plain_call_params",
]

CALL_METHODS = frozenset({"tools/call", "resources/read", "prompts/get", "completion/complete"})
"""Requests recorded and replayed as calls; everything else is a listing or only forwarded."""
LISTING_FIELDS = {
    "tools/list": "tools",
    "resources/list": "resources",
    "resources/templates/list": "resourceTemplates",
    "prompts/list": "prompts",
}
"""The listing methods, each with the item field of its result."""
LISTING_METHODS = tuple(LISTING_FIELDS)
"""The listing methods a server advertises (recorded once per server, served as recorded)."""
FAST_CALL_PARAMS = {
    "tools/call": frozenset({"name", "arguments", "_meta"}),
    "resources/read": frozenset({"uri", "_meta"}),
    "prompts/get": frozenset({"name", "arguments", "_meta"}),
}
"""The calls a replay may answer without the SDK's models, and the params each may carry."""
INPUT_KEY = "0"
"""The key of the one question a 2026-era ``input_required`` result carries."""

LOST_CODE = -32010
"""JSON-RPC error code of a lost episode or session: the state it held is gone (a replica or a
sandbox instance died); the client restarts the rollout."""

MATCH_META_KEY = "replay-sim/match"
"""``_meta`` key of the provenance on every replayed result (DESIGN.md "Provenance")."""
EPISODE_HEADER = "x-replay-episode"
"""HTTP header naming the episode a request belongs to (several MCP sessions may share one)."""
EPISODE_META_KEY = "replay-sim/episode"
"""``_meta`` key naming the episode, for clients that cannot set headers (stdio, 2026-era)."""
MIN_CONFIDENCE_META_KEY = "replay-sim/min-confidence"
"""``_meta`` key of a request's own operating point (a number in [0, 1]): its answer is served only
when its learned confidence reaches it (evaluators who mix operating points)."""
EPISODES_PATH = "/episodes/"
"""Prefix of the episode-scoped endpoints, ``/episodes/<id>/mcp/<server>``."""
MAX_EPISODE_ID = 128
"""The longest episode id accepted (a UUID is 36 characters)."""
EPISODE_ID_GRAMMAR = (
    "1-128 characters: ASCII letters, digits, '-', '_', '.', '~', not starting with '.' or '~'"
)
"""What an episode id may be, as error messages say it: one URL path segment that needs no escaping."""
_EPISODE_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._~-]{0,127}")


def episode_id(meta: Any, headers: Any) -> str | None:
    """The client-chosen episode id of a request, if it sent one.

    Args:
        meta: The request's ``_meta`` object (a mapping), or None.
        headers: The HTTP request headers (case-insensitive mapping), or None on stdio.

    Returns:
        ``_meta["replay-sim/episode"]`` when present, else the ``X-Replay-Episode`` header, else None.
    """
    if isinstance(meta, dict) and meta.get(EPISODE_META_KEY) not in (None, ""):
        return str(meta[EPISODE_META_KEY])
    if headers is not None:
        value = headers.get(EPISODE_HEADER)
        if value:
            return str(value)
    return None


def episode_problem(value: object) -> str | None:
    """Why ``value`` is not an episode id (:data:`EPISODE_ID_GRAMMAR`), or None when it is one.

    The same grammar holds wherever an id comes from (URL, header, ``_meta``, the admin API), so
    every episode can be named in an episode URL and in ``/api/episodes/<id>``.
    """
    if not isinstance(value, str):
        return f"an episode id is a string, not {type(value).__name__} ({EPISODE_ID_GRAMMAR})"
    if len(value) > MAX_EPISODE_ID:
        return f"episode id of {len(value)} characters is too long ({EPISODE_ID_GRAMMAR})"
    if _EPISODE_ID.fullmatch(value) is None:
        shown = value if len(value) <= 40 else value[:40] + "…"
        return f"episode id {shown!r} is malformed ({EPISODE_ID_GRAMMAR})"
    return None


def agreed_episode(url: str | None, header: str | None, meta: Any) -> str | None:
    """The one episode a request names in its URL, ``X-Replay-Episode`` header and ``_meta``, checked.

    Args:
        url: The id in an episode-scoped URL (None on ``/mcp/<server>`` and stdio).
        header: The ``X-Replay-Episode`` header's value (None when not sent).
        meta: The request's ``_meta`` object (its ``replay-sim/episode`` entry counts), or None.

    Returns:
        The id they name (None when none names one).

    Raises:
        EpisodeError: An id is malformed, or two of them name different episodes (status 400).
    """
    named: dict[str, Any] = {}
    if url is not None:
        named["the URL"] = url
    if header:
        named["the X-Replay-Episode header"] = header
    if isinstance(meta, dict) and meta.get(EPISODE_META_KEY) not in (None, ""):
        named[f'_meta["{EPISODE_META_KEY}"]'] = meta[EPISODE_META_KEY]
    if not named:
        return None
    for where, value in named.items():
        if (problem := episode_problem(value)) is not None:
            raise EpisodeError(f"{problem}, in {where}")
    ids = set(named.values())
    if len(ids) > 1:
        said = ", ".join(f"{where} names {value!r}" for where, value in named.items())
        raise EpisodeError(
            f"this request names two episodes ({said}): name one, the same in every place, "
            "or leave all but one out"
        )
    return str(ids.pop())


def plain_call_params(method: str, params: Any) -> bool:
    """Whether the params of a call of :data:`FAST_CALL_PARAMS` are what the SDK takes as they are:
    no other member, a string ``uri`` or ``name``, an object (or no) ``arguments``, of strings for a
    prompt."""
    if not isinstance(params, dict) or params.keys() - FAST_CALL_PARAMS[method]:
        return False
    meta = params.get("_meta")
    if isinstance(meta, dict) and MIN_CONFIDENCE_META_KEY in meta:
        return False  # its own operating point: judged on the way the replay answers, not prepared
    if method == "resources/read":
        return isinstance(params.get("uri"), str)
    arguments = params.get("arguments")
    if not isinstance(params.get("name"), str) or not (arguments is None or isinstance(arguments, dict)):
        return False
    return method != "prompts/get" or not arguments or all(isinstance(v, str) for v in arguments.values())


def episode_path(episode: str, server: str) -> str:
    """The path of ``server``'s endpoint scoped to ``episode``: ``/episodes/<id>/mcp/<server>``."""
    return f"{EPISODES_PATH}{episode}/mcp/{server}"


FORWARDED_CAPABILITIES = ("sampling", "elicitation", "roots")
"""Client capabilities a server asks about with server→client requests, as the wire names them."""


def declared(ctx: ServerRequestContext[Any, Any]) -> dict[str, Any]:
    """What this request's client declared it can be asked (sampling, elicitation, roots), as wire JSON.

    A server asks a client only what it declared, and answers differently otherwise.
    """
    capabilities = ctx.session.client_capabilities
    if capabilities is None:
        return {}
    wire = capabilities.model_dump(by_alias=True, mode="json", exclude_none=True)
    return {k: v for k, v in wire.items() if k in FORWARDED_CAPABILITIES}


def error_json(exc: MCPError) -> dict[str, Any]:
    """A JSON-RPC error as it is recorded: ``code``, ``message`` and ``data``."""
    return {"code": exc.error.code, "message": exc.error.message, "data": exc.error.data}


def is_client_request(message: dict[str, Any]) -> bool:
    """Whether a recorded message of a call is a server→client request (it holds the client's answer).

    A call's recorded messages are what the server sent while it ran, in order: notifications
    (``method``, ``params``) and server→client requests, which also hold ``result`` or ``error``.
    """
    return "result" in message or "error" in message
