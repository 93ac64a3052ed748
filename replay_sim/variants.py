"""The differences of an argument that a server may ignore: one registry, two users.

Each :class:`Transform` names one kind of difference. Its entry in the registry is two small
functions: ``apply`` takes the difference out of a value (a canonical spelling, used by the
resolver's canonical tier once the recordings show the server ignores it) and ``vary`` makes one
(used by the recorder to ask the real server). Neither side assumes a difference is ignored:
:mod:`replay_sim.resolve.invariance` learns it from recorded pairs. Adding a kind is one member of
:class:`Transform` and one :class:`Family` entry in ``_FAMILIES``.

Each kind is chosen by the value's shape (a path is a string with a ``/``, a time is ``H:MM``…) and
is as narrow as one spelling: a server that ignores a trailing ``/`` may still treat ``a//b`` or
``a/../b`` differently (a symlink), so each is learned on its own.

The order of the members is the order in which learned transforms apply to one argument: a
learned default first (it fills the value the others then spell canonically), whitespace before
anything that parses the string, and each transform after those whose output it reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from enum import StrEnum
from typing import Any, NamedTuple

import jsonschema
from jsonschema.exceptions import SchemaError
from referencing.exceptions import Unresolvable

from replay_sim.canonical import canonical_json, normalize
from replay_sim.freetext import looks_like_code, outside_literals

__all__ = ["CASE_CLASSES", "MIN_EVIDENCE", "Family", "Transform", "case_changes", "fold_case"]

_MAX_CHARS = 1000  # longer strings are prose nobody retypes in another spelling

MIN_EVIDENCE = 2
"""Distinct answers that must support a learned invariance."""


class Transform(StrEnum):
    """A difference of one argument that a server may ignore (applied in this order)."""

    DEFAULT = "default"
    """The argument left out vs given explicitly with the value the server assumes without it."""
    SPACE = "space"
    """Surrounding whitespace of a string (``" chess "`` vs ``"chess"``)."""
    CASE = "case"
    """Letter case of a string (``"Chess"`` vs ``"chess"``); in code, outside its quoted literals
    (``select * from t where name = 'Widget'`` vs ``SELECT * FROM T WHERE NAME = 'Widget'``)."""
    PATH_SEP = "path-sep"
    """Repeated separators in a path (``a//b`` vs ``a/b``)."""
    PATH_DOT = "path-dot"
    """A ``./`` prefix of a relative path (``./a/b`` vs ``a/b``)."""
    PATH_UP = "path-up"
    """``..`` segments that resolve inside the path (``a/../a/b`` vs ``a/b``)."""
    PATH_SLASH = "path-slash"
    """A trailing separator of a path (``a/b/`` vs ``a/b``)."""
    NUMBER = "number"
    """A number vs the same number written as a string (``1`` vs ``"1"``, ``"2.50"`` vs ``2.5``)."""
    MIDNIGHT = "midnight"
    """A date vs the same date at midnight (``2026-01-15`` vs ``2026-01-15T00:00:00``)."""
    SECONDS = "seconds"
    """A time with and without zero seconds (``09:00`` vs ``09:00:00``)."""
    HOUR_PAD = "hour-pad"
    """An hour with and without its leading zero (``9:00`` vs ``09:00``)."""
    DUPLICATES = "duplicates"
    """Repeated items of an array (``["a", "a", "b"]`` vs ``["a", "b"]``)."""
    ORDER = "order"
    """The order of an array's items (``["b", "a"]`` vs ``["a", "b"]``)."""

    def apply(self, value: Any) -> Any:
        """The value with this difference taken out (values it does not apply to are unchanged)."""
        return _FAMILIES[self].apply(value)

    def vary(self, value: Any, schema: dict[str, Any] | None = None) -> Any | None:
        """A value that differs from ``value`` only by this difference (None when there is none).

        Args:
            value: The argument's value.
            schema: The argument's JSON Schema (its entry in the tool's ``properties``), if known.
                A variant the schema does not allow is never made; a variant of another JSON type
                (``1`` → ``"1"``) is made only when the schema is known and allows it.
        """
        family = _FAMILIES[self]
        if family.retypes and schema is None:
            return None
        varied = family.vary(value)
        if varied is None or (schema is not None and not _fits(varied, schema, strict=family.retypes)):
            return None
        return varied

    def vary_call(
        self, arguments: dict[str, Any], name: str, input_schema: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """A call's arguments with argument ``name`` varied by this difference (None when none is valid).

        Unlike :meth:`vary`, this can also leave an argument out (:attr:`DEFAULT`): only when the
        tool's ``input_schema`` is known, does not require it and declares no default for it (a
        declared default already makes absent and explicit calls equal).
        """
        tool = input_schema if isinstance(input_schema, dict) else {}
        props = tool.get("properties")
        props = props if isinstance(props, dict) else {}
        if self is Transform.DEFAULT:
            required = tool.get("required")
            prop = props.get(name)
            if (
                input_schema is None
                or arguments.get(name) is None
                or name in (required if isinstance(required, list) else ())
                or (isinstance(prop, dict) and "default" in prop)
            ):
                return None
            return {k: v for k, v in arguments.items() if k != name}
        prop = props.get(name)
        varied = self.vary(arguments[name], prop if isinstance(prop, dict) else None)
        return None if varied is None else {**arguments, name: varied}


class Family(NamedTuple):
    """One kind of difference: how to take it out and how to make it."""

    apply: Callable[[Any], Any]
    """The value in canonical spelling (values it does not apply to are returned unchanged)."""
    vary: Callable[[Any], Any | None]
    """Another spelling of the value, or None; never checked against a schema here."""
    retypes: bool = False
    """Its variants have another JSON type: made only when the schema is known to allow them."""


def _same(value: Any) -> Any:
    return value


def _none(value: Any) -> None:
    return None


def _words(value: Any) -> bool:
    """A string someone could retype in another spelling (not empty, not prose-long)."""
    return isinstance(value, str) and bool(value.strip()) and len(value) <= _MAX_CHARS


# --- whitespace, case, order, duplicates


def _strip(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def _pad(value: Any) -> Any | None:
    if not _words(value):
        return None
    return value.strip() if value != value.strip() else f" {value} "


def _fold(value: Any) -> Any:
    return outside_literals(value, str.casefold) if isinstance(value, str) else value


# --- which characters a difference of letter case changed

_CASE_TOKEN = re.compile(r"[^\W\d_]\w*")
_SQL_KEYWORDS = frozenset(
    {
        "select", "from", "where", "and", "or", "not", "in", "is", "null", "like", "order", "by",
        "group", "having", "limit", "offset", "asc", "desc", "insert", "into", "values", "update",
        "set", "delete", "create", "table", "drop", "alter", "add", "column", "index", "view", "join",
        "inner", "left", "right", "outer", "full", "cross", "on", "as", "distinct", "union", "all",
        "exists", "between", "case", "when", "then", "else", "end", "primary", "key", "foreign",
        "references", "default", "unique", "check", "with", "returning", "replace", "if", "glob",
        "escape", "collate", "nulls", "first", "last", "true", "false", "begin", "commit", "rollback",
        "pragma",
    }
)  # fmt: skip
CASE_CLASSES = ("keyword", "function", "identifier")
"""The token classes a letter-case difference is learned for, each on its own: a SQL keyword
(``SELECT``), a function name (a word before ``(``: ``count``), any other word (a name, a table)."""


def _token_class(text: str, token: re.Match[str], code: bool) -> str:
    if text[token.end() :].lstrip().startswith("("):
        return "function"
    return "keyword" if code and token.group().lower() in _SQL_KEYWORDS else "identifier"


def case_changes(a: Any, b: Any) -> frozenset[str]:
    """The token classes (:data:`CASE_CLASSES`) whose letter case differs between two spellings.

    ``SELECT name FROM t`` vs ``SELECT NAME FROM T`` changed identifiers only; ``count(*)`` vs
    ``COUNT(*)`` a function name. Empty unless both are strings equal but for letter case.
    """
    if not isinstance(a, str) or not isinstance(b, str) or a == b or _fold(a) != _fold(b):
        return frozenset()
    changed, code = set(), looks_like_code(a)
    for ta, tb in zip(_CASE_TOKEN.finditer(a), _CASE_TOKEN.finditer(b), strict=False):
        if ta.group() != tb.group():
            changed.add(_token_class(a, ta, code))
    return frozenset(changed)


def fold_case(value: Any, classes: frozenset[str]) -> Any:
    """``value`` with the letter case of the tokens of ``classes`` folded (outside quoted literals)."""
    if not isinstance(value, str) or not classes:
        return value
    if classes >= set(CASE_CLASSES):
        return _fold(value)

    code = looks_like_code(value)

    def change(part: str) -> str:
        return _CASE_TOKEN.sub(
            lambda t: t.group().casefold() if _token_class(part, t, code) in classes else t.group(), part
        )

    return outside_literals(value, change)


def _recase(value: Any) -> Any | None:
    if not _words(value):
        return None
    if looks_like_code(value):
        # Every letter's case swapped outside literals: upper to lower and lower to upper, on every
        # token class at once (keywords, function names, identifiers), so the answer covers each.
        swapped = outside_literals(value, str.swapcase)
        return None if swapped == value else swapped
    upper = outside_literals(value, str.upper)
    varied = upper if upper != value else outside_literals(value, str.lower)
    return None if varied == value else varied  # None: nothing with a case (outside literals)


def _sort(value: Any) -> Any:
    return sorted(value, key=canonical_json) if isinstance(value, list) else value


def _reverse(value: Any) -> Any | None:
    if isinstance(value, list) and list(reversed(value)) != value:
        return list(reversed(value))
    return None


def _dedupe(value: Any) -> Any:
    """The array without later repeats of an item (first occurrences keep their order)."""
    if not isinstance(value, list):
        return value
    seen: set[str] = set()
    out = []
    for item in value:
        key = canonical_json(item)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def _repeat(value: Any) -> Any | None:
    if not isinstance(value, list) or not value:
        return None
    deduped = _dedupe(value)
    return deduped if len(deduped) != len(value) else [value[0], *value]


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


def _single_separators(value: Any) -> Any:
    return re.sub(r"/{2,}", "/", value) if _is_path(value) else value


def _double_separator(value: Any) -> Any | None:
    if not _is_path(value):
        return None
    if "//" in value:
        return _single_separators(value)
    inner = re.search(r"(?<=[^/])/(?=[^/])", value)
    return None if inner is None else f"{value[: inner.start()]}//{value[inner.end() :]}"


def _undot(value: Any) -> Any:
    return re.sub(r"^(?:\./)+(?=[^/])", "", value) if _is_path(value) else value


def _dot(value: Any) -> Any | None:
    if not _is_path(value):
        return None
    if value.startswith("./"):
        undotted = _undot(value)
        return undotted if undotted != value else None
    if value.startswith(("/", "../", "~")):
        return None  # not relative to the current folder: "./" would change what it names
    return f"./{value}"


def _resolve_parents(value: Any) -> Any:
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


def _add_parent(value: Any) -> Any | None:
    if not _is_path(value):
        return None
    resolved = _resolve_parents(value)
    if resolved != value:
        return resolved
    parts = value.split("/")
    for i, part in enumerate(parts[:-1]):
        if part not in ("", ".", ".."):
            return "/".join([*parts[: i + 1], "..", *parts[i:]])
    return None


def _untrail(value: Any) -> Any:
    return (value.rstrip("/") or "/") if _is_path(value) else value


def _trail(value: Any) -> Any | None:
    if not _is_path(value):
        return None
    if value.endswith("/"):
        return value.rstrip("/") or None  # the root has no other spelling
    return f"{value}/"


# --- numbers: JSON number syntax (no leading zeros: "007" is a code, not seven)

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


def _to_number(value: Any) -> Any:
    if isinstance(value, str) and len(value) <= 40 and _NUMBER.fullmatch(value):
        try:
            return normalize(json.loads(value))
        except ValueError:  # beyond a float ("1e999")
            return value
    if isinstance(value, float):
        return normalize(value)
    return value


def _respell_number(value: Any) -> Any | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return canonical_json(value)
    number = _to_number(value)
    return number if number is not value else None


# --- dates and times (ISO 8601 spellings, no time zone conversions)

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_MIDNIGHT = re.compile(r"(\d{4}-\d{2}-\d{2})T00:00:00")
_CLOCK = re.compile(
    r"(?P<head>(?:\d{4}-\d{2}-\d{2}[T ])?\d{1,2}:\d{2})(?P<seconds>:00(?:\.0+)?)?(?P<zone>Z|[+-]\d{2}:\d{2})?"
)
_HOUR = re.compile(r"(\d{1,2})(:\d{2}(?::\d{2}(?:\.\d+)?)?)")


def _date_only(value: Any) -> Any:
    found = _MIDNIGHT.fullmatch(value) if isinstance(value, str) else None
    return found[1] if found else value


def _at_midnight(value: Any) -> Any | None:
    if not isinstance(value, str):
        return None
    if _DATE.fullmatch(value):
        return f"{value}T00:00:00"
    found = _MIDNIGHT.fullmatch(value)
    return found[1] if found else None


def _without_seconds(value: Any) -> Any:
    found = _CLOCK.fullmatch(value) if isinstance(value, str) else None
    if found is None or found["seconds"] is None:
        return value
    return found["head"] + (found["zone"] or "")


def _toggle_seconds(value: Any) -> Any | None:
    found = _CLOCK.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        return None
    seconds = "" if found["seconds"] else ":00"
    return found["head"] + seconds + (found["zone"] or "")


def _padded_hour(value: Any) -> Any:
    found = _HOUR.fullmatch(value) if isinstance(value, str) else None
    return f"0{value}" if found and len(found[1]) == 1 else value


def _repad_hour(value: Any) -> Any | None:
    found = _HOUR.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        return None
    if len(found[1]) == 1:
        return f"0{value}"
    return value[1:] if value.startswith("0") else None  # "10:00" has one spelling


_FAMILIES: dict[Transform, Family] = {
    # Presence, not spelling: learned and applied by the invariance module, made by vary_call.
    Transform.DEFAULT: Family(_same, _none),
    Transform.SPACE: Family(_strip, _pad),
    Transform.CASE: Family(_fold, _recase),
    Transform.PATH_SEP: Family(_single_separators, _double_separator),
    Transform.PATH_DOT: Family(_undot, _dot),
    Transform.PATH_UP: Family(_resolve_parents, _add_parent),
    Transform.PATH_SLASH: Family(_untrail, _trail),
    Transform.NUMBER: Family(_to_number, _respell_number, retypes=True),
    Transform.MIDNIGHT: Family(_date_only, _at_midnight),
    Transform.SECONDS: Family(_without_seconds, _toggle_seconds),
    Transform.HOUR_PAD: Family(_padded_hour, _repad_hour),
    Transform.DUPLICATES: Family(_dedupe, _repeat),
    Transform.ORDER: Family(_sort, _reverse),
}


# --- what a schema allows


def _fits(value: Any, schema: dict[str, Any], strict: bool) -> bool:
    """Whether the schema allows the value.

    A schema that cannot be checked whole (a ``$ref`` into the tool's ``$defs``, a malformed
    schema) allows a variant of another type (``strict``) never, and one of the valid original's
    type unless its enum says otherwise.
    """
    try:
        validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        validator.check_schema(schema)
        return bool(validator(schema).is_valid(value))
    except (SchemaError, Unresolvable, re.error):
        allowed = schema.get("enum")
        return not strict and (not isinstance(allowed, list) or value in allowed)
