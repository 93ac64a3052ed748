"""What a request line is to a :class:`~replay_sim.stdio_transport.Shortcut`: its request, its id, its era.

:func:`request_of` parses a line into the JSON-RPC request a shortcut may answer. :class:`Opening`
follows what a connection's first requests settled. :class:`Repeated` splits a line into its id
and the rest (the line's *template*): a client repeating a call writes the same line with another
id, so a shortcut that answered a template once can answer it again without parsing the line,
once :meth:`Repeated.holds` has shown that the id it cut out is the request's only id.
"""

from __future__ import annotations

import json
import re
from typing import Any

import mcp_types as types
import pydantic_core
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

__all__ = ["Opening", "Repeated", "leading_id", "request_of"]

# The id of a request line, when it is the first member (or follows "jsonrpc"), as SDKs write it.
_LEADING_ID = re.compile(rb'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")')
_NUMBER = re.compile(rb"-?[1-9][0-9]{0,17}|-?0")  # a JSON integer Python reads as JSON does


def request_of(line: bytes) -> dict[str, Any] | None:
    """A request line's JSON-RPC request (it has an ``id`` and a ``method``), or None: a
    notification, a response, not a message, or a request whose id is no string or integer (which
    the transport answers with an error) — what a :class:`Shortcut` leaves to the server."""
    try:
        request = pydantic_core.from_json(line)
    except ValueError:
        return None
    if not isinstance(request, dict) or not isinstance(request.get("method"), str):
        return None
    id_ = request.get("id")
    return request if type(id_) is int or isinstance(id_, str) else None


def leading_id(line: bytes) -> int | str | None:
    """The id of a request line that cannot be read whole, if it leads the line."""
    match = _LEADING_ID.match(line)
    if match is None:
        return None
    try:
        value = json.loads(match.group(1))
    except ValueError:  # leading zeros
        return None
    return value if isinstance(value, int | str) else None


class Repeated:
    """A request line cut into its leading id and its template (the line without the id).

    Two lines with one template are one request with two ids — once :meth:`holds` has shown, for
    that template, that the id cut out is the one a JSON parser reads (no other ``"id"`` member
    overrides it, nothing follows the number). A line whose id does not lead it has no template.

    Attributes:
        template: The line with its id cut out.
        id: The id, as a JSON parser reads it.
    """

    __slots__ = ("_at", "id", "template")

    def __init__(self, template: bytes, id_: int | str, at: int) -> None:
        self.template = template
        self.id = id_
        self._at = at

    @classmethod
    def split(cls, line: bytes) -> Repeated | None:
        """The line's template and id, or None when its id does not lead it (or is no int or string)."""
        match = _LEADING_ID.match(line)
        if match is None:
            return None
        token = match.group(1)
        if token[0] == 34:  # a string: "..."
            try:
                id_: int | str = pydantic_core.from_json(token)
            except ValueError:
                return None
        elif _NUMBER.fullmatch(token):
            id_ = int(token)
        else:
            return None  # leading zeros, or more digits than are worth a fast path
        start, end = match.span(1)
        return cls(line[:start] + line[end:], id_, start)

    def holds(self, request: dict[str, Any]) -> bool:
        """Whether the template is ``request`` (this line, parsed) but for its id: every line of it is."""
        try:
            other = pydantic_core.from_json(self.template[: self._at] + b"null" + self.template[self._at :])
        except ValueError:
            return False
        return isinstance(other, dict) and other == {**request, "id": None}


class Opening:
    """What a stdio connection's first requests settled, for a :class:`Shortcut`.

    The client's first request decides its era for the SDK (a request carrying the 2026 ``_meta``
    envelope opens a modern connection, anything else a handshake one), so the server must see
    it; a handshake-era connection serves calls once the server has answered ``initialize``.
    """

    def __init__(self) -> None:
        self.modern: bool | None = None
        """The era the first request opened (None: no request yet)."""
        self.version: str | None = None
        """The handshake's protocol version, once the server answered ``initialize``."""
        self._initialize: Any = None

    def request(self, request: dict[str, Any], modern: bool) -> bool:
        """See a request (``modern``: it carries the 2026 envelope); True when the server must see it."""
        method = request.get("method")
        if method == "initialize" and self.version is None:
            self._initialize = request.get("id")
        if self.modern is None:
            self.modern = modern and method != "initialize"
            return True
        return False

    def ready(self, modern: bool) -> bool:
        """Whether a request of that era may be answered by the shortcut (the era is the connection's)."""
        return self.modern is modern and (modern or self.version is not None)

    def sent(self, message: types.JSONRPCMessage) -> None:
        """See a message the server writes: its answer to ``initialize`` settles the handshake's version."""
        if self._initialize is None or getattr(message, "id", None) != self._initialize:
            return
        result = getattr(message, "result", None)
        version = result.get("protocolVersion") if isinstance(result, dict) else None
        if isinstance(version, str) and version in HANDSHAKE_PROTOCOL_VERSIONS:
            self.version = version
        self._initialize = None
