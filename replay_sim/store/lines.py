"""One line of the JSONL interchange format, parsed and checked field by field before it is stored.

A line that is not what the format says (DESIGN.md "Interchange format") is refused with the file,
the line number and the field, so nothing a replay later cannot serve gets into a store: a listing
or server info that is not an object, a call's arguments that are not an object, a latency that is
not a finite number of milliseconds within a day, JSON nested deeper than :data:`MAX_NESTING`, the
non-JSON constants ``NaN`` and ``Infinity``, or a field the format does not have.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

import mcp_types
from pydantic import ValidationError

from replay_sim.errors import InterchangeError
from replay_sim.protocol import CALL_METHODS, LISTING_FIELDS
from replay_sim.store.records import Origin

__all__ = ["MAX_LATENCY_MS", "MAX_NESTING", "parse_line"]

MAX_NESTING = 128
"""Deepest nesting of objects and arrays a line may hold (the line's own object is level 1).

Deeper JSON is no MCP message a real server sends, and Python's recursive readers (the JSON
parser, canonical keys, validation) fail on it near 1,000 levels."""
MAX_LATENCY_MS = 86_400_000.0
"""The longest latency a call may be recorded with (a day): ``--latency recorded`` holds an answer
that long."""
_MAX_SEQ = 2**63 - 1  # SQLite's INTEGER

_FIELDS = {
    "server": ("type", "server", "info", "capabilities", "protocol_version", "instructions"),
    "listing": ("type", "server", "method", "result"),
    "call": (
        "type", "server", "method", "params", "result", "error", "session", "seq", "latency_ms",
        "recorded_at", "origin", "notifications",
    ),
}  # fmt: skip
_ORIGINS = tuple(origin.value for origin in Origin)


def _not_json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is too large for a double")
    return value


def _nesting(value: Any) -> int:
    """How deeply objects and arrays nest in ``value`` (without recursion; stops past the limit)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_NESTING:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_line(text: str, where: str) -> tuple[str, dict[str, Any]] | None:
    """Parse and check one line of an interchange file.

    Args:
        text: The line, without its newline.
        where: ``FILE:LINE``, the start of every error message.

    Returns:
        ``(type, object)``, or None for a blank line.

    Raises:
        InterchangeError: The line is not JSON, or not a line of the format (names the field).
    """
    if not text.strip():
        return None
    try:
        obj = json.loads(text, parse_constant=_not_json_constant, parse_float=_finite)
    except RecursionError:
        raise InterchangeError(f"{where}: JSON nested deeper than {MAX_NESTING} levels") from None
    except json.JSONDecodeError as exc:
        raise InterchangeError(f"{where}: not JSON ({exc.msg}, column {exc.colno})") from None
    except ValueError as exc:  # NaN, Infinity, an overflowing number, an integer of too many digits
        raise InterchangeError(f"{where}: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise InterchangeError(f"{where}: expected a JSON object, got {_kind(obj)}")
    if _nesting(obj) > MAX_NESTING:
        raise InterchangeError(f"{where}: JSON nested deeper than {MAX_NESTING} levels")
    kind = obj.get("type")
    if not isinstance(kind, str) or kind not in _FIELDS:
        raise InterchangeError(f"{where}: unknown line type {kind!r} (server, listing, call)")
    unknown = sorted(set(obj) - set(_FIELDS[kind]))
    if unknown:
        raise InterchangeError(
            f"{where}: unknown field {unknown[0]!r} in a {kind} line (its fields: {', '.join(_FIELDS[kind])})"
        )
    line = _Line(obj, where)
    line.text("server", required=True)
    {"server": _check_server, "listing": _check_listing, "call": _check_call}[kind](line)
    return kind, obj


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}.get(
        type(value), "an object"
    )


class _Line:
    """One line's object, with checks of its fields that raise naming the field."""

    def __init__(self, obj: dict[str, Any], where: str) -> None:
        self.obj = obj
        self.where = where

    def fail(self, field: str, problem: str) -> InterchangeError:
        return InterchangeError(f"{self.where}: field {field!r}: {problem}")

    def present(self, field: str, required: bool) -> bool:
        if field in self.obj and self.obj[field] is not None:
            return True
        if required:
            raise InterchangeError(f"{self.where}: missing field {field!r}")
        return False

    def object(self, field: str, *, required: bool = False) -> None:
        if self.present(field, required) and not isinstance(self.obj[field], dict):
            raise self.fail(field, f"must be an object, got {_kind(self.obj[field])}")

    def text(self, field: str, *, required: bool = False) -> None:
        if not self.present(field, required):
            return
        value = self.obj[field]
        if not isinstance(value, str) or not value:
            raise self.fail(field, f"must be a non-empty string, got {_kind(value)}")

    def model(self, field: str, model: type[Any], value: Any = None) -> None:
        """Check the field (or a value inside it) against an MCP type, as serving reads it."""
        try:
            model.model_validate(self.obj[field] if value is None else value)
        except ValidationError as exc:
            error = exc.errors()[0]
            at = ".".join(str(part) for part in error["loc"])
            raise self.fail(
                field, f"not an MCP {model.__name__}: {at + ': ' if at else ''}{error['msg']}"
            ) from None


