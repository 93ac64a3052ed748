"""The recording store: servers, listings, sessions and calls, in one SQLite file (WAL).

Writers commit each call in its own short transaction, so a killed process loses at most the call
it was writing, and several recorders (threads or processes) can write to one file at once. Reads
never block writers (WAL). The file itself — tables, transactions, translating sqlite3 errors to
:class:`~replay_sim.errors.StoreError` — is :mod:`replay_sim.store.database`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sqlite3
import unicodedata
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

from replay_sim.canonical import call_identity, call_key, canonical_json
from replay_sim.errors import StoreError
from replay_sim.protocol import LISTING_METHODS
from replay_sim.store.database import Database
from replay_sim.store.records import Origin, Recording, ServerRecord, utc_now

__all__ = ["DEFAULT_DB", "PreparedCall", "Store"]

DEFAULT_DB = Path("cache/replay.db")


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _dumps(value: Any) -> str:
    """JSON text as received: key order kept, compact, non-ASCII kept."""
    return _ENCODER.encode(value)


@functools.lru_cache(maxsize=64)
def _key_head(server: str, method: str) -> str:
    """The start of a call key's payload (see :meth:`Store.prepare_call`)."""
    return f"[{canonical_json(server)},{canonical_json(method)},"


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


_CALL_COLUMNS = (
    "id, server, method, name, arguments, params, key, result, error, session, seq, "
    "latency_ms, recorded_at, origin, notifications"
)
_INSERT_CALL = f"INSERT INTO calls ({_CALL_COLUMNS}) VALUES (NULL{', ?' * 14})"
# The same, seq the next free number of the session, found by the statement itself.
_APPEND_CALL = (
    f"INSERT INTO calls ({_CALL_COLUMNS}) VALUES (NULL{', ?' * 9}, "
    f"(SELECT COALESCE(MAX(seq), 0) + 1 FROM calls WHERE session=?){', ?' * 4})"
)


@dataclass(frozen=True, slots=True)
class PreparedCall:
    """A call's request columns, computed before its answer arrives (:meth:`Store.prepare_call`)."""

    name: str
    arguments: str
    params: str
    key: str


