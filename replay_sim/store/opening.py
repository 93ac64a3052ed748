"""Opening a store's file: is it a replay-sim store, and does it pass its integrity check.

Both are checked before anything is written (:func:`check_file`), so a file that fails either is
left unchanged; a file that passed and was not written since is not checked again
(:mod:`replay_sim.store.verified`).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from replay_sim.errors import StoreError
from replay_sim.store import verified

__all__ = ["STORE_TABLES", "check_file", "integrity", "is_store"]


STORE_TABLES = {
    "meta": {"key", "value"},
    "servers": {"name", "info", "capabilities"},
    "listings": {"server", "method", "result"},
    "sessions": {"id", "server", "started_at"},
    "calls": {"id", "server", "method", "name", "arguments", "params", "key", "result", "error", "session"},
}
"""The tables every replay-sim store has held since its first schema, with columns each must have."""


def is_store(conn: sqlite3.Connection) -> bool:
    """Whether a SQLite file holds replay-sim's tables and a ``schema_version`` (not just any of them).

    Someone else's file may have a ``meta`` table with a ``schema_version`` of its own, or views
    only: it is refused unchanged rather than given replay-sim's tables.
    """
    for table, columns in STORE_TABLES.items():
        kind = conn.execute("SELECT type FROM sqlite_master WHERE name=?", (table,)).fetchone()
        if kind is None or kind[0] != "table":
            return False
        if not columns <= {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
            return False
    return conn.execute("SELECT 1 FROM meta WHERE key='schema_version'").fetchone() is not None


def check_file(path: Path, conn: sqlite3.Connection) -> None:
    """Refuse a SQLite file that is not a replay-sim store, or one that fails its integrity check.

    Both are checked before anything is written, so neither file is changed. A damaged store
    would otherwise be served with whatever parts still read (an index build that cannot read
    every call leaves semantic matching off). ``PRAGMA integrity_check`` reads every page and
    looks every row up in every index; ``quick_check`` (a fifth of the time: 0.05 s vs 0.23 s
    at 100,000 recordings) checks only the pages' structure, so it opens a file whose
    ``calls_key`` index points a key at another call's row, and that call's recording would
    answer. The full check runs on the opening thread: a check overlapped with the rest of a
    replay's start would have to hold back every answer, the listings' too, until it passed,
    and would save at most the 0.1 s between opening the store and the first call. A file that
    passed and has not been written since is not checked again (:mod:`replay_sim.store.verified`).
    """
    stamp = verified.stamp_of(path)
    try:
        found = conn.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
        objects = sorted(f"{name} ({kind})" if kind != "table" else name for kind, name in found)
        if not objects:
            return  # a new (or empty) file: the schema is created
        if not is_store(conn):
            raise StoreError(
                f"{path}: a SQLite file but not a replay-sim store (it holds: "
                f"{', '.join(objects[:8])}{', …' if len(objects) > 8 else ''}); "
                "give a replay-sim store or a new path with --db"
            )
        if verified.verified(path, stamp):
            return
        problem = integrity(conn)
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc):
            conn.close()
            raise StoreError(
                f"{path}: not a SQLite file ({exc}); give a replay-sim store or a new path with --db"
            ) from exc
        problem = str(exc)
    except BaseException:
        conn.close()
        raise
    if problem != "ok":
        problem = " ".join(problem.replace("*** in database main ***", "").split())  # one line
        conn.close()
        raise StoreError(
            f"{path}: the store fails its integrity check ({problem}); see "
            f"`sqlite3 {path} 'PRAGMA integrity_check'`, and restore it from a copy or an "
            "export (`sqlite3 FILE .recover` may save what is left)"
        )
    if stamp is not None and verified.stamp_of(path) == stamp:  # nobody wrote meanwhile
        verified.remember(path, stamp)


def integrity(conn: sqlite3.Connection) -> str:
    """``PRAGMA integrity_check``'s first finding (``ok`` when it finds nothing)."""
    return str(conn.execute("PRAGMA integrity_check(1)").fetchone()[0])
