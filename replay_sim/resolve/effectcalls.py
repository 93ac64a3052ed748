"""What learning a server's tool effects reads of its calls: each call read and derived once.

A served store grows by a batch of sandbox answers every few tens of milliseconds, and each batch
makes the server's tool effects be learned again (a new answer may show a tool changing state).
Reading every call of the server again and deriving what the judge needs of each (its canonical
answer, the things it names, its kind) took most of that time, and grew with the store. Calls are
append-only, so :func:`server_runs` derives each once and reads only the calls added since (by
id); calls removed (``replay-sim forget``, which counts its removals) make it read them all again.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
from typing import Any

from replay_sim.canonical import answer_text
from replay_sim.effects import Call, kind_of, named, selected
from replay_sim.schema import ToolSchema
from replay_sim.store import Store
from replay_sim.store.derived import PerServer

__all__ = ["dry_run", "server_runs"]


def dry_run(tool: str, arguments: Any) -> bool:
    """Whether a call asks for a dry run (:meth:`~replay_sim.schema.ToolSchema.changes_state`)."""
    return not ToolSchema(tool, {}).changes_state(arguments)


@dataclasses.dataclass(slots=True)
class _Session:
    """One session's calls as read, in recorded order, and as judged (inert when never succeeded)."""

    read: list[tuple[int, int, Call]] = dataclasses.field(default_factory=list)  # (seq, id, call)
    judged: list[Call] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class _Read:
    """One server's calls as read so far, by session: each call inert only when its own arguments or
    method make it so, and as judged (whether its key ever succeeded is known of all the calls)."""

    last: int = 0
    removals: int = 0
    sessions: dict[Any, _Session] = dataclasses.field(default_factory=dict)
    succeeded: set[str] = dataclasses.field(default_factory=set)  # keys that ever succeeded
    unsettled: dict[str, set[Any]] = dataclasses.field(
        default_factory=dict
    )  # key never succeeded -> sessions
    called: set[str] = dataclasses.field(default_factory=set)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def forget(self, removals: int) -> None:
        """Forget every call read (some were removed: all are read again)."""
        self.last, self.removals = 0, removals
        self.sessions, self.succeeded, self.unsettled, self.called = {}, set(), {}, set()

    def add(self, rows: list[tuple[Any, int, Call]]) -> None:
        """Calls read since (in id order): each judged once, and again only when its key succeeds."""
        again: set[Any] = set()
        for _, _, call in rows:
            if not call.failed and call.key not in self.succeeded:
                self.succeeded.add(call.key)
                again |= self.unsettled.pop(call.key, set())
        for session, seq, call in rows:
            if call.method == "tools/call":
                self.called.add(call.name)
            found = self.sessions.setdefault(session, _Session())
            place = (seq, call.id or 0, call)
            if found.read and place[:2] < found.read[-1][:2]:  # recorded out of order: judged again
                bisect.insort(found.read, place, key=lambda entry: entry[:2])
                again.add(session)
                continue
            found.read.append(place)
            found.judged.append(self._judged(session, call))
        for session in again:
            found = self.sessions[session]
            found.judged = [self._judged(session, call) for _, _, call in found.read]

    def _judged(self, session: Any, call: Call) -> Call:
        if call.inert or call.key in self.succeeded:
            return call
        self.unsettled.setdefault(call.key, set()).add(session)
        return dataclasses.replace(call, inert=True)


_reads: PerServer[_Read] = PerServer(_Read)


def server_runs(store: Store, server: str) -> tuple[list[list[Call]], set[str]]:
    """Every session of ``server``'s calls as a run in recorded order, and every tool it called.

    A call recorded outside any session is a session of its own, from the initial state. A call
    is inert when it cannot have changed state whatever its tool does: not a tool call, a dry run,
    or a failure of a call (its exact key) that never succeeded.
    """
    read = _reads.of(store, server)
    with read.lock:
        _, _, removals = store.counted(server)  # before the calls: a removal meanwhile is seen next time
        if removals != read.removals:  # calls were removed (their ids may be given again): all again
            read.forget(removals)
        added = _derived(store.outcomes(server, after=read.last))
        read.add(added)
        read.last = max(read.last, *(call.id or 0 for _, _, call in added)) if added else read.last
        return [list(found.judged) for found in read.sessions.values()], set(read.called)


def _derived(outcomes: list[tuple[Any, ...]]) -> list[tuple[Any, int, Call]]:
    derived = []
    for rid, method, name, key, arguments, result, error, session, seq in outcomes:
        failed = error is not None or bool((result or {}).get("isError"))  # as Recording.failed says
        call = Call(
            rid,
            method,
            name,
            key,
            answer_text(result, error),
            failed,
            method != "tools/call" or dry_run(name, arguments),
            frozenset({name.lower()}) if method == "resources/read" else named(arguments),
            kind_of(arguments) if method == "tools/call" else None,
            selected(arguments),
        )
        derived.append((session if session is not None else ("", rid), seq or 0, call))
    return derived