class Store(Database):
    """A recording store backed by one SQLite file: servers, listings, sessions and calls.

    Safe to share between threads and async tasks of one process (writes are serialised by a lock)
    and between processes (SQLite WAL with a busy timeout).

    Args:
        path: The database file; created with its parent folder unless ``readonly`` or ``create``
            is False.
        readonly: Open an existing file read-only (snapshots); writing raises :class:`StoreError`.
        create: When False, refuse a path where no store exists (:class:`StoreError` "no such
            recording store") instead of creating an empty one: for every reader of recordings.
        timeout: Seconds to wait for another writer's lock before giving up.
    """

    def __init__(
        self,
        path: str | Path = DEFAULT_DB,
        *,
        readonly: bool = False,
        create: bool = True,
        timeout: float = 30.0,
    ) -> None:
        super().__init__(path, readonly=readonly, create=create, timeout=timeout)

    # -- store-wide settings -------------------------------------------------------------------

    def meta(self, key: str) -> Any:
        """A JSON value stored with the recordings (e.g. the redaction rules), or None."""
        rows = self._query("SELECT value FROM meta WHERE key=?", (key,))
        return json.loads(rows[0][0]) if rows else None

    def metas(self) -> dict[str, Any]:
        """Every JSON value stored with the recordings, by key."""
        return {
            key: json.loads(value) for key, value in self._query("SELECT key, value FROM meta ORDER BY key")
        }

    def set_meta(self, key: str, value: Any, *, wait: bool = True) -> None:
        """Store a JSON value with the recordings (replacing an older one).

        Args:
            key: Its name.
            value: Any JSON value.
            wait: Wait for another writer's lock (else a :class:`StoreError` at once; see
                :meth:`~replay_sim.store.database.Database.transaction`).
        """
        with self.transaction(f"record {key}", content=False, wait=wait) as conn:
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

    def record_calls(self, calls: Sequence[Mapping[str, Any]]) -> list[int]:
        """Commit several calls (keyword arguments of :meth:`record_call` each) in one transaction.

        Returns:
            Their recording ids, in order, once all of them are durable (or none is recorded).
        """
        with self.transaction(f"record {len(calls)} calls") as conn:
            return [self._insert(conn, **call) for call in calls]

    def prepare_call(self, server: str, method: str, params: dict[str, Any]) -> PreparedCall:
        """The request columns of a call (its name, arguments, params and key), for :meth:`record_call`.

        A recorder computes them while the server works on the call, not after it answers.
        """
        params = {k: v for k, v in params.items() if k != "_meta"}
        name, arguments = call_identity(method, params)
        canonical = canonical_json(arguments)
        # call_key's payload, canonical_json([server, method, name, arguments]), with the
        # arguments' canonical text made once: a list's items are serialised one by one (and a
        # string's canonical text is its NFC form's JSON string).
        name_json = encode_basestring(unicodedata.normalize("NFC", name))
        payload = f"{_key_head(server, method)}{name_json},{canonical}]"
        return PreparedCall(name, canonical, _dumps(params), hashlib.sha256(payload.encode()).hexdigest())

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
        prepared: PreparedCall | None = None,
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
            prepared: :meth:`prepare_call`'s columns of ``server``, ``method`` and ``params``
                (computed here when None).

        Returns:
            The recording id.
        """
        if prepared is None:
            prepared = self.prepare_call(server, method, params)
        with self.transaction(f"record {method} {prepared.name!r} of {server!r}") as conn:
            return self._insert(
                conn,
                server,
                method,
                params,
                result=result,
                error=error,
                session=session,
                seq=seq,
                latency_ms=latency_ms,
                recorded_at=recorded_at,
                origin=origin,
                notifications=notifications,
                prepared=prepared,
            )

    def _insert(
        self,
        conn: sqlite3.Connection,
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
        prepared: PreparedCall | None = None,
    ) -> int:
        """Insert one call (:meth:`record_call`'s arguments) in the transaction under way."""
        if prepared is None:
            prepared = self.prepare_call(server, method, params)
        cursor = conn.execute(
            _APPEND_CALL if session is not None and seq is None else _INSERT_CALL,
            (
                server,
                method,
                prepared.name,
                prepared.arguments,
                prepared.params,
                prepared.key,
                None if result is None else _dumps(result),
                None if error is None else _dumps(error),
                session,
                session if seq is None and session is not None else seq,
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

    def outcomes(self, server: str) -> list[tuple[Any, ...]]:
        """What judging tool effects reads of each call of ``server``, in recorded (id) order.

        Returns:
            ``(id, method, name, key, arguments, result, error, session, seq)`` per call: the
            columns of its :class:`Recording` (arguments, result and error parsed), without the
            rest (a third of the time of :meth:`recordings` on a large store).
        """
        rows = self._query(
            "SELECT id, method, name, key, arguments, result, error, session, seq FROM calls "
            "WHERE server=? ORDER BY id",
            (server,),
        )
        return [(i, m, n, k, json.loads(a), _loads(r), _loads(e), s, q) for i, m, n, k, a, r, e, s, q in rows]

    def names(self) -> set[tuple[str, str, str]]:
        """Every recorded ``(server, method, name)``: :meth:`stats`' keys, without reading the rows."""
        rows = self._query("SELECT DISTINCT server, method, name FROM calls")
        return {(server, method, name) for server, method, name in rows}

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

    def embedding_cache_size(self) -> int:
        """How many vectors the embedding cache holds, of every model."""
        return int(self._query("SELECT COUNT(*) FROM embeddings")[0][0])

    def cache_embeddings(self, model: str, vectors: dict[str, bytes]) -> None:
        """Store embedding vectors (raw float32 bytes) by text hash for one model."""
        if self.readonly or not vectors:
            return
        with self.transaction("cache embeddings", content=False) as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO embeddings VALUES (?, ?, ?)",
                [(model, s, v) for s, v in vectors.items()],
            )
