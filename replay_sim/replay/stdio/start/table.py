"""The start table: what a stdio start answers from, and whether it may (see the package).

A start table is a cache keyed by what it answers from, checked at start in a few single-row reads
whatever the store's size:

- **The store's content**: its :class:`~replay_sim.store.content.ContentVersion` — a random token
  SQLite's own triggers replace on every write of a call, listing, server or meta row, by any
  writer, in place included — and its schema cookie (a dropped trigger changes it). The table
  records the version it was written from; any other is stale.
- **The store's identity**: its random id (digested), its real path and its device and inode. A
  table copied from another store, or next to a copy of this one, is not this store's.
- **The code**: :func:`code_digest` over replay-sim's source files.
- **Its own rows**: each row carries a keyed digest (BLAKE2b, keyed by the store's id, which the
  table does not hold) of what it says, checked when the row is read; the meta rows carry one
  too, checked at open. A row edited in the table file is not served, and a table cannot be
  re-signed without reading the store. (``index build`` checks every row.)

While a start answers, every request first asks whether the store was written meanwhile (``PRAGMA
data_version``, then the content version when it moved): a store written hands over at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from replay_sim.store import verified
from replay_sim.store.content import ContentVersion, content_version

__all__ = ["FORMAT", "SCHEMA", "START_TABLE", "StartTable", "code_digest", "identity", "seal", "stale"]

START_TABLE = "stdio-start.sqlite"
"""The start table's file in the index folder."""
FORMAT = "2"
"""The start table's layout (another one is not read). 2: keyed by the store's content version."""

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE openings (server TEXT, version TEXT, method TEXT, result BLOB NOT NULL, seal TEXT NOT NULL,
                       PRIMARY KEY (server, version, method));
CREATE TABLE answers (server TEXT, key TEXT, anytime INTEGER NOT NULL, result BLOB NOT NULL,
                      seal TEXT NOT NULL, PRIMARY KEY (server, key)) WITHOUT ROWID;
"""
"""The start table's tables."""

_ROOT = Path(__file__).resolve().parents[3]  # replay_sim/


