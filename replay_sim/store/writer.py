"""The recorder's write path: a call's row, prepared while its server works, then committed.

A recorder commits each call before its client is answered, so the write is on the call's path:
:meth:`CallWriter.prepare_call` computes the row's request half (name, canonical arguments,
params, key) ahead of the answer, and :meth:`CallWriter.record_call` (one call) or
:meth:`CallWriter.record_calls` (several, one transaction) insert the rows. Reading them back is
:class:`~replay_sim.store.Store`'s business.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sqlite3
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

from replay_sim.canonical import call_identity, canonical_json
from replay_sim.store.database import Database
from replay_sim.store.records import Origin, utc_now

__all__ = ["CALL_COLUMNS", "CallWriter", "PreparedCall", "dumps"]

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def dumps(value: Any) -> str:
    """JSON text as received: key order kept, compact, non-ASCII kept."""
    return _ENCODER.encode(value)


@functools.lru_cache(maxsize=64)
def _key_head(server: str, method: str) -> str:
    """The start of a call key's payload (see :meth:`CallWriter.prepare_call`)."""
    return f"[{canonical_json(server)},{canonical_json(method)},"


CALL_COLUMNS = (
    "id, server, method, name, arguments, params, key, result, error, session, seq, "
    "latency_ms, recorded_at, origin, notifications"
)
"""The ``calls`` table's columns, in the order rows are written and read."""

_INSERT_CALL = f"INSERT INTO calls ({CALL_COLUMNS}) VALUES (NULL{', ?' * 14})"
# The same, seq the next free number of the session, found by the statement itself.
_APPEND_CALL = (
    f"INSERT INTO calls ({CALL_COLUMNS}) VALUES (NULL{', ?' * 9}, "
    f"(SELECT COALESCE(MAX(seq), 0) + 1 FROM calls WHERE session=?){', ?' * 4})"
)


@dataclass(frozen=True, slots=True)
class PreparedCall:
    """A call's request columns, computed before its answer arrives (:meth:`CallWriter.prepare_call`)."""

    name: str
    arguments: str
    params: str
    key: str


class CallWriter(Database):
    """Recording calls: the write path of :class:`~replay_sim.store.Store` (its methods)."""

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
        return PreparedCall(name, canonical, dumps(params), hashlib.sha256(payload.encode()).hexdigest())

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
                None if result is None else dumps(result),
                None if error is None else dumps(error),
                session,
                session if seq is None and session is not None else seq,
                latency_ms,
                recorded_at or utc_now(),
                str(origin),
                dumps(notifications) if notifications else None,
            ),
        )
        return int(cursor.lastrowid or 0)
