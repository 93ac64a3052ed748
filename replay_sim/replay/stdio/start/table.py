"""The start table: what a stdio start answers from, and whether it may use it (see the package)."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from replay_sim.store import verified

__all__ = ["FORMAT", "SCHEMA", "START_TABLE", "StartTable", "code_digest", "stale", "store_basis"]

START_TABLE = "stdio-start.sqlite"
"""The start table's file in the index folder."""
FORMAT = "1"
"""The start table's layout (another one is not read)."""

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE openings (server TEXT, version TEXT, method TEXT, result BLOB NOT NULL,
                       PRIMARY KEY (server, version, method));
CREATE TABLE answers (server TEXT, key TEXT, anytime INTEGER NOT NULL, result BLOB NOT NULL,
                      PRIMARY KEY (server, key)) WITHOUT ROWID;
"""
"""The start table's tables."""


def code_digest() -> str:
    """This replay-sim's code, as a digest of its source files' names, sizes and times: a table
    written by other code (another version, an edited checkout) is not read."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]  # replay_sim/replay
    for folder, folders, files in os.walk(root):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                found = os.stat(os.path.join(folder, name))
                digest.update(f"{folder}/{name}:{found.st_size}:{found.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def store_basis(conn: sqlite3.Connection, server: str) -> str:
    """What a start table of ``server`` was built from: the store's calls, that server's recorded
    identity and listings, and the store's meta (kept tool effects among them), as one digest."""
    digest = hashlib.sha256()
    ((count, last),) = conn.execute("SELECT COUNT(*), COALESCE(MAX(id), 0) FROM calls").fetchall()
    digest.update(f"calls:{count}:{last}\n".encode())
    for query in (
        "SELECT * FROM servers WHERE name=? ORDER BY 1",
        "SELECT * FROM listings WHERE server=? ORDER BY 1, 2",
    ):
        for row in conn.execute(query, (server,)):
            digest.update(repr(row).encode() + b"\n")
    for row in conn.execute("SELECT key, value FROM meta ORDER BY key"):
        digest.update(repr(row).encode() + b"\n")
    return digest.hexdigest()


def stale(meta: dict[str, str], store: sqlite3.Connection, servers: Iterable[str]) -> str:
    """Why a start table with this ``meta`` cannot answer for these ``servers`` of ``store``: it was
    written by other code, lacks one of them, or the store changed since; "" when it can."""
    if meta.get("format") != FORMAT or meta.get("code") != code_digest():
        return "it was written by other replay-sim code (another version, or an edited checkout)"
    written = json.loads(meta.get("servers", "[]"))
    for server in servers:
        if server not in written:
            return f"it has no server {server!r}"
        if meta.get(f"basis:{server}") != store_basis(store, server):
            return "the store changed since it was written"
    return ""


class StartTable:
    """The answers a stdio start of one recorded server may give, read from its start table.

    Args:
        conn: The start table, open.
        store: The store, open read-only (whose writes :meth:`current` watches).
        server: The recorded server served.
    """

    def __init__(self, conn: sqlite3.Connection, store: sqlite3.Connection, server: str) -> None:
        self.conn = conn
        self.store = store
        self.server = server
        self._data_version = self._store_version()

    @classmethod
    def open(cls, db: Path, index_dir: Path, server: str) -> tuple[StartTable | None, str]:
        """The start table of ``server`` for the store at ``db``, or None and why not: "" when there
        is no table, or the store was written since its integrity check (the replay checks it, and
        the next start uses the table)."""
        path = Path(index_dir) / START_TABLE
        if not path.is_file():
            return None, ""
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            store = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        except sqlite3.Error:
            return None, ""
        try:
            why = stale(dict(conn.execute("SELECT key, value FROM meta").fetchall()), store, [server])
            if not why and verified.verified(db, verified.stamp_of(db)):
                return cls(conn, store, server), ""
        except (sqlite3.Error, ValueError) as exc:
            why = f"it cannot be read ({exc})"
        conn.close()
        store.close()
        return None, why and f"{path} is not used: {why}; `replay-sim index build` writes it again"

    def _store_version(self) -> int:
        return int(self.store.execute("PRAGMA data_version").fetchone()[0])

    def current(self) -> bool:
        """Whether no other connection has written to the store since the table was opened."""
        return self._store_version() == self._data_version

    def opening(self, version: str, method: str) -> bytes | None:
        """The result JSON of ``initialize`` asked at ``version``, or of a listing served at it."""
        row = self.conn.execute(
            "SELECT result FROM openings WHERE server=? AND version=? AND method=?",
            (self.server, version, method),
        ).fetchone()
        return None if row is None else bytes(row[0])

    def call(self, key: str) -> tuple[bytes, bool] | None:
        """The result JSON of the call with this exact key, and whether it holds after other calls."""
        row = self.conn.execute(
            "SELECT result, anytime FROM answers WHERE server=? AND key=?", (self.server, key)
        ).fetchone()
        return None if row is None else (bytes(row[0]), bool(row[1]))

    def close(self) -> None:
        self.conn.close()
        self.store.close()
