"""The SQLite file under a recording store: its tables, opening it, transactions and errors.

One file in WAL mode: writers commit in short immediate transactions serialised by a lock (and by
SQLite's between processes), readers never block writers. A writer waiting for *another process's*
write lock (``replay-sim import`` or ``record`` on the file a replay serves) waits without holding
the in-process lock, so the process's readers — a replay's request path — never wait on another
process. All sqlite3 errors are translated to :class:`~replay_sim.errors.StoreError` naming the
file here, and nowhere else. What is recorded in the tables is :class:`replay_sim.store.Store`'s
business.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from replay_sim.errors import StoreError, StoreLockedError
from replay_sim.store import content
from replay_sim.store.opening import check_file

if TYPE_CHECKING:
    import sqlite_utils

__all__ = ["SCHEMA_VERSION", "Database", "drop_embedding_cache"]

SCHEMA_VERSION = 1
"""Changes when a store's tables change in a way older code cannot read. A table added later (the
``misses`` log) does not change it: opening a store for writing creates what it lacks
(``CREATE TABLE IF NOT EXISTS``), and its readers take a store without it — an older store, or a
read-only snapshot of one — as holding none, so stores of either age open with either code. So
does ``miss_steps`` (the misses' histories, :mod:`replay_sim.store.miss_history`): older code reads
a miss referring to it as one whose history was not kept (it cannot backfill it). And so does
``session_sources`` (what made a session: a sandbox's fingerprint, :mod:`replay_sim.store.sources`)."""

_RETRY_CAP = 0.05  # seconds between two tries for another process's write lock, at most

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS servers (
    name TEXT PRIMARY KEY, info TEXT NOT NULL, capabilities TEXT NOT NULL,
    protocol_version TEXT, instructions TEXT);
CREATE TABLE IF NOT EXISTS listings (
    server TEXT NOT NULL, method TEXT NOT NULL, result TEXT NOT NULL, PRIMARY KEY (server, method));
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, server TEXT NOT NULL, started_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS calls (
    id INTEGER PRIMARY KEY, server TEXT NOT NULL, method TEXT NOT NULL, name TEXT NOT NULL,
    arguments TEXT NOT NULL, params TEXT NOT NULL, key TEXT NOT NULL,
    result TEXT, error TEXT, notifications TEXT,
    session TEXT, seq INTEGER, latency_ms REAL, recorded_at TEXT NOT NULL, origin TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS calls_key ON calls (key);
CREATE INDEX IF NOT EXISTS calls_tool ON calls (server, method, name);
CREATE INDEX IF NOT EXISTS calls_session ON calls (session, seq);
CREATE TABLE IF NOT EXISTS embeddings (
    model TEXT NOT NULL, text_sha TEXT NOT NULL, vector BLOB NOT NULL, PRIMARY KEY (model, text_sha));
CREATE TABLE IF NOT EXISTS misses (
    id INTEGER PRIMARY KEY, server TEXT NOT NULL, method TEXT NOT NULL, name TEXT NOT NULL,
    key TEXT NOT NULL, params TEXT NOT NULL, prefix TEXT, state TEXT NOT NULL,
    status TEXT NOT NULL, reason TEXT NOT NULL, candidates TEXT,
    count INTEGER NOT NULL, first_at TEXT NOT NULL, last_at TEXT NOT NULL, UNIQUE (key, state));
CREATE TABLE IF NOT EXISTS session_sources (
    session TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, detail TEXT);
CREATE TABLE IF NOT EXISTS miss_steps (
    id INTEGER PRIMARY KEY, parent INTEGER NOT NULL, key TEXT NOT NULL, method TEXT, params TEXT,
    UNIQUE (parent, key));
"""


class Database:
    """One store file, opened for reading and writing, or read-only.

    Args:
        path: The database file.
        readonly: Open an existing file read-only (snapshots); writing raises :class:`StoreError`.
        create: Create the file (and its folder) when it does not exist; when False a missing
            file is a :class:`StoreError`, so a mistyped path is never mistaken for an empty store.
            A read-only store is never created.
        timeout: Seconds to wait for another writer's lock before giving up.

    Raises:
        StoreError: The file is missing (and may not be created), unreadable, of another schema
            version, not a replay-sim store (a SQLite file with other tables: nothing is added to
            it), or damaged (``PRAGMA integrity_check`` fails).
    """

    def __init__(
        self, path: str | Path, *, readonly: bool = False, create: bool = True, timeout: float = 30.0
    ) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self.timeout = timeout
        self._lock = threading.RLock()
        self._depth = 0  # transaction nesting of the thread holding the lock
        self._patient = True  # SQLite's busy wait is on (``timeout``); a write turns it off (_begin)
        self.generation = 0
        """Counts this object's commits of recorded content: caches compare it instead of querying."""
        if not create or readonly:
            if not self.path.exists():
                raise StoreError(f"{self.path}: no such recording store; record or import first")
            if not self.path.is_file():
                raise StoreError(f"{self.path}: is a folder, not a recording store; give the store's file")
        with self._translate("open"):
            if readonly:
                conn = sqlite3.connect(
                    f"file:{self.path}?mode=ro", uri=True, check_same_thread=False, timeout=timeout
                )
                check_file(self.path, conn)
            else:
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise StoreError(
                        f"{self.path}: cannot create its folder: {exc.strerror or exc}; choose another --db"
                    ) from exc
                conn = sqlite3.connect(
                    self.path, check_same_thread=False, timeout=timeout, isolation_level=None
                )
                check_file(self.path, conn)  # before anything is written to it
                conn.execute("PRAGMA journal_mode=WAL")
                # WAL + NORMAL survives a killed process (not a power cut) at a fraction of FULL's cost.
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(_SCHEMA + content.SCHEMA)
                content.ensure(conn)
                self._check_schema(conn)
            self.conn = conn
            self._db: sqlite_utils.Database | None = None

    @property
    def db(self) -> sqlite_utils.Database:
        """sqlite-utils over this connection, for ad-hoc queries.

        Imported on first use: it imports pandas when that is installed, a third of a second a
        replay server need not wait for.
        """
        if self._db is None:
            import sqlite_utils

            self._db = sqlite_utils.Database(self.conn)
        with self._lock:
            self._patience()
        return self._db

    @contextmanager
    def _translate(self, action: str) -> Iterator[None]:
        """Turn sqlite3 errors into one clear :class:`StoreError` naming the file."""
        try:
            yield
        except sqlite3.Error as exc:
            raise self._translated(action, exc) from exc

    def _translated(self, action: str, exc: sqlite3.Error) -> StoreError:
        text = str(exc)
        hint = ""
        if "locked" in text or "busy" in text:
            hint = " (another process holds a write lock; retry, or stop the other writer)"
        elif "full" in text:
            hint = " (the disk is full; free space and retry — nothing partial was written)"
        elif "readonly" in text:
            hint = " (the store is read-only, e.g. a snapshot)"
        return StoreError(f"{self.path}: cannot {action}: {text}{hint}")

    def _check_schema(self, conn: sqlite3.Connection) -> None:
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) != SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: schema version {row[0]}, this replay-sim reads {SCHEMA_VERSION}; "
                "export with the matching version and re-import"
            )

    @contextmanager
    def transaction(
        self, action: str = "write", *, content: bool = True, wait: bool = True
    ) -> Iterator[sqlite3.Connection]:
        """Run a block as one immediate transaction: all of it is committed or none of it.

        Nested calls join the outer transaction (an import commits once, atomically). While another
        process holds the file's write lock, the wait for it holds no lock of this object: the
        process's reads go on meanwhile (WAL readers are never blocked by a writer).

        Args:
            action: What is being written, for error messages.
            content: Whether the block changes recorded content (bumps :attr:`generation`); the
                embedding cache does not.
            wait: Wait up to :attr:`timeout` for another process's write lock; when False, a
                store another process is writing is a :class:`~replay_sim.errors.StoreLockedError`
                at once (for what a server writes in passing, which must not stall it).

        Raises:
            StoreLockedError: Another process held the write lock past the wait.
            StoreError: The block could not be written.
        """
        nested = self._enter(action, wait)  # holds self._lock from here on
        try:
            with self._translate(action):
                if nested:
                    self._depth += 1
                    try:
                        yield self.conn
                    finally:
                        self._depth -= 1
                    return
                self._depth = 1
                try:
                    yield self.conn
                    self.conn.execute("COMMIT")
                    if content:
                        self.generation += 1
                except BaseException:
                    if self.conn.in_transaction:  # SQLite already rolled back on e.g. SQLITE_FULL
                        self.conn.execute("ROLLBACK")
                    raise
                finally:
                    self._depth = 0
        finally:
            self._lock.release()

    def _enter(self, action: str, wait: bool) -> bool:
        """Take this object's lock and begin a write transaction (or join this thread's); True when joined.

        SQLite's own busy wait would hold the lock for all of another process's transaction, so
        the lock is tried without one and, while another process holds it, given back between
        tries (a few milliseconds apart, as SQLite's busy handler polls).
        """
        deadline = time.monotonic() + (self.timeout if wait else 0.0)
        pause = 0.001
        while True:
            self._lock.acquire()
            if self._depth:  # this thread is inside a transaction of its own: join it
                return True
            try:
                self._begin()
                return False
            except sqlite3.OperationalError as exc:
                self._lock.release()
                left = deadline - time.monotonic()
                if not _busy(exc):
                    raise self._translated(action, exc) from exc
                if left <= 0:
                    waited = f" (waited {self.timeout:g} s)" if wait else ""
                    raise StoreLockedError(
                        f"{self.path}: cannot {action}: another process holds a write lock on it"
                        f"{waited}; retry, or stop the other writer"
                    ) from exc
            except BaseException:
                self._lock.release()
                raise
            time.sleep(min(pause, left))
            pause = min(pause * 2, _RETRY_CAP)

    def _begin(self) -> None:
        """``BEGIN IMMEDIATE`` without SQLite's busy wait (:meth:`_enter` waits instead).

        The wait stays off after it, for the next write (a recorder commits every call: two
        statements fewer each time); the next read turns it back on (:meth:`_patience`).
        """
        if self._patient:
            self.conn.execute("PRAGMA busy_timeout = 0")
            self._patient = False
        self.conn.execute("BEGIN IMMEDIATE")

    def _patience(self) -> None:
        """SQLite's busy wait back on before a read (in WAL mode a read waits only in rare moments,
        such as another connection recovering the WAL). Called holding :attr:`_lock`."""
        if not self._patient:
            self.conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            self._patient = True

    def copy_to(self, path: str | Path) -> None:
        """Write a compact, self-contained copy of the store (``VACUUM INTO``) to a new file."""
        with self._lock, self._translate(f"copy to {path}"):
            self._patience()
            self.conn.execute("VACUUM INTO ?", (str(path),))
        # A single-file rollback-journal copy opens read-only anywhere (WAL would need a -shm file).
        with self._translate(f"finish copy {path}"):
            copy = sqlite3.connect(path)
            try:
                copy.execute("PRAGMA journal_mode=DELETE")
            finally:
                copy.close()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self.conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock, self._translate("read"):
            self._patience()
            return self.conn.execute(sql, params).fetchall()

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Query rows as dicts keyed by column name, under the store's lock."""
        with self._lock, self._translate("read"):
            self._patience()
            cursor = self.conn.execute(sql, params)
            names = [column[0] for column in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def data_version(self) -> int:
        """A number that changes when *another* connection commits to the file (``PRAGMA data_version``)."""
        with self._lock:  # asked before every answer: no context manager of its own
            try:
                self._patience()
                return int(self.conn.execute("PRAGMA data_version").fetchone()[0])
            except sqlite3.Error as exc:
                raise self._translated("read", exc) from exc

    def version(self) -> tuple[int, int]:
        """A pair that moves whenever anything is committed to the file: this connection's content
        commits (:attr:`generation`) and other connections' commits (:meth:`data_version`)."""
        return self.generation, self.data_version()


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused because another connection holds a lock (SQLITE_BUSY / SQLITE_LOCKED)."""
    text = str(exc)
    return "locked" in text or "busy" in text


def drop_embedding_cache(path: str | Path) -> None:
    """Empty the embedding cache of a store copy (a snapshot's) and compact the file.

    Raises:
        StoreError: The file cannot be written (names it).
    """
    try:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("DELETE FROM embeddings")
            conn.execute("VACUUM")
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot drop the embedding cache of the copy: {exc}") from exc
