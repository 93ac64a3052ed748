"""Taking recorded sessions back: ``replay-sim forget`` by origin, fingerprint, server and time.

A wrong config makes wrong answers, and every answer a sandbox gives is recorded and later served
as ``exact`` by any config. :func:`forget` removes the sessions one selection names — whole
sessions, never a call out of the middle of one (the calls after it were made from a state that
included it) — in one transaction, with what is derived from them: their source marks
(:mod:`replay_sim.store.sources`) and the tool effects kept for their servers (learned again).
The vector index notices the removal on its next build or load (its vectors no longer match the
store's calls) and is rebuilt; a replay serving the store meanwhile forgets what it derived
(:func:`~replay_sim.store.changes.changes_since` sees calls removed).

A call recorded outside any session is a session of its own.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from replay_sim.errors import ConfigError
from replay_sim.store.sources import has_sources
from replay_sim.store.store import REMOVALS_META_KEY, Store

__all__ = ["Forgetting", "Selection", "forget"]

_EFFECTS_META_PREFIX = "effects:"  # as replay_sim.resolve.tooleffects keeps them (the store is upstream)


@dataclass(frozen=True, slots=True)
class Selection:
    """Which recorded sessions to take back; every given criterion must hold (at least one given).

    Attributes:
        origin: Sessions holding a call of this origin (``sandbox``, ``live``, ``explore`` …).
        fingerprint: Sessions marked with this sandbox fingerprint (or a prefix of it, 8+ characters).
        server: Sessions of this server.
        since: Sessions started at or after this time (ISO-8601, a date alone allowed).
        until: Sessions started before this time.
    """

    origin: str | None = None
    fingerprint: str | None = None
    server: str | None = None
    since: str | None = None
    until: str | None = None

    def check(self) -> None:
        """Refuse a selection that names nothing (it would take back the whole store).

        Raises:
            ConfigError: No criterion, or a fingerprint prefix too short to name one config.
        """
        if not any((self.origin, self.fingerprint, self.server, self.since, self.until)):
            raise ConfigError(
                "forget needs at least one of --origin, --fingerprint, --server, --since, --until "
                "(it never takes back the whole store)"
            )
        if self.fingerprint is not None and len(self.fingerprint) < 8:
            raise ConfigError(f"fingerprint {self.fingerprint!r} is too short: give 8 characters or more")


@dataclass
class Forgetting:
    """What a selection takes back (or took back, when :attr:`done`).

    Attributes:
        sessions: The sessions selected.
        calls: Their calls by ``(server, origin)``.
        done: Whether they were removed (False: a dry run).
    """

    sessions: list[str] = field(default_factory=list)
    calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    done: bool = False

    @property
    def total(self) -> int:
        """Calls selected in all."""
        return sum(self.calls.values())

    def describe(self) -> str:
        """Lines for a reader: the counts, then what happened or would happen."""
        verb = "removed" if self.done else "would remove"
        lines = [f"{verb} {len(self.sessions)} sessions, {self.total} calls"]
        lines += [f"  {server}\t{origin}\t{n}" for (server, origin), n in sorted(self.calls.items())]
        if not self.done and self.sessions:
            lines.append("dry run: nothing removed; add --yes to remove them")
        return "\n".join(lines)


def _where(selection: Selection, server: str, started: str, origin: str) -> tuple[str, list[Any]]:
    """The SQL condition and parameters of ``selection``: column names, and ``origin``'s condition."""
    clauses: list[str] = []
    params: list[Any] = []
    for clause, value in (
        (f"{server} = ?", selection.server),
        (f"{started} >= ?", selection.since),
        (f"{started} < ?", selection.until),
        (origin, selection.origin),
    ):
        if value is not None:
            clauses.append(clause)
            params.append(value)
    return " AND ".join(clauses) or "1", params


def _selected(store: Store, selection: Selection) -> tuple[list[str], list[int]]:
    """The selected session ids, and the ids of selected calls recorded outside any session."""
    # A session holds an origin when any of its calls has it (a live session with explore calls).
    has_origin = "? IN (SELECT c.origin FROM calls c WHERE c.session = s.id)"
    where, params = _where(selection, "s.server", "s.started_at", has_origin)
    if selection.fingerprint is not None:
        if not has_sources(store):
            return [], []
        where += " AND s.id IN (SELECT session FROM session_sources WHERE substr(fingerprint, 1, ?) = ?)"
        params += [len(selection.fingerprint), selection.fingerprint]
    sessions = [
        sid
        for (sid,) in store._query(f"SELECT s.id FROM sessions s WHERE {where} ORDER BY s.id", tuple(params))
    ]
    if selection.fingerprint is not None:  # no call outside a session carries a fingerprint
        return sessions, []
    where, params = _where(selection, "server", "recorded_at", "origin = ?")
    loose = store._query(f"SELECT id FROM calls WHERE session IS NULL AND {where} ORDER BY id", tuple(params))
    return sessions, [cid for (cid,) in loose]


def forget(store: Store, selection: Selection, *, dry_run: bool = True) -> Forgetting:
    """Take back the recorded sessions ``selection`` names (or, in a dry run, count them).

    Args:
        store: The recording store (writable unless ``dry_run``).
        selection: Which sessions.
        dry_run: Only count what would be removed.

    Returns:
        What was (or would be) removed.

    Raises:
        ConfigError: The selection names nothing (:meth:`Selection.check`).
        StoreError: The store cannot be written.
    """
    selection.check()
    sessions, loose = _selected(store, selection)
    found = Forgetting(sessions=sessions + [f"call {cid}" for cid in loose])
    ids = json.dumps(sessions)
    rows = store._query(
        "SELECT server, origin, COUNT(*) FROM calls WHERE session IN (SELECT value FROM json_each(?)) "
        "OR id IN (SELECT value FROM json_each(?)) GROUP BY server, origin",
        (ids, json.dumps(loose)),
    )
    found.calls.update({(server, origin): n for server, origin, n in rows})
    if dry_run or not found.sessions:
        return found
    servers = {server for server, _ in found.calls}
    marked = has_sources(store)
    with store.transaction(f"forget {len(found.sessions)} sessions") as conn:
        conn.execute("DELETE FROM calls WHERE session IN (SELECT value FROM json_each(?))", (ids,))
        conn.execute("DELETE FROM calls WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(loose),))
        conn.execute("DELETE FROM sessions WHERE id IN (SELECT value FROM json_each(?))", (ids,))
        if marked:
            conn.execute(
                "DELETE FROM session_sources WHERE session IN (SELECT value FROM json_each(?))", (ids,)
            )
        conn.execute(  # readers told apart a removal from an append only by this (ids are reused)
            "INSERT INTO meta VALUES (?, '1') "
            "ON CONFLICT (key) DO UPDATE SET value = CAST(value AS INTEGER) + 1",
            (REMOVALS_META_KEY,),
        )
        for server in servers:  # learned from calls that are gone: learned again
            conn.execute("DELETE FROM meta WHERE key = ?", (_EFFECTS_META_PREFIX + server,))
    found.done = True
    return found
