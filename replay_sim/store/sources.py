"""Where a recorded session came from: the fingerprint of the sandbox config and code that answered it.

Every session a sandbox instance records (origin ``sandbox``) is marked with the fingerprint of
what made its answers — the server's sandbox config (command, arguments, environment, isolation,
state) and the code (replay-sim's and the server's own files): :func:`mark_session`. When one
config turns out wrong (it shared state between instances), ``replay-sim forget --fingerprint``
takes back exactly the answers it made (:mod:`replay_sim.store.forget`).

The marks live in their own table, ``session_sources``, created when a store is opened for writing;
a store made before it (or a read-only copy of one) holds none.
"""

from __future__ import annotations

import json
from typing import Any

from replay_sim.store.store import Store

__all__ = ["has_sources", "mark_session", "session_sources"]


def has_sources(store: Store) -> bool:
    """Whether the store has the ``session_sources`` table (older stores do not)."""
    return bool(store._query("SELECT 1 FROM sqlite_master WHERE type='table' AND name='session_sources'"))


def mark_session(store: Store, session: str, fingerprint: str, detail: dict[str, Any] | None = None) -> None:
    """Record what made ``session``'s answers (its first mark stays: a session has one source).

    Args:
        store: The recording store (writable).
        session: The session id.
        fingerprint: The fingerprint of the sandbox config and code.
        detail: What the fingerprint was taken over, for a reader (JSON-ready).
    """
    with store.transaction(f"mark session {session!r}") as conn:
        conn.execute(
            "INSERT OR IGNORE INTO session_sources VALUES (?, ?, ?)",
            (session, fingerprint, None if detail is None else json.dumps(detail, sort_keys=True)),
        )


def session_sources(store: Store) -> dict[str, str]:
    """Every marked session's fingerprint, by session id."""
    if not has_sources(store):
        return {}
    return {session: fp for session, fp in store._query("SELECT session, fingerprint FROM session_sources")}
