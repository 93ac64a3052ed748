"""What learning a server's tool effects reads of its calls: each call read and derived once.

A served store grows by a batch of sandbox answers every few tens of milliseconds, and each batch
makes the server's tool effects be learned again (a new answer may show a tool changing state).
Reading every call of the server again and deriving what the judge needs of each (its canonical
answer, the things it names, its kind) took most of that time, and grew with the store. Calls are
append-only, so :func:`server_runs` derives each once and reads only the calls added since (by
id); calls removed (``replay-sim forget``, which counts its removals) make it read them all again.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections import defaultdict
from typing import Any

from replay_sim.canonical import answer_text
from replay_sim.effects import Call, kind_of, named, selected
from replay_sim.schema import ToolSchema
from replay_sim.store import Store

__all__ = ["dry_run", "server_runs"]


def dry_run(tool: str, arguments: Any) -> bool:
    """Whether a call asks for a dry run (:meth:`~replay_sim.schema.ToolSchema.changes_state`)."""
    return not ToolSchema(tool, {}).changes_state(arguments)


@dataclasses.dataclass(slots=True)
class _Read:
    """One server's calls as read so far: ``(session, seq, call)`` each, ``call`` inert only when
    its own arguments or method make it so (whether its key ever succeeded is judged on the whole)."""

    last: int = 0
    removals: int = 0
    rows: list[tuple[Any, int, Call]] = dataclasses.field(default_factory=list)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


_reads: weakref.WeakKeyDictionary[Store, dict[str, _Read]] = weakref.WeakKeyDictionary()
_reads_lock = threading.Lock()


def server_runs(store: Store, server: str) -> tuple[list[list[Call]], set[str]]:
    """Every session of ``server``'s calls as a run in recorded order, and every tool it called.

    A call recorded outside any session is a session of its own, from the initial state. A call
    is inert when it cannot have changed state whatever its tool does: not a tool call, a dry run,
    or a failure of a call (its exact key) that never succeeded.
    """
    with _reads_lock:
        read = _reads.setdefault(store, {}).setdefault(server, _Read())
    with read.lock:
        _, _, removals = store.counted(server)  # before the calls: a removal meanwhile is seen next time
        if removals != read.removals:  # calls were removed (their ids may be given again): all again
            read.last, read.removals, read.rows = 0, removals, []
        added = _derived(store.outcomes(server, after=read.last))
        read.rows.extend(added)
        read.last = max(read.last, *(call.id or 0 for _, _, call in added)) if added else read.last
        rows = list(read.rows)
    succeeded = {call.key for _, _, call in rows if not call.failed}
    sessions: dict[Any, list[tuple[int, Call]]] = defaultdict(list)
    for session, seq, call in rows:
        if not call.inert and call.key not in succeeded:
            call = dataclasses.replace(call, inert=True)
        sessions[session].append((seq, call))
    runs = [[c for _, c in sorted(run, key=lambda sc: (sc[0], sc[1].id or 0))] for run in sessions.values()]
    return runs, {call.name for _, _, call in rows if call.method == "tools/call"}


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
