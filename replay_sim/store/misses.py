"""The miss log: every call a replay could not answer, with what it takes to reproduce it.

A miss is worth keeping only if it can become a recording: ``replay-sim backfill``
(:mod:`replay_sim.record.backfill`) asks the real server the missed call *from the state it was
missed in*. So each miss keeps its server, method and params, and the state-changing calls its
episode made before it (their method and params, not just their keys: the recordings they were
answered from may not be in the store that backfills, and a call no recording answered has no
recording at all). One row per call and state, counted: rollouts repeat their misses.

The replay never waits for the log: :meth:`MissLog.add` queues the miss and returns; a writer
thread resolves the steps' params and commits rows in batches — once the store's write lock is
free, when another process holds it. A writable store keeps the log in
its ``misses`` table (written on the store's own connection as non-content, so the resolver's
caches are not invalidated by it). A read-only store — a snapshot's — cannot: its misses go to a
side file next to the bundle (``<bundle>.misses.db``, a store holding only misses), or, when that
cannot be written either, are not kept, said once on the ``replay_sim`` logger. A store or snapshot
made before the log existed simply has none (:func:`read_misses` returns nothing).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import sqlite3
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any

from replay_sim.canonical import call_key, canonical_json
from replay_sim.errors import StoreError, StoreLockedError
from replay_sim.redaction import REDACTED
from replay_sim.store.miss_history import DEFAULT_MAX_MISS_BYTES, MissHistories, log_size, read_prefix
from replay_sim.store.records import utc_now
from replay_sim.store.snapshot import STORE_FILE
from replay_sim.store.store import Store

__all__ = [
    "MAX_MISS_ROWS",
    "MAX_QUEUED",
    "MAX_WAITING_BYTES",
    "MissEntry",
    "MissLog",
    "call_params",
    "read_misses",
    "side_file",
]

log = logging.getLogger("replay_sim")

MAX_MISS_ROWS = 100_000
"""Distinct (call, state) rows a log keeps; past it the least recently missed are evicted (said once)."""
_MAX_PARAMS = 256 * 1024  # characters of one miss's params: a larger one cannot be kept whole
_BATCH = 256  # misses serialised between two tries to commit
MAX_QUEUED = 10_000
"""Misses queued and not yet serialised at most; a miss past it is not kept (said once)."""
MAX_WAITING_BYTES = 64 * 1024 * 1024
"""Bytes of params of the rows waiting to be committed at most (while another process holds the lock)."""
_FIRST_PAUSE, _LAST_PAUSE = 0.005, 0.5  # seconds between tries while another process holds the lock
_MEMO = 4096  # recently resolved step keys


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


def _state(prefix: Sequence[str] | None) -> str:
    if prefix is None:
        return "?"
    return hashlib.sha256("\n".join(prefix).encode()).hexdigest()


class MissLog:
    """Keeps a replay's misses in a store (or beside a read-only one) without holding up the replay.

    A writer thread takes the queued misses, serialises them into rows (merging repeats of one
    call from one state) and commits them. While another process holds the store's write lock
    (``replay-sim import`` or ``record`` on the file a replay serves) the rows wait in memory and
    are committed once the lock is free: nothing is lost while the process runs. What waits is
    bounded — :data:`MAX_QUEUED` misses not yet serialised, :data:`MAX_WAITING_BYTES` of rows —
    and a miss past either bound is not kept (counted in :attr:`dropped`, said once on the
    ``replay_sim`` logger). :meth:`close` (and the process's exit) writes what waits for at most
    its ``timeout``; what the lock still holds back then is said, with how many misses it was.

    Args:
        store: The replay's store: read for the steps' params; written to unless read-only.
        path: Where to keep the misses instead (a store file, created when missing); by default
            ``store`` itself, or :func:`side_file` for a read-only store.
        max_bytes: Bytes the log keeps at most (see :mod:`~replay_sim.store.miss_history`): past
            it, or past :data:`MAX_MISS_ROWS` calls, the least recently missed are evicted.
    """

    def __init__(
        self, store: Store, path: str | Path | None = None, *, max_bytes: int = DEFAULT_MAX_MISS_BYTES
    ) -> None:
        self.store = store
        self.max_bytes = max_bytes
        if path is None and store.readonly:
            path = side_file(store.path)
        self.path = Path(path) if path is not None else store.path
        self._target: Store | None = None if path is not None else store
        self._queue: SimpleQueue[tuple[Any, ...] | None] = SimpleQueue()
        self._queued = 0  # misses in the queue, not yet serialised
        self._pending = 0  # misses queued or waiting, not yet committed (or given up)
        self._idle = threading.Condition()
        self._thread: threading.Thread | None = None
        self._waiting: dict[tuple[str, str], dict[str, Any]] = {}  # rows waiting for the lock
        self._waiting_bytes = 0
        self._waiting_misses = 0
        self._giving_up = False  # closing, and the wait is over: what cannot be written is dropped
        self._memo: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._said: set[str] = set()
        self._rows: int | None = None
        self._bytes: int | None = None
        self._histories = MissHistories(self._step)
        self.evicted = 0
        """Kept misses evicted (least recently missed first) to keep the log within its bounds."""
        self.dropped = 0
        """Misses not kept (the log could not be written, was full, or its queue overflowed)."""

    def add(
        self,
        server: str,
        method: str,
        name: str,
        arguments: dict[str, Any],
        *,
        prefix: Sequence[str] | None,
        status: str,
        reason: str,
        candidates: Sequence[dict[str, Any]] = (),
    ) -> None:
        """Queue one miss (returns at once; a writer thread commits it).

        Args:
            server: The recorded server name.
            method: The MCP method.
            name: The tool, prompt or resource.
            arguments: The call's arguments (redacted as the recordings are).
            prefix: The keys of the state-changing calls its episode made before it, oldest first
                (recorded calls, or calls that were themselves missed); None when it had no history.
            status: How the replay answered it.
            reason: Why no recording answered it.
            candidates: The nearest recordings (JSON), as reported to the client.
        """
        item = (server, method, name, arguments, None if prefix is None else tuple(prefix), status,
                reason, list(candidates)[:3], utc_now())  # fmt: skip
        with self._idle:
            if self._queued >= MAX_QUEUED:
                self.dropped += 1
                self._say(
                    f"replay-sim: misses not kept: {MAX_QUEUED} wait to be written to {self.path} "
                    "already (is another process holding its write lock?); later ones are counted "
                    "in the miss log's dropped count until they drain"
                )
                return
            self._queued += 1
            self._pending += 1
            if self._thread is None:
                self._giving_up = False
                self._thread = threading.Thread(target=self._run, name="replay-sim-miss-log", daemon=True)
                self._thread.start()
                _flush_at_exit(self)
        self._queue.put(item)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued miss is written (or given up); False if ``timeout`` ran out first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (waiting up to ``timeout``), stop the writer thread and close a side file.

        Misses still held back by another process's write lock when ``timeout`` runs out are not
        kept: said on the ``replay_sim`` logger with how many they were.
        """
        if not self.flush(timeout):
            with self._idle:
                self._giving_up = True
                self._idle.notify_all()
            self.flush(timeout)
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None
        if self._target is not None and self._target is not self.store:
            self._target.close()
            self._target = None

    # -- the writer thread ------------------------------------------------------------------------

    def _run(self) -> None:
        pause = _FIRST_PAUSE
        while True:
            stop = self._take(block=not self._waiting, timeout=pause)
            if self._waiting:
                written = self._commit_waiting()
                pause = _FIRST_PAUSE if written else min(pause * 2, _LAST_PAUSE)
            if stop:
                return

    def _take(self, block: bool, timeout: float) -> bool:
        """Serialise queued misses into waiting rows (waiting up to ``timeout`` for one); True to stop."""
        try:
            item = self._queue.get(timeout=None if block else timeout)
        except Empty:
            return False
        taken = 0
        try:
            while item is not None:
                taken += 1
                self._wait_row(item)
                if taken >= _BATCH:
                    return False
                try:
                    item = self._queue.get_nowait()
                except Empty:
                    return False
            return True
        finally:
            with self._idle:
                self._queued -= taken

    def _wait_row(self, item: tuple[Any, ...]) -> None:
        """One queued miss as a waiting row (merged with a repeat of it), or dropped if it cannot be kept."""
        server, method, name, arguments, prefix, status, reason, candidates, at = item
        try:
            params = call_params(method, name, arguments)
            text = canonical_json(params)
            if len(text) > _MAX_PARAMS:
                self._say(f"replay-sim: a miss of {server} {name} is not kept: its params are too long")
                self._done(1, dropped=True)
                return
            key = call_key(server, method, name, arguments)
            self._remember(key, method, params)
            state = _state(prefix)
            seen = self._waiting.get((key, state))
            if seen is not None:
                seen.update(count=seen["count"] + 1, last_at=at, status=status, reason=reason,
                            candidates=json.dumps(candidates, ensure_ascii=False))  # fmt: skip
                self._waiting_misses += 1
                return
            if self._waiting_bytes + len(text) > MAX_WAITING_BYTES:
                self._say(
                    f"replay-sim: misses not kept: {self._waiting_bytes} bytes of them wait to be "
                    f"written to {self.path} already (is another process holding its write lock?)"
                )
                self._done(1, dropped=True)
                return
            self._waiting[(key, state)] = {
                "server": server, "method": method, "name": name, "key": key, "params": text,
                "prefix": prefix, "state": state, "status": status, "reason": reason,
                "candidates": json.dumps(candidates, ensure_ascii=False),
                "count": 1, "first_at": at, "last_at": at,
            }  # fmt: skip
            self._waiting_bytes += len(text)
            self._waiting_misses += 1
        except Exception as exc:  # a broken miss must never stop the log
            self._say(f"replay-sim: a miss of {server} {name} is not kept: {exc}")
            self._done(1, dropped=True)

    def _commit_waiting(self) -> bool:
        """Commit the waiting rows; False when another process holds the write lock (they wait on)."""
        rows, misses = self._waiting, self._waiting_misses
        try:
            self._write(rows)
        except StoreLockedError as exc:
            with self._idle:
                giving_up = self._giving_up
            if not giving_up:
                return False
            self._say(f"replay-sim: {misses} misses not kept at shutdown: {exc}")
            self._drop_waiting(misses)
            return True
        except Exception as exc:  # a broken log must never stop the replay
            self._say(f"replay-sim: misses not kept in {self.path}: {exc}")
            self._drop_waiting(misses)
            return True
        self._waiting, self._waiting_bytes, self._waiting_misses = {}, 0, 0
        self._done(misses)
        return True

    def _drop_waiting(self, misses: int) -> None:
        self._waiting, self._waiting_bytes, self._waiting_misses = {}, 0, 0
        self._done(misses, dropped=True)

    def _done(self, misses: int, dropped: bool = False) -> None:
        with self._idle:
            if dropped:
                self.dropped += misses
            self._pending -= misses
            self._idle.notify_all()

    def _say(self, line: str) -> None:
        if line not in self._said:
            self._said.add(line)
            log.warning(line)

    def _open(self) -> Store:
        if self._target is None:
            try:
                self._target = Store(self.path)
            except StoreError as exc:
                raise StoreError(f"cannot keep misses beside read-only {self.store.path}: {exc}") from exc
        return self._target

    def _write(self, waiting: dict[tuple[str, str], dict[str, Any]]) -> None:
        """Commit rows in one transaction, not waiting for another process's lock (StoreLockedError)."""
        target = self._open()
        try:
            with target.transaction("keep misses", content=False, wait=False) as conn:
                self._insert(conn, waiting)
        except BaseException:
            self._histories.committed(False)
            self._rows = self._bytes = None  # counted again from the store: the rows were rolled back
            raise
        self._histories.committed(True)

    def _insert(self, conn: sqlite3.Connection, waiting: dict[tuple[str, str], dict[str, Any]]) -> None:
        if self._rows is None or self._bytes is None:
            self._rows, self._bytes = log_size(conn)
        for (key, state), waiting_row in waiting.items():
            prefix = waiting_row["prefix"]
            steps = None if prefix is None else "[]"
            if prefix:
                steps = json.dumps({"history": self._histories.node(conn, prefix), "steps": len(prefix)})
            row = {**waiting_row, "prefix": steps}
            known = conn.execute("SELECT 1 FROM misses WHERE key=? AND state=?", (key, state)).fetchone()
            conn.execute(
                f"INSERT INTO misses ({', '.join(row)}) VALUES ({', '.join(':' + c for c in row)}) "
                "ON CONFLICT (key, state) DO UPDATE SET count = count + excluded.count, "
                "last_at = excluded.last_at, status = excluded.status, reason = excluded.reason, "
                "candidates = excluded.candidates",
                row,
            )
            if known is None:
                self._rows += 1
                self._bytes += sum(len(row[c] or "") for c in ("params", "prefix", "candidates", "reason"))
        self._bytes += self._histories.added_bytes
        if self._rows > MAX_MISS_ROWS or self._bytes > self.max_bytes:
            evicted, self._rows, self._bytes = self._histories.evict(conn, MAX_MISS_ROWS, self.max_bytes)
            self._say(
                f"replay-sim: the miss log {self.path} is full ({MAX_MISS_ROWS} calls or {self.max_bytes} "
                "bytes): the least recently missed calls are evicted to make room"
            )
            self.evicted += evicted

    def _remember(self, key: str, method: str, params: dict[str, Any]) -> None:
        self._memo[key] = {"key": key, "method": method, "params": params}
        self._memo.move_to_end(key)
        if len(self._memo) > _MEMO:
            self._memo.popitem(last=False)

    def _step(self, key: str) -> dict[str, Any]:
        """One state-changing call of a prefix, with its params: a recording's, or a logged miss's."""
        found = self._memo.get(key)
        if found is not None:
            return found
        recorded = self.store.recordings(key=key, limit=1)
        if recorded:
            self._remember(key, recorded[0].method, recorded[0].params)
            return self._memo[key]
        for store in {id(s): s for s in (self.store, self._target) if s is not None}.values():
            row = _miss_row(store, key)
            if row is not None:
                self._remember(key, row[0], json.loads(row[1]))
                return self._memo[key]
        return {"key": key}


_LIVE: weakref.WeakSet[MissLog] = weakref.WeakSet()


def _flush_live() -> None:
    for miss_log in list(_LIVE):
        miss_log.flush(5.0)


def _flush_at_exit(miss_log: MissLog) -> None:
    """Write what is queued before the process ends (the writer thread is a daemon: it would be cut)."""
    if not _LIVE:
        atexit.unregister(_flush_live)  # once, however many logs come and go
        atexit.register(_flush_live)
    _LIVE.add(miss_log)


def _miss_row(store: Store, key: str) -> tuple[str, str] | None:
    if not _has_log(store):
        return None
    rows = store._query("SELECT method, params FROM misses WHERE key=? LIMIT 1", (key,))
    return (rows[0][0], rows[0][1]) if rows else None


def _has_log(store: Store) -> bool:
    return bool(store._query("SELECT 1 FROM sqlite_master WHERE type='table' AND name='misses'"))


def read_misses(store: Store, server: str | None = None, limit: int | None = None) -> list[MissEntry]:
    """The misses kept in ``store`` (most missed first); none when it has no log (an older store)."""
    if not _has_log(store):
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