def code_digest() -> str:
    """replay-sim's code, as a digest of its source files' names, sizes and times: a table written
    by other code (another version, an edited checkout) is not read."""
    digest = hashlib.sha256()
    for folder, folders, files in os.walk(_ROOT):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                found = os.stat(os.path.join(folder, name))
                digest.update(f"{folder}/{name}:{found.st_size}:{found.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def seal(store_id: str, *fields: Any) -> str:
    """The keyed digest of a row of the table (keyed by the store's id, which the table does not hold)."""
    digest = hashlib.blake2b(key=store_id.encode(), digest_size=16)
    for value in fields:
        data = value if isinstance(value, bytes) else repr(value).encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def _named(store_id: str) -> str:
    """The store's id as the table names it (the id itself keys the seals)."""
    return hashlib.sha256(f"replay-sim store {store_id}".encode()).hexdigest()[:32]


def identity(db: Path, found: ContentVersion) -> dict[str, str]:
    """The meta rows naming the store at ``db`` at content version ``found``."""
    stat = os.stat(db)
    return {
        "store": _named(found.store),
        "path": os.path.realpath(db),
        "file": f"{stat.st_dev}:{stat.st_ino}",
        "version": found.version,
        "schema": str(found.schema),
        "changes": str(found.changes),
    }


def meta_seal(store_id: str, meta: dict[str, str]) -> str:
    """The seal over a table's meta rows (all but ``seal``)."""
    return seal(store_id, json.dumps(sorted((k, v) for k, v in meta.items() if k != "seal")))


def stale(meta: dict[str, str], db: Path, store: sqlite3.Connection, servers: Iterable[str]) -> str:
    """Why a start table with this ``meta`` cannot answer for these ``servers`` of the store at
    ``db`` (open on ``store``); "" when it can. Its rows are not looked at (:meth:`StartTable.row`)."""
    if meta.get("format") != FORMAT:
        return "it was written by another replay-sim (another table format)"
    found = content_version(store)
    if found is None:
        return "the store has no content version yet (an older replay-sim wrote it)"
    now = identity(db, found)
    if meta.get("store") != now["store"]:
        return f"it was written from another store ({meta.get('path', '?')})"
    if meta.get("seal") != meta_seal(found.store, meta):
        return "its meta rows were changed since it was written"
    if (meta.get("path"), meta.get("file")) != (now["path"], now["file"]):
        return f"it was written from another copy of this store ({meta.get('path')})"
    if meta.get("code") != code_digest():
        return "it was written by other replay-sim code (another version, or an edited checkout)"
    if (meta.get("version"), meta.get("schema")) != (now["version"], now["schema"]):
        return (
            f"the store was written since it was (row writes {meta.get('changes')} -> {now['changes']}"
            f"{', schema changed' if meta.get('schema') != now['schema'] else ''})"
        )
    written = json.loads(meta.get("servers", "[]"))
    missing = [s for s in servers if s not in written]
    return f"it has no server {missing[0]!r}" if missing else ""


class StartTable:
    """The answers a stdio start of one recorded server may give, read from its start table.

    Args:
        conn: The start table, open.
        store: The store, open read-only (whose writes :meth:`current` watches).
        server: The recorded server served.
        found: The store's content version the table was checked against.
        path: The table's file (named in :attr:`problem`).
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        store: sqlite3.Connection,
        server: str,
        found: ContentVersion,
        path: Path = Path(START_TABLE),
    ) -> None:
        self.conn = conn
        self.path = path
        self.store = store
        self.server = server
        self.problem = ""
        """Why the table stopped answering (a row that is not as it was written), or ""."""
        self._found = found
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
            why = stale(dict(conn.execute("SELECT key, value FROM meta").fetchall()), db, store, [server])
            found = content_version(store)
            if not why and found is not None and verified.verified(db, verified.stamp_of(db)):
                return cls(conn, store, server, found, path), ""
        except (sqlite3.Error, ValueError, OSError) as exc:
            why = f"it cannot be read ({' '.join(str(exc).split())})"
        conn.close()
        store.close()
        return None, why and f"{path} is not used: {why}; `replay-sim index build` writes it again"

    def _store_version(self) -> int:
        return int(self.store.execute("PRAGMA data_version").fetchone()[0])

    def current(self) -> bool:
        """Whether the store's content is still what the table was written from: nothing another
        connection committed since (``PRAGMA data_version``) wrote a call, listing, server or meta row."""
        moved = self._store_version()
        if moved == self._data_version:
            return True
        if content_version(self.store) != self._found:
            return False
        self._data_version = moved  # a write to other tables (the miss log, the embedding cache)
        return True

    def opening(self, version: str, method: str) -> bytes | None:
        """The result JSON of ``initialize`` asked at ``version``, or of a listing served at it."""
        row = self.conn.execute(
            "SELECT result, seal FROM openings WHERE server=? AND version=? AND method=?",
            (self.server, version, method),
        ).fetchone()
        if row is None or not self._sealed(row[1], self.server, version, method, bytes(row[0])):
            return None
        return bytes(row[0])

    def call(self, key: str) -> tuple[bytes, bool] | None:
        """The result JSON of the call with this exact key, and whether it holds after other calls."""
        row = self.conn.execute(
            "SELECT result, anytime, seal FROM answers WHERE server=? AND key=?", (self.server, key)
        ).fetchone()
        if row is None or not self._sealed(row[2], self.server, key, int(row[1]), bytes(row[0])):
            return None
        return bytes(row[0]), bool(row[1])

    def _sealed(self, found: str, *fields: Any) -> bool:
        """Whether a row is as it was written; else the table answers nothing more (:attr:`problem`)."""
        if self.problem:
            return False
        if found == seal(self._found.store, *fields):
            return True
        self.problem = (
            f"{self.path} is not used from here on: a row of it ({fields[:3]!r}) was changed since it "
            "was written; `replay-sim index build` writes it again"
        )
        return False

    def close(self) -> None:
        self.conn.close()
        self.store.close()
