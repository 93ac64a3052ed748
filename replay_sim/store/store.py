"""The recording store: one SQLite file (WAL) holding servers, listings, sessions and calls.

Writers commit each call in its own short transaction, so a killed process loses at most the call
it was writing, and several recorders (threads or processes) can write to one file at once. Reads
never block writers (WAL). All sqlite3 errors are translated to :class:`StoreError` here, and
nowhere else.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlite_utils

from replay_sim.canonical import call_identity, call_key, canonical_json
from replay_sim.errors import StoreError
from replay_sim.protocol import LISTING_METHODS
from replay_sim.store.records import Origin, Recording, ServerRecord, utc_now

__all__ = ["DEFAULT_DB", "Store"]

DEFAULT_DB = Path("cache/replay.db")
SCHEMA_VERSION = 1


def _dumps(value: Any) -> str:
    """JSON text as received: key order kept, compact, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


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
"""

_CALL_COLUMNS = (
    "id, server, method, name, arguments, params, key, result, error, session, seq, "
    "latency_ms, recorded_at, origin, notifications"
)


class Store:
    """A recording store backed by one SQLite file.

    Safe to share between threads and async tasks of one process (writes are serialised by a lock)
    and between processes (SQLite WAL with a busy timeout).

    Args:
        path: The database file; created with its parent folder unless ``readonly``.
        readonly: Open an existing file read-only (snapshots); writing raises :class:`StoreError`.
        timeout: Seconds to wait for another writer's lock before giving up.
    """

    def __init__(
        self, path: str | Path = DEFAULT_DB, *, readonly: bool = False, timeout: float = 30.0
    ) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self._lock = threading.RLock()
        self._depth = 0  # transaction nesting of the thread holding the lock
        self.generation = 0
        """Counts this object's commits of recorded content: caches compare it instead of querying."""
        with self._translate("open"):
            if readonly:
                if not self.path.is_file():
                    raise StoreError(f"{self.path}: no such recording store; record or import first")
                conn = sqlite3.connect(
                    f"file:{self.path}?mode=ro", uri=True, check_same_thread=False, timeout=timeout
                )
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(
                    self.path, check_same_thread=False, timeout=timeout, isolation_level=None
                )
                conn.execute("PRAGMA journal_mode=WAL")
                # WAL + NORMAL survives a killed process (not a power cut) at a fraction of FULL's cost.
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(_SCHEMA)
                self._check_schema(conn)
            self.conn = conn
            self.db = sqlite_utils.Database(conn)

    # -- plumbing -----------------------------------------------------------------------------

    @contextmanager
    def _translate(self, action: str) -> Iterator[None]:
        """Turn sqlite3 errors into one clear :class:`StoreError` naming the file."""
        try:
            yield
        except sqlite3.Error as exc:
            text = str(exc)
            hint = ""
            if "locked" in text or "busy" in text:
                hint = " (another process holds a write lock; retry, or stop the other writer)"
            elif "full" in text:
                hint = " (the disk is full; free space and retry — nothing partial was written)"
            elif "readonly" in text:
                hint = " (the store is read-only, e.g. a snapshot)"
            raise StoreError(f"{self.path}: cannot {action}: {text}{hint}") from exc

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
    def transaction(self, action: str = "write", *, content: bool = True) -> Iterator[sqlite3.Connection]:
        """Run a block as one immediate transaction: all of it is committed or none of it.

        Nested calls join the outer transaction (an import commits once, atomically).

        Args:
            action: What is being written, for error messages.
            content: Whether the block changes recorded content (bumps :attr:`generation`); the
                embedding cache does not.
        """
        with self._lock, self._translate(action):
            if self._depth:
                self._depth += 1
                try:
                    yield self.conn
                finally:
                    self._depth -= 1
                return
            self._depth = 1
            try:
                self.conn.execute("BEGIN IMMEDIATE")
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

    def copy_to(self, path: str | Path) -> None:
        """Write a compact, self-contained copy of the store (``VACUUM INTO``) to a new file."""
        with self._lock, self._translate(f"copy to {path}"):
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

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock, self._translate("read"):
            return self.conn.execute(sql, params).fetchall()

    # -- store-wide settings -------------------------------------------------------------------

    def meta(self, key: str) -> Any:
        """A JSON value stored with the recordings (e.g. the redaction rules), or None."""
        rows = self._query("SELECT value FROM meta WHERE key=?", (key,))
        return json.loads(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: Any) -> None:
        """Store a JSON value with the recordings (replacing an older one)."""
        with self.transaction(f"record {key}", content=False) as conn:
            conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, _dumps(value)))

    # -- servers and listings -----------------------------------------------------------------

    def put_server(self, server: ServerRecord) -> None:
        """Record (or refresh) what a server said about itself at initialisation."""
        with self.transaction(f"record server {server.name!r}") as conn:
            conn.execute(
                "INSERT OR REPLACE INTO servers VALUES (?, ?, ?, ?, ?)",
                (
                    server.name,
                    _dumps(server.info),
                    _dumps(server.capabilities),
                    server.protocol_version,
                    server.instructions,
                ),
            )

    def servers(self) -> list[ServerRecord]:
        """All recorded servers, by name."""
        rows = self._query(
            "SELECT name, info, capabilities, protocol_version, instructions FROM servers ORDER BY name"
        )
        return [ServerRecord(r[0], json.loads(r[1]), json.loads(r[2]), r[3], r[4]) for r in rows]

    def server(self, name: str) -> ServerRecord | None:
        """The recorded server called ``name``, or None."""
        return next((s for s in self.servers() if s.name == name), None)

    def put_listing(self, server: str, method: str, result: dict[str, Any]) -> None:
        """Record the answer to a listing method (``tools/list`` …), replacing an older one."""
        if method not in LISTING_METHODS:
            raise StoreError(
                f"{self.path}: {method!r} is not a listing method ({', '.join(LISTING_METHODS)})"
            )
        with self.transaction(f"record {method} of {server!r}") as conn:
            conn.execute("INSERT OR REPLACE INTO listings VALUES (?, ?, ?)", (server, method, _dumps(result)))

    def listings(self, server: str) -> dict[str, dict[str, Any]]:
        """The recorded listings of ``server``, by method."""
        rows = self._query("SELECT method, result FROM listings WHERE server=? ORDER BY method", (server,))
        return {method: json.loads(result) for method, result in rows}

    # -- sessions and calls ---------------------------------------------------------------------

    def start_session(self, server: str, session_id: str | None = None, started_at: str | None = None) -> str:
        """Open a recording session and return its id (generated unless given)."""
        session_id = session_id or f"s-{uuid.uuid4().hex[:12]}"
        with self.transaction(f"start session {session_id!r}") as conn:
            conn.execute(
                "INSERT OR IGNORE INTO sessions VALUES (?, ?, ?)",
                (session_id, server, started_at or utc_now()),
            )
        return session_id

    def record_call(
        self,
        server: str,
        method: str,
        params: dict[str, Any],
        *,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        session: str | None = None,
        seq: int | None = None,
        latency_ms: float | None = None,
        recorded_at: str | None = None,
        origin: str = Origin.LIVE,
        notifications: list[dict[str, Any]] | None = None,
    ) -> int:
        """Commit one call and its answer; returns the new recording id once it is durable.

        Args:
            server: Recorded server name.
            method: MCP method of the request.
            params: Request params, wire JSON (``_meta`` is dropped).
            result: The result as received, or None when the server answered with an error.
            error: The JSON-RPC error object (``code``, ``message``, ``data``), if any.
            session: Recording session id.
            seq: Position in the session; the next free number when None.
            latency_ms: Upstream round-trip time.
            recorded_at: ISO-8601 timestamp; now when None.
            origin: An :class:`Origin` value.
            notifications: Progress/logging notifications received during the call, in order.

        Returns:
            The recording id.
        """
        params = {k: v for k, v in params.items() if k != "_meta"}
        name, arguments = call_identity(method, params)
        key = call_key(server, method, name, arguments)
        with self.transaction(f"record {method} {name!r} of {server!r}") as conn:
            if session is not None and seq is None:
                (seq,) = conn.execute(
                    "SELECT COALESCE(MAX(seq), 0) + 1 FROM calls WHERE session=?", (session,)
                ).fetchone()
            cursor = conn.execute(
                f"INSERT INTO calls ({_CALL_COLUMNS}) VALUES (NULL{', ?' * 14})",
                (
                    server,
                    method,
                    name,
                    canonical_json(arguments),
                    _dumps(params),
                    key,
                    None if result is None else _dumps(result),
                    None if error is None else _dumps(error),
                    session,
                    seq,
                    latency_ms,
                    recorded_at or utc_now(),
                    str(origin),
                    _dumps(notifications) if notifications else None,
                ),
            )
            return int(cursor.lastrowid or 0)

    def contains(
        self,
        server: str,
        method: str,
        params: dict[str, Any],
        session: str | None,
        seq: int | None,
        recorded_at: str,
    ) -> bool:
        """True when this exact recording (same call, session position and time) is stored already."""
        name, arguments = call_identity(method, params)
        rows = self._query(
            "SELECT 1 FROM calls WHERE key=? AND session IS ? AND seq IS ? AND recorded_at=? LIMIT 1",
            (call_key(server, method, name, arguments), session, seq, recorded_at),
        )
        return bool(rows)

    def _recordings(self, where: str = "", params: tuple[Any, ...] = ()) -> list[Recording]:
        rows = self._query(f"SELECT {_CALL_COLUMNS} FROM calls {where}", params)
        return [
            Recording(
                id=r[0],
                server=r[1],
                method=r[2],
                name=r[3],
                arguments=json.loads(r[4]),
                params=json.loads(r[5]),
                key=r[6],
                result=_loads(r[7]),
                error=_loads(r[8]),
                session=r[9],
                seq=r[10],
                latency_ms=r[11],
                recorded_at=r[12],
                origin=r[13],
                notifications=_loads(r[14]) or [],
            )
            for r in rows
        ]

    def recording(self, recording_id: int) -> Recording | None:
        """The recording with this id, or None."""
        found = self._recordings("WHERE id=?", (recording_id,))
        return found[0] if found else None

    def recordings(
        self,
        server: str | None = None,
        *,
        method: str | None = None,
        name: str | None = None,
        session: str | None = None,
        key: str | None = None,
        after_id: int = 0,
        limit: int | None = None,
    ) -> list[Recording]:
        """Recordings matching every given filter, in recorded (id) order."""
        clauses: list[str] = ["id > ?"]
        params: list[Any] = [after_id]
        for column, value in (
            ("server", server),
            ("method", method),
            ("name", name),
            ("session", session),
            ("key", key),
        ):
            if value is not None:
                clauses.append(f"{column}=?")
                params.append(value)
        tail = f" LIMIT {int(limit)}" if limit is not None else ""
        return self._recordings(f"WHERE {' AND '.join(clauses)} ORDER BY id{tail}", tuple(params))

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Query rows as dicts keyed by column name (sqlite-utils), under the store's lock."""
        with self._lock, self._translate("read"):
            return list(self.db.query(sql, params))

    def sessions(self) -> list[dict[str, Any]]:
        """Every session with its server, start time and number of calls."""
        return self._rows(
            "SELECT s.id, s.server, s.started_at, COUNT(c.id) AS calls FROM sessions s "
            "LEFT JOIN calls c ON c.session = s.id GROUP BY s.id ORDER BY s.started_at, s.id"
        )

    def stats(self) -> list[dict[str, Any]]:
        """Call counts per server, method, name and origin, with error counts and mean latency."""
        rows = self._rows(
            "SELECT server, method, name, origin, COUNT(*) AS calls, "
            "SUM(error IS NOT NULL OR json_extract(result, '$.isError') = 1) AS errors, "
            "AVG(latency_ms) AS mean_latency_ms "
            "FROM calls GROUP BY server, method, name, origin ORDER BY server, method, name, origin"
        )
        for row in rows:
            row["errors"] = int(row["errors"] or 0)
            if row["mean_latency_ms"] is not None:
                row["mean_latency_ms"] = round(row["mean_latency_ms"], 3)
        return rows

    def data_version(self) -> int:
        """A number that changes when *another* connection commits to the file (``PRAGMA data_version``)."""
        return int(self._query("PRAGMA data_version")[0][0])

    def fingerprint(self) -> str:
        """A cheap token that changes whenever calls are added (ties an index to this store)."""
        ((count, max_id),) = self._query("SELECT COUNT(*), COALESCE(MAX(id), 0) FROM calls")
        return f"calls:{count}:{max_id}"

    # -- embedding cache ------------------------------------------------------------------------

    def cached_embeddings(self, model: str, text_shas: list[str]) -> dict[str, bytes]:
        """Stored embedding vectors (raw float32 bytes) for the given text hashes of one model."""
        found: dict[str, bytes] = {}
        for start in range(0, len(text_shas), 500):
            chunk = text_shas[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for sha, vector in self._query(
                f"SELECT text_sha, vector FROM embeddings WHERE model=? AND text_sha IN ({marks})",
                (model, *chunk),
            ):
                found[sha] = vector
        return found

    def cache_embeddings(self, model: str, vectors: dict[str, bytes]) -> None:
        """Store embedding vectors (raw float32 bytes) by text hash for one model."""
        if self.readonly or not vectors:
            return
        with self.transaction("cache embeddings", content=False) as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO embeddings VALUES (?, ?, ?)",
                [(model, s, v) for s, v in vectors.items()],
            )
