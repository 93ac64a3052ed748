"""The miss log: every call a replay could not answer, with what it takes to reproduce it.

A miss is worth keeping only if it can become a recording: ``replay-sim backfill``
(:mod:`replay_sim.record.backfill`) asks the real server the missed call *from the state it was
missed in*. So each miss keeps its server, method and params, and the state-changing calls its
episode made before it (their method and params, not just their keys: the recordings they were
answered from may not be in the store that backfills, and a call no recording answered has no
recording at all). One row per call and state, counted: rollouts repeat their misses.

The replay never waits for the log: :meth:`MissLog.add <replay_sim.store.misslog.MissLog.add>`
queues the miss and returns; a writer thread (:mod:`replay_sim.store.misslog`) resolves the steps'
params and commits rows in batches — once the store's write lock is free, when another process
holds it. The histories are kept once each (:mod:`replay_sim.store.miss_history`). A writable
store keeps the log in its ``misses`` table (written on the store's own connection as non-content,
so the resolver's caches are not invalidated by it). A read-only store — a snapshot's — cannot:
its misses go to a side file next to the bundle (``<bundle>.misses.db``, a store holding only
misses), or, when that cannot be written either, are not kept, said once on the ``replay_sim``
logger. A store or snapshot made before the log existed simply has none (:func:`read_misses`
returns nothing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay_sim.canonical import canonical_json
from replay_sim.redaction import REDACTED
from replay_sim.store.miss_history import read_prefix
from replay_sim.store.snapshot import STORE_FILE
from replay_sim.store.store import Store

__all__ = ["MAX_MISS_ROWS", "MissEntry", "call_params", "has_log", "miss_row", "read_misses", "side_file"]

MAX_MISS_ROWS = 100_000
"""Distinct (call, state) rows a log keeps; past it the least recently missed are evicted (said once)."""


@dataclass(frozen=True, slots=True)
class MissEntry:
    """One kept miss: a call, the state it was missed in, and how often.

    Attributes:
        id: Its row id.
        server: The recorded server name.
        method: The MCP method.
        name: The tool, prompt or resource.
        key: The call's exact key.
        params: The call's params (redacted as the recordings are).
        prefix: The state-changing calls its episode made before it, oldest first, each
            ``{"key", "method", "params"}`` (``params`` absent when it could not be found); None when
            the call had no history at all (no episode, no session), so its state is unknown.
        status: How the replay answered it (``miss``, ``nearest``, ``synthetic`` …).
        reason: Why no recording answered it.
        candidates: The nearest recordings, as the replay reported them.
        count: How many times it was missed from this state.
        first_at: When first missed (UTC, ISO 8601).
        last_at: When last missed.
    """

    id: int
    server: str
    method: str
    name: str
    key: str
    params: dict[str, Any]
    prefix: list[dict[str, Any]] | None
    status: str
    reason: str
    candidates: list[dict[str, Any]]
    count: int
    first_at: str
    last_at: str

    @property
    def initial(self) -> bool:
        """Missed at the server's initial state (no state-changing call before it)."""
        return self.prefix == []

    def obstacle(self, replacement: str = REDACTED) -> str | None:
        """Why no backfill can ask this miss again whatever the upstream (None: it can be asked).

        Args:
            replacement: What the store's redaction put in place of secrets: a call holding it
                would ask the real server for the placeholder, not the secret.
        """
        if self.prefix is None:
            return "no episode or session: the state it was missed in is unknown"
        if any("params" not in step for step in self.prefix):
            return "a state-changing call before it was not kept"
        if replacement in canonical_json([self.params, self.prefix]):
            return "holds a redacted value"
        return None

    def as_dict(self) -> dict[str, Any]:
        """JSON form (the admin API, the CLI)."""
        return {
            "id": self.id,
            "key": self.key,
            "server": self.server,
            "method": self.method,
            "name": self.name,
            "params": self.params,
            "prefix": self.prefix,
            "status": self.status,
            "reason": self.reason,
            "candidates": self.candidates,
            "count": self.count,
            "first_at": self.first_at,
            "last_at": self.last_at,
        }


def call_params(method: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A call's params from its ``(name, arguments)`` (:func:`~replay_sim.canonical.call_identity` undone)."""
    if method in ("tools/call", "prompts/get"):
        return {"name": name, "arguments": arguments}
    if method == "resources/read":
        return {"uri": name}
    return dict(arguments)


def side_file(store_path: str | Path) -> Path:
    """Where the misses of a read-only store go: next to a snapshot bundle, or to the file."""
    path = Path(store_path)
    if path.name == STORE_FILE:
        return path.parent.with_name(f"{path.parent.name}.misses.db")
    return path.with_name(f"{path.name}.misses.db")


def miss_row(store: Store, key: str) -> tuple[str, str] | None:
    """The method and params (JSON) of a call kept as a miss in ``store``, or None."""
    if not has_log(store):
        return None
    rows = store._query("SELECT method, params FROM misses WHERE key=? LIMIT 1", (key,))
    return (rows[0][0], rows[0][1]) if rows else None


def has_log(store: Store) -> bool:
    """Whether ``store`` has a miss log (a store made before it has none)."""
    return bool(store._query("SELECT 1 FROM sqlite_master WHERE type='table' AND name='misses'"))


def read_misses(store: Store, server: str | None = None, limit: int | None = None) -> list[MissEntry]:
    """The misses kept in ``store`` (most missed first); none when it has no log (an older store)."""
    if not has_log(store):
        return []
    where, params = ("WHERE server=?", (server,)) if server is not None else ("", ())
    tail = f" LIMIT {int(limit)}" if limit is not None else ""
    rows = store._query(
        "SELECT id, server, method, name, key, params, prefix, status, reason, candidates, count, "
        f"first_at, last_at FROM misses {where} ORDER BY count DESC, id{tail}",
        params,
    )
    histories: dict[int, list[dict[str, Any]]] = {}
    return [
        MissEntry(
            id=r[0],
            server=r[1],
            method=r[2],
            name=r[3],
            key=r[4],
            params=json.loads(r[5]),
            prefix=read_prefix(store, r[6], histories),
            status=r[7],
            reason=r[8],
            candidates=json.loads(r[9] or "[]"),
            count=r[10],
            first_at=r[11],
            last_at=r[12],
        )
        for r in rows
    ]
