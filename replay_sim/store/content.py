"""The store's content version: who the store is, and a token each write of what replays answer from renews.

A replay answers from four tables: ``calls``, ``listings``, ``servers`` and ``meta``. What is
derived from them and kept elsewhere (the stdio start table, :mod:`replay_sim.replay.stdio.start`)
must know, in a single-row read, whether they changed since — whoever wrote them: replay-sim, or
``sqlite3`` and any other program, in place (``UPDATE calls SET result=...``) included. So SQLite
keeps it itself: triggers after every insert, update and delete of a row of those tables set the
one row of ``content_version`` to a fresh random ``version`` (and count the ``changes``). The
triggers live in the file's schema, so every writer fires them; one that drops a trigger changes
the schema, whose cookie (``PRAGMA schema_version``) a reader compares as well. A random token
rather than a counter: two copies of one store written apart never share a version.

The row also holds ``store``, a random id given to the store when the table is created: copies of a
file share it, other stores never do. It is kept here rather than in ``meta``, which a snapshot's id
covers and which export/import must reproduce.

Stores written before this table existed get it (and its triggers) the next time they are opened
for writing; until then they have no content version, and nothing keyed by one is used.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

__all__ = ["SCHEMA", "TABLES", "ContentVersion", "content_version", "ensure"]

TABLES = ("calls", "listings", "servers", "meta")
"""The tables a replay answers from: a write to any of them makes a new content version."""

_BUMP = "UPDATE content_version SET changes = changes + 1, version = lower(hex(randomblob(16)))"

SCHEMA = """
CREATE TABLE IF NOT EXISTS content_version (
    id INTEGER PRIMARY KEY CHECK (id = 0), store TEXT NOT NULL, changes INTEGER NOT NULL,
    version TEXT NOT NULL);
""" + "".join(
    f"CREATE TRIGGER IF NOT EXISTS content_{table}_{event.lower()} AFTER {event} ON {table}\n"
    f"    BEGIN {_BUMP}; END;\n"
    for table in TABLES
    for event in ("INSERT", "UPDATE", "DELETE")
)
"""The content version's table and triggers (created, when missing, by every writable open)."""


def ensure(conn: sqlite3.Connection) -> None:
    """Give the store open on ``conn`` its id and first version when it has none (after :data:`SCHEMA`).

    Only then is anything written: opening a store another process is writing must not wait.
    """
    if conn.execute("SELECT 1 FROM content_version WHERE id = 0").fetchone() is None:
        conn.execute(
            "INSERT OR IGNORE INTO content_version "
            "VALUES (0, lower(hex(randomblob(16))), 0, lower(hex(randomblob(16))))"
        )


@dataclass(frozen=True, slots=True)
class ContentVersion:
    """Where a store's content stands.

    Attributes:
        store: The store's random id (its copies share it).
        version: A random token, new after every write to :data:`TABLES`.
        changes: How many rows of them were written since the id was given (for people).
        schema: SQLite's schema cookie: changes when a table or trigger is created or dropped.
    """

    store: str
    version: str
    changes: int
    schema: int


def content_version(conn: sqlite3.Connection) -> ContentVersion | None:
    """The content version of the store open on ``conn`` (one row read), or None: the store has
    none yet (written only by an older replay-sim, or never opened for writing since).

    Raises:
        sqlite3.Error: The file cannot be read.
    """
    try:
        row = conn.execute("SELECT store, version, changes FROM content_version WHERE id = 0").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    if row is None:
        return None
    ((schema,),) = conn.execute("PRAGMA schema_version").fetchall()
    return ContentVersion(str(row[0]), str(row[1]), int(row[2]), int(schema))
