"""Differences of shaped strings: path spellings, numbers written as strings, dates and times.

For each, how to take it out and how to make it (:mod:`replay_sim.variants`); for numbers also
which kinds of difference a pair changed and a value's canonical spelling takes out.
"""

from __future__ import annotations

import json
import re
from typing import Any

from replay_sim.canonical import canonical_json, normalize

__all__ = [
    "add_parent",
    "at_midnight",
    "date_only",
    "dot",
    "double_separator",
    "number_changes",
    "number_needs",
    "padded_hour",
    "repad_hour",
    "resolve_parents",
    "respell_number",
    "single_separators",
    "to_number",
    "toggle_seconds",
    "trail",
    "undot",
    "untrail",
    "without_seconds",
]

_MAX_CHARS = 1000  # longer strings are prose nobody retypes in another spelling


# --- paths: a string with a separator, not a URL or other scheme (``http:``, ``C:``, ``HEAD:``)

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def _is_path(value: Any) -> bool:
    return (
        isinstance(value, str)
        and "/" in value
        and len(value) <= _MAX_CHARS
        and value == value.strip()
        and not any(c in value for c in "\n\r\t")
        and not _SCHEME.match(value)
    )


def single_separators(value: Any) -> Any:
    return re.sub(r"/{2,}", "/", value) if _is_path(value) else value


def double_separator(value: Any) -> Any | None:
    if not _is_path(value):
        return None
    if "//" in value:
        return single_separators(value)
    inner = re.search(r"(?<=[^/])/(?=[^/])", value)
    return None if inner is None else f"{value[: inner.start()]}//{value[inner.end() :]}"


def undot(value: Any) -> Any:
    return re.sub(r"^(?:\./)+(?=[^/])", "", value) if _is_path(value) else value


def dot(value: Any) -> Any | None:
    if not _is_path(value):
        return None
    if value.startswith("./"):
        undotted = undot(value)
        return undotted if undotted != value else None
    if value.startswith(("/", "../", "~")):
        return None  # not relative to the current folder: "./" would change what it names
    return f"./{value}"


def resolve_parents(value: Any) -> Any:
    """``a/b/../c`` → ``a/c``: each ``..`` cancels the name before it, never above the path's start."""
    if not _is_path(value) or ".." not in value:
        return value
    head = "/" if value.startswith("/") else ""
    out: list[str] = []
    for part in value[len(head) :].split("/"):
        if part == ".." and out and out[-1] not in ("", ".", ".."):
            out.pop()
        else:
            out.append(part)
    return (head + "/".join(out)) or "."


def add_parent(value: Any) -> Any | None:
    if not _is_path(value):
        return None
    resolved = resolve_parents(value)
    if resolved != value:
        return resolved
    parts = value.split("/")
    for i, part in enumerate(parts[:-1]):
        if part not in ("", ".", ".."):
            return "/".join([*parts[: i + 1], "..", *parts[i:]])
    return None


def untrail(value: Any) -> Any:
    return (value.rstrip("/") or "/") if _is_path(value) else value


def trail(value: Any) -> Any | None:
    if not _is_path(value):
        return None
    if value.endswith("/"):
        return value.rstrip("/") or None  # the root has no other spelling
    return f"{value}/"


# --- numbers: JSON number syntax (no leading zeros: "007" is a code, not seven)

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


def to_number(value: Any) -> Any:
    if isinstance(value, str) and len(value) <= 40 and _NUMBER.fullmatch(value):
        try:
            return normalize(json.loads(value))
        except ValueError:  # beyond a float ("1e999")
            return value
    if isinstance(value, float):
        return normalize(value)
    return value


def respell_number(value: Any) -> Any | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return canonical_json(value)
    number = to_number(value)
    return number if number is not value else None


# --- dates and times (ISO 8601 spellings, no time zone conversions)

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_MIDNIGHT = re.compile(r"(\d{4}-\d{2}-\d{2})T00:00:00")
_CLOCK = re.compile(
    r"(?P<head>(?:\d{4}-\d{2}-\d{2}[T ])?\d{1,2}:\d{2})(?P<seconds>:00(?:\.0+)?)?(?P<zone>Z|[+-]\d{2}:\d{2})?"
)
_HOUR = re.compile(r"(\d{1,2})(:\d{2}(?::\d{2}(?:\.\d+)?)?)")


def date_only(value: Any) -> Any:
    found = _MIDNIGHT.fullmatch(value) if isinstance(value, str) else None
    return found[1] if found else value


def at_midnight(value: Any) -> Any | None:
    if not isinstance(value, str):
        return None
    if _DATE.fullmatch(value):
        return f"{value}T00:00:00"
    found = _MIDNIGHT.fullmatch(value)
    return found[1] if found else None


def without_seconds(value: Any) -> Any:
    found = _CLOCK.fullmatch(value) if isinstance(value, str) else None
    if found is None or found["seconds"] is None:
        return value
    return found["head"] + (found["zone"] or "")


def toggle_seconds(value: Any) -> Any | None:
    found = _CLOCK.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        return None
    seconds = "" if found["seconds"] else ":00"
    return found["head"] + seconds + (found["zone"] or "")


def padded_hour(value: Any) -> Any:
    found = _HOUR.fullmatch(value) if isinstance(value, str) else None
    return f"0{value}" if found and len(found[1]) == 1 else value


def repad_hour(value: Any) -> Any | None:
    found = _HOUR.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        return None
    if len(found[1]) == 1:
        return f"0{value}"
    return value[1:] if value.startswith("0") else None  # "10:00" has one spelling


def number_needs(value: Any) -> frozenset[str]:
    """What reading ``value`` as a number takes out: its ``type`` (a string), and a ``spelling``
    other than the number's own (``"2.50"``, ``"1e2"``)."""
    number = to_number(value)
    if not isinstance(value, str) or number is value:
        return frozenset()
    return frozenset({"type", "spelling"}) if canonical_json(number) != value else frozenset({"type"})


def number_changes(a: Any, b: Any) -> frozenset[str]:
    """How two spellings of one number differ: ``type`` (``2`` vs ``"2"``), ``spelling`` (``"2.50"``)."""
    if a == b or canonical_json(to_number(a)) != canonical_json(to_number(b)):
        return frozenset()
    found = set()
    if isinstance(a, str) != isinstance(b, str):
        found.add("type")
    if (a if isinstance(a, str) else canonical_json(a)) != (b if isinstance(b, str) else canonical_json(b)):
        found.add("spelling")
    return frozenset(found)
