"""Writing the miss log: :class:`MissLog` queues a replay's misses and a thread commits them.

What a kept miss holds, and reading the log, is :mod:`replay_sim.store.misses`; the histories
misses refer to, and the log's size bound, :mod:`replay_sim.store.miss_history`.
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
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any

from replay_sim.canonical import call_key, canonical_json
from replay_sim.errors import StoreError, StoreLockedError
from replay_sim.store.miss_history import DEFAULT_MAX_MISS_BYTES, MissHistories, log_size
from replay_sim.store.misses import MAX_MISS_ROWS, call_params, miss_row, side_file
from replay_sim.store.records import utc_now
from replay_sim.store.store import Store

__all__ = ["MAX_QUEUED", "MAX_WAITING_BYTES", "MissLog"]

log = logging.getLogger("replay_sim")

_MAX_PARAMS = 256 * 1024  # characters of one miss's params: a larger one cannot be kept whole
_BATCH = 256  # misses serialised between two tries to commit
MAX_QUEUED = 10_000
"""Misses queued and not yet serialised at most; a miss past it is not kept (said once)."""
MAX_WAITING_BYTES = 64 * 1024 * 1024
"""Bytes of params of the rows waiting to be committed at most (while another process holds the lock)."""
_FIRST_PAUSE, _LAST_PAUSE = 0.005, 0.5  # seconds between tries while another process holds the lock
_MEMO = 4096  # recently resolved step keys


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
            row = miss_row(store, key)
            if row is not None:
                self._remember(key, row[0], json.loads(row[1]))
                return self._memo[key]
        return {"key": key}


_LIVE: weakref.WeakSet[MissLog] = weakref.WeakSet()


def _flush_live() -> None:
    for miss_log in list(_LIVE):
        miss_log.close(5.0)


def _flush_at_exit(miss_log: MissLog) -> None:
    """Write what is queued before the process ends, for 5 s at most, and say what could not be.

    The writer thread is a daemon: it would be cut.
    """
    if not _LIVE:
        atexit.unregister(_flush_live)  # once, however many logs come and go
        atexit.register(_flush_live)
    _LIVE.add(miss_log)
