"""The kind of a call: the statement kind of the SQL it carries (``select``, ``insert`` …).

A tool that runs statements of a query language (one SQL ``query`` tool) reads with some calls and
writes with others. Its effect is learned per kind of call (:func:`replay_sim.effects.learn`), so
that an unrecorded ``SELECT`` of a tool seen writing is not taken for a write. The kind is read
from the call, conservatively: only a single statement whose leading keyword says what it does has
a kind, and only in an argument named for one (``query``, ``sql``, ``statement``, ``command`` …)
whose text is shaped like code. A string holding several statements, a ``WITH`` (its common table
expressions may write whatever its main statement does), ``SELECT … INTO`` (a new table), a call
of a function known to act (``nextval``, ``load_extension`` …), ``PRAGMA`` (reads or sets),
``EXPLAIN`` (``ANALYZE`` runs the statement), transaction control and every other statement have
none: such a call has its tool's effect, whatever its kind's evidence shows.
"""

from __future__ import annotations

import re
from typing import Any

from replay_sim.effects.things import leaves, words
from replay_sim.freetext import looks_like_code

__all__ = ["kind_of"]

_KINDS = frozenset(
    {"select", "values", "insert", "update", "delete", "replace", "upsert", "merge", "create", "drop",
     "alter", "truncate"}
)  # fmt: skip
"""Leading keywords that say what a statement does."""
_UNTRUSTED = frozenset(
    {"with", "pragma", "explain", "begin", "commit", "rollback", "end", "savepoint", "release",
     "attach", "detach", "vacuum", "analyze", "analyse", "reindex", "grant", "revoke", "set", "show",
     "call", "exec", "execute", "do", "lock", "copy", "load", "use", "describe", "desc", "refresh",
     "cluster", "comment", "declare", "discard", "listen", "notify", "prepare", "reset", "security",
     "start"}
)  # fmt: skip
"""Leading keywords of statements whose kind says nothing trustworthy about what they do."""
_WRITES = re.compile(r"\b(insert|update|delete|merge|upsert|truncate|create|drop|alter|replace\s+into)\b")
_ACTING = re.compile(
    r"\b(nextval|setval|lastval|load_extension|lo_import|lo_export|lo_unlink|dblink\w*|pg_\w+|"
    r"get_lock|release_lock|sleep|benchmark|writefile|sqlite_\w+)\s*\("
)
_STATEMENT_WORDS = frozenset({"query", "sql", "statement", "stmt", "command", "cmd", "script", "q"})
"""Argument name words that say the argument holds a statement."""
_COMMENT = re.compile(r"--[^\n]*|/\*.*?(?:\*/|$)", re.S)
_LITERAL = re.compile(r"'(?:[^']|'')*'?|\"(?:[^\"]|\"\")*\"?|`[^`]*`?|\[[^\]]*\]?")
_WORD = re.compile(r"[a-z_][a-z0-9_$]*|[()]")


def kind_of(arguments: Any) -> str | None:
    """The kind of a call, from the one SQL statement among its string arguments.

    Args:
        arguments: The call's arguments.

    Returns:
        The statement's lower-case leading keyword (``select``, ``insert``, ``delete`` …), or None
        when the call carries no SQL statement, several, or one whose kind cannot be trusted
        (see the module docstring).
    """
    statements = [
        body
        for key, text in leaves(arguments)
        if _STATEMENT_WORDS.intersection(words(key)) and (body := _statement(text)) is not None
    ]
    if len(statements) != 1:
        return None
    return _kind(statements[0])


def _statement(text: str) -> str | None:
    """``text`` lower-cased without comments and literals, if it starts with a SQL keyword."""
    if len(text) > 100_000 or not looks_like_code(text):
        return None
    body = _LITERAL.sub(" '' ", _COMMENT.sub(" ", text.lower()))
    words = _WORD.findall(body)
    first = next((w for w in words if w != "("), None)
    if first is None or (first not in _KINDS and first not in _UNTRUSTED) or len(words) < 2:
        return None
    return body


def _kind(body: str) -> str | None:
    if any(part.strip() for part in body.split(";")[1:]):
        return None  # several statements: each may do something else
    words = [w for w in _WORD.findall(body) if w != "("]
    first = words[0]
    if first not in _KINDS or _ACTING.search(body):
        return None
    if first == "select" and "into" in _top_level(body):
        return None  # SELECT … INTO makes a table
    if first in ("select", "values") and _WRITES.search(body):
        return None  # a write keyword inside a read: a dialect's writing sub-statement, or unclear
    return first


def _top_level(body: str) -> list[str]:
    """The words of ``body`` outside any parentheses."""
    depth, found = 0, []
    for word in _WORD.findall(body):
        if word == "(":
            depth += 1
        elif word == ")":
            depth = max(depth - 1, 0)
        elif depth == 0:
            found.append(word)
    return found
