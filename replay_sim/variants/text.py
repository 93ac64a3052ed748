"""Differences of text and arrays: surrounding whitespace, letter case, repeated and reordered items.

For each, how to take it out, how to make it (:mod:`replay_sim.variants`), and — for the kinds a
learned invariance is scoped by — which kinds of characters or items a difference changed
(``*_changes``) and which a value's canonical spelling takes out (``*_needs``).
"""

from __future__ import annotations

import re
from typing import Any

from replay_sim.canonical import canonical_json
from replay_sim.freetext import looks_like_code, outside_literals

__all__ = [
    "CASE_CLASSES",
    "case_changes",
    "dedupe",
    "fold",
    "fold_case",
    "order_changes",
    "order_needs",
    "pad",
    "recase",
    "repeat",
    "reverse",
    "sort",
    "space_changes",
    "space_needs",
    "strip",
]

_MAX_CHARS = 1000  # longer strings are prose nobody retypes in another spelling


def _words(value: Any) -> bool:
    """A string someone could retype in another spelling (not empty, not prose-long)."""
    return isinstance(value, str) and bool(value.strip()) and len(value) <= _MAX_CHARS


# --- whitespace, case, order, duplicates


def strip(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def pad(value: Any) -> Any | None:
    """``value`` stripped, or padded with a space before and a space and a newline after.

    The padding exercises the kinds of whitespace clients add (a learned whitespace invariance
    reaches only the kinds and places its pairs changed: :func:`space_changes`).
    """
    if not _words(value):
        return None
    return value.strip() if value != value.strip() else f" {value} \n"


def fold(value: Any) -> Any:
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
    if not isinstance(a, str) or not isinstance(b, str) or a == b or fold(a) != fold(b):
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
        return fold(value)

    code = looks_like_code(value)

    def change(part: str) -> str:
        return _CASE_TOKEN.sub(
            lambda t: t.group().casefold() if _token_class(part, t, code) in classes else t.group(), part
        )

    return outside_literals(value, change)


def recase(value: Any) -> Any | None:
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


def sort(value: Any) -> Any:
    return sorted(value, key=canonical_json) if isinstance(value, list) else value


def reverse(value: Any) -> Any | None:
    if isinstance(value, list) and list(reversed(value)) != value:
        return list(reversed(value))
    return None


def dedupe(value: Any) -> Any:
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


def repeat(value: Any) -> Any | None:
    if not isinstance(value, list) or not value:
        return None
    deduped = dedupe(value)
    return deduped if len(deduped) != len(value) else [value[0], *value]


# --- which kinds of characters or items a difference changed (a learned invariance's reach)


def _space_kind(char: str) -> str:
    return {" ": "space", "\t": "tab", "\n": "newline", "\r": "newline"}.get(char, "other")


def _ends(value: str) -> tuple[str, str]:
    """The leading and trailing whitespace of a string."""
    return value[: len(value) - len(value.lstrip())], value[len(value.rstrip()) :]


def space_needs(value: Any) -> frozenset[str]:
    """What stripping ``value`` takes out: ``leading space``, ``trailing newline`` …"""
    if not isinstance(value, str):
        return frozenset()
    lead, trail = _ends(value)
    return frozenset(
        {f"leading {_space_kind(c)}" for c in lead} | {f"trailing {_space_kind(c)}" for c in trail}
    )


def space_changes(a: Any, b: Any) -> frozenset[str]:
    """The kinds of whitespace, and where, by which two spellings of one string differ.

    ``" x "`` vs ``"x"`` changed ``leading space`` and ``trailing space``; ``"x\\n"`` vs ``"x"``
    ``trailing newline``. Empty unless both are strings equal once stripped.
    """
    if not isinstance(a, str) or not isinstance(b, str) or a == b or a.strip() != b.strip():
        return frozenset()
    (lead_a, trail_a), (lead_b, trail_b) = _ends(a), _ends(b)
    found: set[str] = set()
    if lead_a != lead_b:
        found |= {f"leading {_space_kind(c)}" for c in lead_a + lead_b}
    if trail_a != trail_b:
        found |= {f"trailing {_space_kind(c)}" for c in trail_a + trail_b}
    return frozenset(found)


def _item_kind(item: Any) -> str:
    if isinstance(item, bool) or item is None:
        return "literal"
    if isinstance(item, int | float):
        return "number"
    if isinstance(item, str):
        return "string"
    return "array" if isinstance(item, list) else "object" if isinstance(item, dict) else "other"


def order_needs(value: Any) -> frozenset[str]:
    """What sorting ``value`` takes out: the order of items of these kinds (``string``, ``object`` …)."""
    if not isinstance(value, list) or sort(value) == value:
        return frozenset()
    return frozenset(_item_kind(item) for item in value)


def order_changes(a: Any, b: Any) -> frozenset[str]:
    """The kinds of items two orderings of one array moved (empty unless they are such)."""
    if not isinstance(a, list) or not isinstance(b, list) or a == b or sort(a) != sort(b):
        return frozenset()
    return frozenset(_item_kind(item) for item in a)
