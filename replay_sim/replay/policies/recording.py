"""Sandbox answers recorded off the answer path: batched, bounded, flushed at the end.

A sandbox answer is served as soon as its instance answers; recording it (and the resolver seeing
it) must not add to that. :class:`AnswerLog` takes each answer's row (and the start of each
instance's recording session) in memory and writes them in batches from a worker thread: every
:data:`FLUSH_EVERY` seconds, or at once when :data:`BATCH` rows wait. At most :data:`BOUND` rows wait:
past that an answer waits for the write under way (a store slower than the instances slows the
answers, never memory). :meth:`AnswerLog.flush` writes everything queued so far; leaving it (the
sandbox policy's end: server shutdown, SIGTERM, SIGHUP) flushes, so only a crash (SIGKILL, power
loss) loses answers: at most the last :data:`FLUSH_EVERY` seconds' worth and the write under way.

The answer served carries the recording as it will be written (:func:`pending_recording`: its
key, params, answer; id 0 until written). The next identical call of another episode is answered
from the cache once its batch is written (the resolver sees every commit to the store).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import anyio
import anyio.abc
import anyio.to_thread

from replay_sim.canonical import call_identity
from replay_sim.store import Recording, Store
from replay_sim.store.records import utc_now
from replay_sim.store.snapshot import STORE_FILE
from replay_sim.store.sources import mark_session

__all__ = [
    "BATCH", "BOUND", "FLUSH_EVERY", "AnswerLog", "Source", "fingerprints", "pending_recording",
    "sandbox_side_file",
]  # fmt: skip

Source = tuple[str, dict[str, Any]]
"""What made a recorded session's answers: the sandbox fingerprint, and what it was taken over."""

FLUSH_EVERY = 0.05
"""Seconds an answer waits at most before its batch is written (what a crash may lose)."""
BATCH = 256
"""Rows that make a batch be written at once."""
BOUND = 8192
"""Rows waiting at most; past it an answer waits for the write under way."""


def fingerprints(pool: Any) -> Callable[[str], Source | None]:
    """``source(server)``: the fingerprint each session a server's instances record is marked with
    (``pool.fingerprint``, when the pool has one; read once per server: it reads the server's files)."""
    found: dict[str, Source | None] = {}

    def source(server: str) -> Source | None:
        if server not in found:
            fingerprint = getattr(pool, "fingerprint", None)
            found[server] = None if fingerprint is None else fingerprint(server)
        return found[server]

    return source


def pending_recording(store: Store, row: dict[str, Any]) -> Recording:
    """The recording a row (:meth:`Store.record_call`'s keyword arguments) will be once written (id 0)."""
    prepared = store.prepare_call(row["server"], row["method"], row["params"])
    name, arguments = call_identity(row["method"], row["params"])
    return Recording(
        0, row["server"], row["method"], name, arguments,
        {k: v for k, v in row["params"].items() if k != "_meta"}, prepared.key, row.get("result"),
        row.get("error"), row.get("session"), None, row.get("latency_ms"), row["recorded_at"],
        str(row["origin"]), list(row.get("notifications") or []),
    )  # fmt: skip


class AnswerLog:
    """Sandbox answers waiting to be recorded, written in batches by one task (enter it around serving).

    Args:
        store: Where they are recorded (called once per batch: a read-only store's side store is
            opened on first use).
        written: Called in the writing thread after each batch (the resolver reads it there).
        flush_every: :data:`FLUSH_EVERY`.
        batch: :data:`BATCH`.
        bound: :data:`BOUND`.
    """

    def __init__(
        self,
        store: Callable[[], Store],
        *,
        written: Callable[[], None] | None = None,
        flush_every: float = FLUSH_EVERY,
        batch: int = BATCH,
        bound: int = BOUND,
    ) -> None:
        self._store = store
        self._after = written
        self.flush_every = flush_every
        self.batch = batch
        self.bound = bound
        self._sessions: list[tuple[str, str, str, Source | None]] = []  # server, id, started at, source
        self._rows: list[dict[str, Any]] = []
        self._wanted = anyio.Event()  # a batch is due now
        self._written = anyio.Event()  # a batch was written
        self._writing = anyio.Lock()
        self._tg: anyio.abc.TaskGroup | None = None
        self._in_flight = 0  # rows of the batch being written
        self.written = 0
        """Rows written so far."""
        self.batches = 0
        """Batches written so far."""
        self.failure: str | None = None
        """Why the last batch could not be written (it is tried again with the next), or None."""

    async def __aenter__(self) -> Self:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._run, name="sandbox answer log")
        return self

    async def __aexit__(self, *exc: object) -> None:
        tg, self._tg = self._tg, None
        with anyio.CancelScope(shield=True):
            await self.flush()
        if tg is not None:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)

    @property
    def waiting(self) -> int:
        """Rows not written yet (queued, or in the batch being written)."""
        return len(self._rows) + self._in_flight

    def start_session(self, server: str, session: str, source: Source | None = None) -> None:
        """Queue the start of a recording session (written before any row of the batch), marked with
        the fingerprint of the sandbox config and code its answers come from (``source``)."""
        self._sessions.append((server, session, utc_now(), source))

    async def add(self, rows: list[dict[str, Any]]) -> None:
        """Queue rows (:meth:`Store.record_call`'s keyword arguments, ``recorded_at`` set), in order.

        Waits only while :attr:`bound` rows are waiting already.
        """
        while len(self._rows) >= self.bound and self._tg is not None:
            self._wanted.set()
            written = self._written
            await written.wait()
        self._rows.extend(rows)
        if len(self._rows) >= self.batch:
            self._wanted.set()

    async def flush(self) -> None:
        """Write everything queued so far (and wait for a write under way)."""
        await self._write()

    async def _run(self) -> None:
        while True:
            with anyio.move_on_after(self.flush_every):
                await self._wanted.wait()
            await self._write()

    async def _write(self) -> None:
        async with self._writing:
            self._wanted = anyio.Event()
            sessions, self._sessions = self._sessions, []
            rows, self._rows = self._rows, []
            if not sessions and not rows:
                return

            def write() -> None:
                store = self._store()
                for server, session, started, source in sessions:
                    store.start_session(server, session, started)
                    if source is not None:
                        mark_session(store, session, *source)
                if rows:
                    store.record_calls(rows)

            self._in_flight = len(rows)
            try:
                with anyio.CancelScope(shield=True):  # a batch is written whole, or not begun
                    await anyio.to_thread.run_sync(write)
            except Exception as exc:  # the store is busy or broken: keep the rows for the next batch
                self.failure = f"{type(exc).__name__}: {exc}"
                self._sessions[:0], self._rows[:0] = sessions, rows
                self._in_flight = 0
                written, self._written = self._written, anyio.Event()
                written.set()
                return
            if self._after is not None:  # the rows are written: a failure here must not write them again
                with contextlib.suppress(Exception):
                    await anyio.to_thread.run_sync(self._after)
            self.failure = None
            self._in_flight = 0
            self.written += len(rows)
            self.batches += 1
            written, self._written = self._written, anyio.Event()
            written.set()


def sandbox_side_file(store_path: str | Path) -> Path:
    """Where a read-only store's sandbox answers are recorded: next to a snapshot bundle, or the file."""
    path = Path(store_path)
    if path.name == STORE_FILE:
        return path.parent.with_name(f"{path.parent.name}.sandbox.db")
    return path.with_name(f"{path.name}.sandbox.db")
