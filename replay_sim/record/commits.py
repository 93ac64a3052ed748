"""Committing recorded calls: calls answered together share one transaction, none is answered first.

Every client call is committed to the store before its client gets the answer (a killed recorder
loses no acknowledged call). :class:`GroupCommit` keeps that promise at less cost when several
calls are answered at once: the first call to arrive commits, and while other calls are still in
flight it lets the calls answered in the same instant join it, so they share one transaction (one
WAL commit) — each caller still returns only once its own row is committed. A call recorded alone
is committed at once, with no wait. Calls answered in one read of a stdio server's output are
committed together by :meth:`GroupCommit.commit`, with any call waiting to join a transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import anyio.lowlevel

from replay_sim.errors import StoreError
from replay_sim.store import Store

__all__ = ["GroupCommit"]


class _Entry:
    __slots__ = ("call", "done", "error", "id")

    def __init__(self, call: Mapping[str, Any], done: anyio.Event | None = None) -> None:
        self.call = call
        self.done = done  # a caller waiting for the commit
        self.id = 0
        self.error: StoreError | None = None


class GroupCommit:
    """Commits recorded calls to ``store``, calls answered together in one transaction.

    Args:
        store: Where the calls go.
        busy: Whether other calls are in flight (that may be answered in the same instant).
    """

    def __init__(self, store: Store, busy: Callable[[], bool]) -> None:
        self.store = store
        self.busy = busy
        self.transactions = 0
        """Transactions committed so far (each holding one or more calls)."""
        self._queue: list[_Entry] = []
        self._leading = False

    async def record(self, call: Mapping[str, Any]) -> int:
        """Commit one call (keyword arguments of :meth:`Store.record_call`); its id, once committed.

        Raises:
            StoreError: The call could not be committed.
        """
        entry = _Entry(call, anyio.Event())
        self._queue.append(entry)
        if self._leading:
            assert entry.done is not None
            await entry.done.wait()
        else:
            self._leading = True
            try:
                if self.busy():
                    await anyio.lowlevel.checkpoint()  # calls answered in this instant join the commit
            finally:  # even when cancelled: the calls that joined are waiting for it
                batch, self._queue = self._queue, []
                self._leading = False
                if batch:  # none when commit() took them
                    self._commit(batch)
        if entry.error is not None:
            raise entry.error
        return entry.id

    def commit(self, calls: Sequence[Mapping[str, Any]]) -> list[int | StoreError]:
        """Commit calls now, in one transaction with any call waiting to join one; each one's id or error.

        A call that cannot be committed is its error here; the others are committed without it.
        """
        entries = [_Entry(call) for call in calls]
        batch, self._queue = [*self._queue, *entries], []
        self._commit(batch)
        return [entry.error or entry.id for entry in entries]

    def _commit(self, batch: list[_Entry]) -> None:
        """Commit a batch in one transaction; if that fails, each call alone (a bad row sinks no other)."""
        try:
            ids = self.store.record_calls([entry.call for entry in batch])
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc if isinstance(exc, StoreError) else StoreError(str(exc))
            else:
                for entry in batch:
                    self._commit([entry])
                return
        else:
            self.transactions += 1
            for entry, id_ in zip(batch, ids, strict=True):
                entry.id = id_
        for entry in batch:
            if entry.done is not None:
                entry.done.set()
