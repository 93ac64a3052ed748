"""The recording store: servers, listings, sessions and calls, in one SQLite file (WAL).

Writers commit each call in its own short transaction, so a killed process loses at most the call
it was writing, and several recorders (threads or processes) can write to one file at once. Reads
never block writers (WAL). The file itself — tables, transactions, translating sqlite3 errors to
:class:`~replay_sim.errors.StoreError` — is :mod:`replay_sim.store.database`; committing calls (the
recorder's write path, a call's row prepared ahead) is :mod:`replay_sim.store.writer`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from replay_sim.canonical import call_identity, call_key
from replay_sim.errors import StoreError
from replay_sim.protocol import LISTING_METHODS
from replay_sim.store.records import Recording, ServerRecord, utc_now
from replay_sim.store.writer import CALL_COLUMNS, CallWriter, dumps

__all__ = ["DEFAULT_DB", "REMOVALS_META_KEY", "Store"]

DEFAULT_DB = Path("cache/replay.db")
REMOVALS_META_KEY = "calls_removed"
"""Meta key counting the times calls were removed (``replay-sim forget``). SQLite gives a removed
greatest id to the next call, so the count and greatest id of the calls alone may look unchanged."""
T = TypeVar("T")


class _Corrupt(Exception):
    """A column's JSON text does not parse (turned into a :class:`StoreError` naming its row)."""


def _loads(text: str | None, column: str = "value") -> Any:
    try:
        return None if text is None else json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _Corrupt(f"its {column} is not JSON ({exc})") from None


def _recording(r: tuple[Any, ...]) -> Recording:
    return Recording(
        id=r[0],
        server=r[1],
        method=r[2],
        name=r[3],
        arguments=_loads(r[4], "arguments"),
        params=_loads(r[5], "params"),
        key=r[6],
        result=_loads(r[7], "result"),
        error=_loads(r[8], "error"),
        session=r[9],
        seq=r[10],
        latency_ms=r[11],
        recorded_at=r[12],
        origin=r[13],
        notifications=_loads(r[14], "notifications") or [],
    )


