"""Whether a read that saw nothing change is a witness: it could have shown the call's effect.

A read unchanged across a call says the call changed nothing only when the call *would* have
changed something that read shows. Two ways it would not, whatever the tool does:

- **the call selected nothing**: its arguments pick what it acts on by content (``old``,
  ``pattern``, ``search`` …: a find/replace, a regex edit) and that content is not in what the read
  showed before — a find/replace of an absent pattern changes nothing, and neither would one of a
  present pattern if the tool were a read (:func:`selected`, :func:`can_show`);
- **the call says it did nothing**: its own answer reports zero of what it acts on
  (``0 replacements``, ``no matches``, ``pattern not found``, ``nothing to do``: :func:`did_nothing`).

Neither is evidence either way: such a call is no witness for its tool, nor against it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from replay_sim.effects.model import Call
from replay_sim.effects.things import leaves, words

__all__ = ["can_show", "did_nothing", "selected"]

_SELECTOR_WORDS = frozenset(
    {"old", "find", "pattern", "regex", "regexp", "search", "needle", "match", "original"}
)
"""Argument name words that say the argument picks what the call acts on by its content."""
_SELECTOR_NOT = frozenset({"path", "file", "dir", "directory", "date", "time", "line", "index", "case"})
"""Words that make such a name something else (``search_path``, ``match_case``)."""
_NOTHING = re.compile(
    r"\b(?:0|no|zero|none)\s+(?:\w+\s+){0,2}?(?:match(?:es)?|occurrences?|replacements?|changes?|edits?|"
    r"substitutions?|rows?\s+(?:affected|updated|changed|deleted))\b"
    r"|\b(?:not|never)\s+found\b|\bnothing\s+(?:to\s+(?:do|change|replace|update)|(?:was\s+)?changed)\b"
    r"|\bno[- ]op\b|\bunchanged\b",
    re.I,
)
_MAX_SELECTOR = 4096  # longer values are content to write, not a pattern to find


def selected(arguments: Any) -> frozenset[str]:
    """The values a call picks its target by (``old``, ``oldText``, ``pattern``, ``search`` …)."""
    if not isinstance(arguments, dict):
        return frozenset()
    found = set()
    for key, text in leaves(arguments):
        said = set(words(key))
        if said & _SELECTOR_WORDS and not said & _SELECTOR_NOT and len(text) <= _MAX_SELECTOR:
            found.add(text)
    return frozenset(found)


def did_nothing(answer: str) -> bool:
    """Whether a call's own answer (canonical text) says it acted on nothing."""
    return bool(_NOTHING.search(answer))


def can_show(observer: Call, call: Call) -> bool:
    """Whether ``observer``'s answer, unchanged across ``call``, says ``call`` changed nothing.

    Not when ``call`` says it did nothing, nor when it picks its target by content that the
    observer's answer does not show (in its text or as JSON escapes it).
    """
    if call.tool is None:
        return True
    if did_nothing(call.answer):
        return False
    shown = observer.answer
    return all(s in shown or json.dumps(s, ensure_ascii=False)[1:-1] in shown for s in call.selectors)