def _check_server(line: _Line) -> None:
    line.object("info", required=True)
    info = line.obj["info"]
    for field in ("name", "version", "title", "description", "websiteUrl"):
        if info.get(field) is not None and not isinstance(info[field], str):
            raise line.fail("info", f"its {field!r} must be a string, got {_kind(info[field])}")
    if info.get("icons") is not None:
        if not isinstance(info["icons"], list):
            raise line.fail("info", f"its 'icons' must be an array, got {_kind(info['icons'])}")
        for icon in info["icons"]:
            line.model("info", mcp_types.Icon, icon)
    line.object("capabilities")
    if line.obj.get("capabilities") is not None:
        line.model("capabilities", mcp_types.ServerCapabilities)
    line.text("protocol_version")
    if line.present("instructions", False) and not isinstance(line.obj["instructions"], str):
        raise line.fail("instructions", f"must be a string, got {_kind(line.obj['instructions'])}")


def _check_listing(line: _Line) -> None:
    line.text("method", required=True)
    method = line.obj["method"]
    if method not in LISTING_FIELDS:
        raise line.fail("method", f"{method!r} is not a listing method ({', '.join(LISTING_FIELDS)})")
    line.object("result", required=True)
    items = line.obj["result"].get(LISTING_FIELDS[method])
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise line.fail("result", f"a {method} result holds {LISTING_FIELDS[method]!r}, an array of objects")


def _check_call(line: _Line) -> None:
    obj = line.obj
    line.text("method", required=True)  # before the lookups: a list or an object is unhashable
    if obj["method"] not in CALL_METHODS:
        raise line.fail(
            "method", f"{obj['method']!r} is not a recorded call ({', '.join(sorted(CALL_METHODS))})"
        )
    line.object("params")
    _check_params(line, obj["method"], obj.get("params") or {})
    line.object("result")
    line.object("error")
    if obj.get("result") is None and obj.get("error") is None:
        raise InterchangeError(f"{line.where}: a call needs a result or an error")
    if obj.get("error") is not None:
        code, message = obj["error"].get("code"), obj["error"].get("message")
        if not isinstance(code, int) or isinstance(code, bool) or not isinstance(message, str):
            raise line.fail("error", "a JSON-RPC error has an integer 'code' and a string 'message'")
    line.text("session")
    if line.present("seq", False):
        seq = obj["seq"]
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= _MAX_SEQ:
            raise line.fail("seq", f"must be a whole number from 0, got {seq!r}")
    if line.present("latency_ms", False):
        latency = obj["latency_ms"]
        if (
            isinstance(latency, bool)
            or not isinstance(latency, int | float)
            or not 0 <= latency <= MAX_LATENCY_MS
        ):
            raise line.fail(
                "latency_ms", f"must be milliseconds from 0 to {MAX_LATENCY_MS:.0f}, got {latency!r}"
            )
    if line.present("recorded_at", False):
        try:
            datetime.fromisoformat(obj["recorded_at"])
        except (TypeError, ValueError):
            raise line.fail("recorded_at", f"must be an ISO-8601 time, got {obj['recorded_at']!r}") from None
    if line.present("origin", False) and obj["origin"] not in _ORIGINS:
        raise line.fail("origin", f"must be one of {', '.join(_ORIGINS)}, got {obj['origin']!r}")
    if line.present("notifications", False) and not (
        isinstance(obj["notifications"], list) and all(isinstance(n, dict) for n in obj["notifications"])
    ):
        raise line.fail("notifications", "must be an array of notification objects")


def _check_params(line: _Line, method: str, params: dict[str, Any]) -> None:
    """What a call's params name it by (a tool's name, a resource's uri …) has the type MCP gives it.

    Absent is allowed: a client may have sent such a call, and its recorded answer is the server's
    refusal.
    """
    named = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}.get(method)
    if named is not None and params.get(named) is not None and not isinstance(params[named], str):
        raise line.fail(f"params.{named}", f"must be a string, got {_kind(params[named])}")
    arguments = params.get("arguments")
    if method in ("tools/call", "prompts/get") and arguments is not None and not isinstance(arguments, dict):
        raise line.fail("params.arguments", f"must be an object, got {_kind(arguments)}")
    ref = params.get("ref")
    if method == "completion/complete" and ref is not None and not isinstance(ref, dict):
        raise line.fail("params.ref", f"must be an object, got {_kind(ref)}")