class Store(CallWriter):
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
        return self.metas(key).get(key)

    def metas(self, key: str | None = None) -> dict[str, Any]:
        """Every JSON value stored with the recordings (or only ``key``'s), by key."""
        if key is None:
            rows = self._query("SELECT key, value FROM meta ORDER BY key")
        else:
            rows = self._query("SELECT key, value FROM meta WHERE key=?", (key,))
        decoded = self._decoded(rows, lambda r: _loads(r[1]), lambda r: f"meta value {r[0]!r}")
        return {k: value for (k, _), value in zip(rows, decoded, strict=True)}

    def set_meta(self, key: str, value: Any, *, wait: bool = True) -> None:
        """Store a JSON value with the recordings (replacing an older one).

        Args:
            key: Its name.
            value: Any JSON value.
            wait: Wait for another writer's lock (else a :class:`StoreError` at once; see
                :meth:`~replay_sim.store.database.Database.transaction`).
        """
        with self.transaction(f"record {key}", content=False, wait=wait) as conn:
            # An upsert that leaves an equal value alone: no new content version for it.
            conn.execute(
                "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value "
                "WHERE value IS NOT excluded.value",
                (key, dumps(value)),
            )

    # -- servers and listings -----------------------------------------------------------------

    def put_server(self, server: ServerRecord) -> None:
        """Record (or refresh) what a server said about itself at initialisation."""
        with self.transaction(f"record server {server.name!r}") as conn:
            conn.execute(
                "INSERT INTO servers VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                "info = excluded.info, capabilities = excluded.capabilities, "
                "protocol_version = excluded.protocol_version, instructions = excluded.instructions "
                "WHERE (info, capabilities, protocol_version, instructions) IS NOT "
                "(excluded.info, excluded.capabilities, excluded.protocol_version, excluded.instructions)",
                (
                    server.name,
                    dumps(server.info),
                    dumps(server.capabilities),
                    server.protocol_version,
                    server.instructions,
                ),
            )

    def servers(self) -> list[ServerRecord]:
        """All recorded servers, by name."""
        rows = self._query(
            "SELECT name, info, capabilities, protocol_version, instructions FROM servers ORDER BY name"
        )
        return self._decoded(
            rows,
            lambda r: ServerRecord(r[0], _loads(r[1], "info"), _loads(r[2], "capabilities"), r[3], r[4]),
            lambda r: f"server {r[0]!r}",
        )

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
            conn.execute(
                "INSERT INTO listings VALUES (?, ?, ?) ON CONFLICT (server, method) DO UPDATE "
                "SET result = excluded.result WHERE result IS NOT excluded.result",
                (server, method, dumps(result)),
            )

    def listings(self, server: str) -> dict[str, dict[str, Any]]:
        """The recorded listings of ``server``, by method."""
        rows = self._query("SELECT method, result FROM listings WHERE server=? ORDER BY method", (server,))
        decoded = self._decoded(
            rows, lambda r: _loads(r[1], "result"), lambda r: f"the {r[0]} listing of {server!r}"
        )
        return {method: result for (method, _), result in zip(rows, decoded, strict=True)}

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
        rows = self._query(f"SELECT {CALL_COLUMNS} FROM calls {where}", params)
        return self._decoded(rows, _recording, lambda r: f"recording #{r[0]}")

    def _decoded(
        self, rows: list[tuple[Any, ...]], decode: Callable[[tuple[Any, ...]], T], what: Callable[[Any], str]
    ) -> list[T]:
        """Rows decoded one by one; a column whose JSON does not parse is a StoreError naming its row."""
        decoded: list[T] = []
        for row in rows:
            try:
                decoded.append(decode(row))
            except _Corrupt as exc:
                raise StoreError(
                    f"{self.path}: {what(row)} is corrupt: {exc}; restore the store from a copy or an export"
                ) from None
        return decoded

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
        upto_id: int | None = None,
        limit: int | None = None,
    ) -> list[Recording]:
        """Recordings matching every given filter, in recorded (id) order (ids in ``(after_id, upto_id]``)."""
        clauses: list[str] = ["id > ?"]
        params: list[Any] = [after_id]
        if upto_id is not None:
            clauses.append("id <= ?")
            params.append(upto_id)
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

    def outcomes(self, server: str, after: int = 0) -> list[tuple[Any, ...]]:
        """What judging tool effects reads of each call of ``server``, in recorded (id) order.

        Args:
            server: The recorded server.
            after: Only calls of a greater id (those added since one was read).

        Returns:
            ``(id, method, name, key, arguments, result, error, session, seq)`` per call: the
            columns of its :class:`Recording` (arguments, result and error parsed), without the
            rest (a third of the time of :meth:`recordings` on a large store).
        """
        rows = self._query(
            "SELECT id, method, name, key, arguments, result, error, session, seq FROM calls "
            "WHERE server=? AND id>? ORDER BY id",
            (server, after),
        )
        return self._decoded(
            rows,
            lambda r: (
                *r[:4],
                _loads(r[4], "arguments"),
                _loads(r[5], "result"),
                _loads(r[6], "error"),
                *r[7:],
            ),
            lambda r: f"recording #{r[0]}",
        )

    def names(self) -> set[tuple[str, str, str]]:
        """Every recorded ``(server, method, name)``: :meth:`stats`' keys, without reading the rows."""
        rows = self._query("SELECT DISTINCT server, method, name FROM calls")
        return {(server, method, name) for server, method, name in rows}

    def fingerprint(self, server: str | None = None) -> str:
        """A cheap token that changes whenever calls are added or removed (ties an index to this store).

        Args:
            server: Only this server's calls count (what is learned of one server's tools).
        """
        count, max_id, removals = self.counted(server)
        named = "" if server is None else f"{server}:"
        removed = f"removed{removals}:" if removals else ""  # the greatest id last, as before removals
        return f"calls:{named}{count}:{removed}{max_id}"

    def counted(self, server: str | None = None) -> tuple[int, int, int]:
        """How many calls there are (of ``server`` only, if given), the greatest id among them (0
        without any), and how many times calls were removed (:data:`REMOVALS_META_KEY`)."""
        where, args = ("WHERE server=?", (server,)) if server is not None else ("", ())
        ((count, max_id, removals),) = self._query(
            "SELECT COUNT(*), COALESCE(MAX(id), 0), "
            f"(SELECT COALESCE(MAX(CAST(value AS INTEGER)), 0) FROM meta WHERE key=?) FROM calls {where}",
            (REMOVALS_META_KEY, *args),
        )
        return int(count), int(max_id), int(removals)

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
