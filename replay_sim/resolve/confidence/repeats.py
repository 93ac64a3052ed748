"""Each tool's repeated-call counts as a served store grows: each recording read once.

A confidence reads, per tool, how many calls recorded more than once got one answer and how many
got several (:func:`~.features.repeated_calls`). A served store grows by a batch of sandbox answers
every few tens of milliseconds, and counting again from every recording of the tool after each
batch grew with the store; :class:`RepeatedCalls` reads only the recordings added since (by id),
and all of them again after calls were removed (``replay-sim forget`` counts its removals).
"""

from __future__ import annotations

import dataclasses
import threading

from replay_sim.resolve.confidence.features import CallAnswers
from replay_sim.resolve.toolstate import answer_of
from replay_sim.store import Store

__all__ = ["RepeatedCalls"]


@dataclasses.dataclass(slots=True)
class _Tool:
    last: int = 0
    removals: int = 0
    answers: CallAnswers = dataclasses.field(default_factory=CallAnswers)


class RepeatedCalls:
    """``(calls recorded more than once that got one answer, that got several)`` per tool."""

    def __init__(self) -> None:
        self._tools: dict[tuple[str, str, str], _Tool] = {}
        self._lock = threading.Lock()

    def of(self, store: Store, server: str, method: str, name: str) -> tuple[int, int]:
        """The tool's counts over the store as it is now."""
        with self._lock:
            _, _, removals = store.counted(server)
            tool = self._tools.get((server, method, name))
            if tool is None or tool.removals != removals:
                tool = self._tools[(server, method, name)] = _Tool(removals=removals)
            for rec in store.recordings(server, method=method, name=name, after_id=tool.last):
                tool.answers.add(rec.key, answer_of(rec))
                tool.last = max(tool.last, rec.id or 0)
            return tool.answers.counts()
