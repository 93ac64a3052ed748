"""What a line read from a stdio client is: a JSON-RPC message for the server, or the error answering it.

Never left hanging (see :mod:`replay_sim.stdio_transport`): a line that is not JSON, or JSON nested
deeper than :data:`~replay_sim.untrusted.MAX_DEPTH` levels, gets a ``-32700`` parse error (id
null); JSON that is not a JSON-RPC message ``-32600`` (with its id when it has one); a request
whose id is neither a string nor an integer ``-32600`` with id null; a line dropped for its length
``-32600`` naming the cap.
"""

from __future__ import annotations

import mcp_types as types
import pydantic_core
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from replay_sim import untrusted
from replay_sim.errors import NestingError
from replay_sim.stdio_transport.lines import TooLong
from replay_sim.stdio_transport.requests import leading_id

__all__ = ["MAX_LINE_ENV", "read_line"]

MAX_LINE_ENV = "REPLAY_SIM_MAX_LINE_BYTES"
"""Environment variable overriding the stdio faces' longest request line (bytes)."""


def _error(id_: int | str | None, code: int, message: str) -> SessionMessage:
    return SessionMessage(
        types.JSONRPCError(jsonrpc="2.0", id=id_, error=types.ErrorData(code=code, message=message))
    )


def _refusal(line: bytes | TooLong, max_line: int) -> SessionMessage:
    """The error answering a line that is not a JSON-RPC message."""
    if isinstance(line, TooLong):
        return _error(
            leading_id(line.head),
            types.INVALID_REQUEST,
            f"request too large: a {line.size}-byte line is over the {max_line}-byte limit of this "
            f"stdio server (set {MAX_LINE_ENV} to raise it); it was not read",
        )
    try:
        data = untrusted.loads(line)
    except NestingError as exc:
        return _error(None, types.PARSE_ERROR, f"Parse error: {exc}")
    except ValueError as exc:
        return _error(None, types.PARSE_ERROR, f"Parse error: not JSON ({exc})")
    id_ = data.get("id") if isinstance(data, dict) else None
    return _error(
        id_ if isinstance(id_, int | str) and not isinstance(id_, bool) else None,
        types.INVALID_REQUEST,
        "Invalid Request: not a JSON-RPC 2.0 request, notification or response",
    )


def read_line(line: bytes | TooLong, max_line: int) -> tuple[SessionMessage, bool]:
    """What a request line is: its JSON-RPC message for the server, or the error answering it.

    Never raises, whatever the line holds (any bytes, any nesting, any size).

    Args:
        line: A line read (without its newline), or a line dropped for its length.
        max_line: The cap it was read under (named in the error answering a dropped line).

    Returns:
        ``(message, True)``: the message, for the server; ``(error, False)``: the ``-32700`` or
        ``-32600`` error answering the line.
    """
    if isinstance(line, bytes):
        try:
            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValidationError:
            pass
        else:
            if isinstance(message, types.JSONRPCNotification) and _has_id(line):
                return _error(None, types.INVALID_REQUEST, _BAD_ID), False
            return SessionMessage(message), True
    return _refusal(line, max_line), False


_BAD_ID = "Invalid Request: a request's id must be a string or an integer"


def _has_id(line: bytes) -> bool:
    """Whether a line the SDK read as a notification has an ``id`` member (one it cannot take)."""
    try:
        data = pydantic_core.from_json(line)
    except ValueError:
        return False
    return isinstance(data, dict) and "id" in data
