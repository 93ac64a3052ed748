"""What changed in a store since a reader last looked: calls appended, or something else.

A long-lived reader — the resolver, a served server's surface — derives a lot from the recordings
and must not serve from it once the store has changed (a stale state is a wrong answer). Another
process may be writing the same file meanwhile — recording, importing, backfilling — and a commit
a second must not make the reader throw away everything it derived from calls the commit did not
touch. Recorded calls are appended (no code updates a call; only ``replay-sim forget`` removes
some, and counts that it did), so :func:`changes_since` names the calls appended since a
:class:`Mark`: their servers, tools, keys and sessions, and the tools of every call in a session
they joined. Anything else — a server or a listing replaced, calls removed — is reported as a
change of everything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from replay_sim.store.store import Store

__all__ = ["Appended", "Mark", "changes_since"]


@dataclass(frozen=True, slots=True)
class Mark:
    """Where a store stood when a reader looked (compare two with ``==``).

    Attributes:
        version: This connection's content commits and SQLite's ``data_version`` (other
            connections' commits, the embedding cache's too): whether anything was committed.
        calls: How many calls were recorded.
        last: The highest call id.
        removals: How many times calls were removed (a removed highest id is given again).
        surface: A digest of the servers and their listings.
    """

    version: tuple[int, int]
    calls: int = 0
    last: int = 0
    removals: int = 0
    surface: int = 0


@dataclass(frozen=True, slots=True)
class Appended:
    """The calls appended since a :class:`Mark`, by what a reader keys its caches on.

    Attributes:
        servers: Servers with new calls.
        tools: ``(server, name)`` of the new calls, and of every call in a session one joined (a
            call's prefix in its session is part of its state).
        keys: Call keys of the new calls.
        sessions: Sessions the new calls belong to.
        after: The highest call id before them, and ``last`` the highest of them: the new calls
            are those with an id in ``(after, last]``.
    """

    servers: frozenset[str] = field(default_factory=frozenset)
    tools: frozenset[tuple[str, str]] = field(default_factory=frozenset)
    keys: frozenset[str] = field(default_factory=frozenset)
    sessions: frozenset[str] = field(default_factory=frozenset)
    after: int = 0
    last: int = 0

    def __bool__(self) -> bool:
        return bool(self.servers)


NOTHING = Appended()


def _mark(store: Store, version: tuple[int, int]) -> Mark:
    calls, last, removals = store.counted()
    servers = store._query("SELECT * FROM servers ORDER BY name")
    listings = store._query("SELECT * FROM listings ORDER BY server, method")
    return Mark(version, calls, last, removals, hash((tuple(servers), tuple(listings))))


def changes_since(store: Store, mark: Mark | None) -> tuple[Mark, Appended | None]:
    """The store's mark now, and what changed since ``mark``.

    Args:
        store: The store.
        mark: What a reader saw last (None: it saw nothing yet).

    Returns:
        The new mark, and the calls appended since ``mark`` (falsy when nothing was), or None when
        anything else changed too — or ``mark`` is None: the reader forgets everything it derived.

    Raises:
        StoreError: The store cannot be read (closed, corrupt).
    """
    version = store.version()
    if mark is not None and version == mark.version:
        return mark, NOTHING
    now = _mark(store, version)
    if mark is None or now.surface != mark.surface or now.calls < mark.calls or now.removals != mark.removals:
        return now, None
    if (now.calls, now.last) == (mark.calls, mark.last):
        return now, NOTHING  # the embedding cache, kept misses, meta: no recording changed
    new = store._query("SELECT server, name, key, session FROM calls WHERE id > ?", (mark.last,))
    if len(new) != now.calls - mark.calls:
        return now, None  # calls were removed as well as added
    sessions = frozenset(s for *_, s in new if s is not None)
    joined = store._query(
        "SELECT DISTINCT server, name FROM calls WHERE session IN (SELECT value FROM json_each(?))",
        (json.dumps(sorted(sessions)),),
    )
    return now, Appended(
        servers=frozenset(server for server, *_ in new),
        tools=frozenset((server, name) for server, name, *_ in new) | {(s, n) for s, n in joined},
        keys=frozenset(key for _, _, key, _ in new),
        sessions=sessions,
        after=mark.last,
        last=now.last,
    )
