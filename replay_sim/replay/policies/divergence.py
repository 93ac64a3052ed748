"""Where a re-played answer first differs from the recorded one, said in a line.

When a sandbox instance re-plays an episode's call and answers otherwise than the episode was told
(:func:`~replay_sim.replay.policies.binding.same_answer` is false), the miss names the first field
that differed: its path in the answer (``content[0].text``; inside a text that holds JSON, the
path in that JSON too: ``content[0].text → .commits[0].hash``), and the recorded and re-played
values, cut short around where they differ. Answers are compared as
:func:`~replay_sim.canonical.answer_text` compares them (``_meta`` and spelled-out defaults aside).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from replay_sim.canonical import answer_text

__all__ = ["Difference", "answer_difference", "first_difference"]

_SHOWN = 60  # characters of a value shown (around the first differing character of a string)
_MISSING = object()


@dataclass(frozen=True)
class Difference:
    """The first place two answers differ.

    Attributes:
        path: Where, in the answer (``content[0].text``, ``error.message``; ``→`` enters JSON text).
        recorded: The recorded value there, cut short (``(absent)`` when it has none).
        replayed: The re-played value there, cut short.
    """

    path: str
    recorded: str
    replayed: str

    def __str__(self) -> str:
        where = self.path or "the answer"
        return f"first difference at {where}: recorded {self.recorded}, re-played {self.replayed}"


def answer_difference(
    recorded: tuple[dict[str, Any] | None, dict[str, Any] | None],
    replayed: tuple[dict[str, Any] | None, dict[str, Any] | None],
) -> Difference | None:
    """Where a re-played answer first differs from the recorded one; None when they are the same.

    Args:
        recorded: The recording's ``(result, error)``.
        replayed: The instance's ``(result, error)``.
    """
    a = json.loads(answer_text(*recorded))
    b = json.loads(answer_text(*replayed))
    if a["error"] is None and b["error"] is None:
        return first_difference(a["result"], b["result"])
    return first_difference(a, b)  # an error on one side or both: "error.message", "result"


def first_difference(recorded: Any, replayed: Any, path: str = "") -> Difference | None:
    """The first path (depth first, keys in order) where two JSON values differ; None when equal.

    A string on both sides that holds a JSON object or array is compared as JSON.
    """
    if recorded == replayed:
        return None
    if isinstance(recorded, dict) and isinstance(replayed, dict):
        for key in [*recorded, *(k for k in replayed if k not in recorded)]:
            found = first_difference(
                recorded.get(key, _MISSING), replayed.get(key, _MISSING), _join(path, key)
            )
            if found is not None:
                return found
    if isinstance(recorded, list) and isinstance(replayed, list):
        for index in range(max(len(recorded), len(replayed))):
            found = first_difference(
                recorded[index] if index < len(recorded) else _MISSING,
                replayed[index] if index < len(replayed) else _MISSING,
                f"{path}[{index}]",
            )
            if found is not None:
                return found
    if isinstance(recorded, str) and isinstance(replayed, str):
        inner = _json(recorded), _json(replayed)
        if inner[0] is not _MISSING and inner[1] is not _MISSING:
            found = first_difference(inner[0], inner[1])
            if found is not None:
                return Difference(f"{path} → {found.path or '$'}", found.recorded, found.replayed)
        at = next((i for i, (x, y) in enumerate(zip(recorded, replayed, strict=False)) if x != y), None)
        at = min(len(recorded), len(replayed)) if at is None else at
        return Difference(path, _excerpt(recorded, at), _excerpt(replayed, at))
    return Difference(path, _shown(recorded), _shown(replayed))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _json(text: str) -> Any:
    """A text's JSON object or array, or ``_MISSING`` when it holds none."""
    if not text.lstrip().startswith(("{", "[")):
        return _MISSING
    try:
        value = json.loads(text)
    except ValueError:
        return _MISSING
    return value if isinstance(value, dict | list) else _MISSING


def _excerpt(text: str, at: int) -> str:
    """``text`` around index ``at``, quoted, cut to about :data:`_SHOWN` characters."""
    start = max(0, at - _SHOWN // 3)
    end = start + _SHOWN
    shown = json.dumps(text[start:end], ensure_ascii=False)
    return f"{'…' if start else ''}{shown}{'…' if end < len(text) else ''}"


def _shown(value: Any) -> str:
    if value is _MISSING:
        return "(absent)"
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"
