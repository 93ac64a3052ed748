"""What a call names, and whether an observer could see what a call does (:func:`covers`)."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from typing import Any

from replay_sim.effects.model import Call
from replay_sim.freetext import looks_like_code

__all__ = ["covers", "leaves", "named", "words"]


# Argument name words that mean "this names the thing a call acts on or reads".
_THING_WORDS = frozenset(
    {
        "id", "ids", "uuid", "key", "keys", "path", "paths", "file", "files", "filename", "filepath",
        "dir", "directory", "folder", "uri", "url", "name", "names", "table", "tables", "entity",
        "entities", "node", "nodes", "repo", "repository", "branch", "collection", "document", "slug",
    }
)  # fmt: skip
_SQL_TABLE = re.compile(
    r"\b(?:from|into|update|table|join)\s+(?:if\s+(?:not\s+)?exists\s+)?[`\"\[]?([A-Za-z_][\w.]*)", re.I
)
_MIN_SHOWN = 3  # a name shorter than this found in an answer is a coincidence, not a sighting


def words(name: str) -> list[str]:
    """The lower-case words of an argument name (``entityNames`` -> ``entity``, ``names``)."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [t for t in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if t]


def leaves(value: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """``(the key holding it, string)`` for every string inside an argument value."""
    if isinstance(value, dict):
        for k, item in value.items():
            yield from leaves(item, str(k))
    elif isinstance(value, list):
        for item in value:
            yield from leaves(item, key)
    elif isinstance(value, str) and value:
        yield key, value
    elif isinstance(value, int) and not isinstance(value, bool) and key:
        yield key, str(value)


def named(arguments: Any) -> frozenset[str]:
    """What a call names (lower case): the things it acts on or reads.

    The values of arguments named like a thing (``path``, ``file_path``, ``name``, ``entityNames``,
    ``key``, ``id``, ``table``, ``uri`` …) and the tables a SQL text names (``FROM``, ``INTO``,
    ``UPDATE``, ``TABLE``, ``JOIN``). Prose, numbers and options name nothing.
    """
    found: set[str] = set()
    if not isinstance(arguments, dict):
        return frozenset()
    for key, text in leaves(arguments):
        if any(word in _THING_WORDS for word in words(key)) and len(text) <= 1024:
            found.add(text.strip().lower())
        elif looks_like_code(text):
            found.update(t.lower() for t in _SQL_TABLE.findall(text))
    return frozenset(found)


def covers(observer: Call, call: Call) -> bool:
    """Whether ``observer`` could see what ``call`` does: it names what the call names, or shows it.

    A call that names nothing (a pure function of numbers and prose) is covered by any observer;
    otherwise the observer must name one of the things the call names (or the folder holding a
    path it names: listing a folder sees a file created in it), or its answer must show one.
    """
    if not call.names:
        return True
    folders = {posixpath.dirname(n.rstrip("/")) for n in call.names if "/" in n.rstrip("/")}
    if observer.names & (call.names | folders):
        return True
    answer = observer.answer.lower()
    return any(len(n) >= _MIN_SHOWN and n in answer for n in call.names)
