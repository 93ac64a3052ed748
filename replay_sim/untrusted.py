"""JSON a peer sent, read with one bound on how deeply it nests.

A 2 KB line of ``[[[[…]]]]`` nested 1,100 deep makes ``json.loads`` raise ``RecursionError`` (not a
``ValueError``), and a value nested a few hundred deep makes every recursive walk of it (redaction,
canonical keys, ``json.dumps``) raise it later, deep inside serving. So every parser of untrusted
input — the stdio transport, the HTTP router and fast path, the recorder's pass-through, the
replayed requests' handlers, the Ray front — reads through :func:`loads` or checks what the SDK
parsed with :func:`check_depth`: JSON nested deeper than :data:`MAX_DEPTH` levels is refused with
:class:`~replay_sim.errors.NestingError` (a ``ValueError``), which the transports answer with
``-32700`` (parse error) and go on serving.

:data:`MAX_DEPTH` is the limit of the SDK's own JSON parser (pydantic-core's jiter), so a message
is refused alike whichever path reads it: the SDK's handshake-era HTTP and stdio paths already
refuse deeper JSON, its 2026-era HTTP path (``json.loads``) does not.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from replay_sim.errors import NestingError

__all__ = ["MAX_DEPTH", "TOO_DEEP", "check_depth", "check_request", "loads", "too_deep"]

MAX_DEPTH = 201
"""The deepest level of a value read (the top-level value is 1, its members 2, …): pydantic-core's limit."""
TOO_DEEP = f"JSON nested deeper than {MAX_DEPTH} levels is not read: send flatter JSON"
"""What refusing such JSON says."""


def loads(data: bytes | bytearray | str) -> Any:
    """Parse JSON a peer sent.

    Args:
        data: The JSON text (UTF-8 bytes, or str).

    Returns:
        The parsed value, nested at most :data:`MAX_DEPTH` deep.

    Raises:
        NestingError: It nests deeper (a ``ValueError``).
        ValueError: It is not JSON (``json.JSONDecodeError``, ``UnicodeDecodeError``).
    """
    try:
        value = json.loads(data)
    except RecursionError:
        raise NestingError(TOO_DEEP) from None
    if _may_nest_deep(data):
        check_depth(value)
    return value


def check_depth(value: Any) -> None:
    """Refuse a parsed value nested deeper than :data:`MAX_DEPTH` (walked without recursion).

    Raises:
        NestingError: It nests deeper.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list):
            continue  # a scalar at the top
        children = item.values() if isinstance(item, dict) else item
        if children and depth >= MAX_DEPTH:  # its members would be deeper
            raise NestingError(TOO_DEEP)
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


def check_request(params: Any) -> None:
    """Refuse a request whose params the SDK parsed nested deeper than :data:`MAX_DEPTH`.

    For handlers: the SDK's 2026-era HTTP path parses bodies with ``json.loads``, which reads
    JSON a few hundred levels deeper than the router checks (bodies over its peek).

    Raises:
        MCPError: ``-32600`` (invalid request) saying so.
    """
    try:
        check_depth(params)
    except NestingError as exc:
        raise MCPError(types.INVALID_REQUEST, f"Invalid Request: {exc}") from None


def too_deep(data: bytes | bytearray | str) -> bool:
    """Whether JSON text nests deeper than :data:`MAX_DEPTH` (False for text that is not JSON).

    Cheap for the usual body: only text with more than :data:`MAX_DEPTH` brackets is parsed.
    """
    if not _may_nest_deep(data):
        return False
    try:
        loads(data)
    except NestingError:
        return True
    except ValueError:
        return False
    return False


def _may_nest_deep(data: bytes | bytearray | str) -> bool:
    """Whether text has enough opening brackets to nest deeper than :data:`MAX_DEPTH`."""
    if isinstance(data, str):
        return data.count("[") + data.count("{") >= MAX_DEPTH
    return data.count(b"[") + data.count(b"{") >= MAX_DEPTH
