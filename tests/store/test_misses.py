"""The miss log's bounds: what waits while another connection holds the store's write lock, and its size.

Another connection of this process holds the lock here (SQLite's locks are per connection); the
replay served over HTTP beside a second *process* is tests/replay/test_store_writers.py.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from replay_sim.store import Store
from replay_sim.store import misses as misses_module
from replay_sim.store.misses import MissLog, read_misses


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Another connection holds the store's write lock while the block runs."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()


def _miss(log: MissLog, n: int, text: str = "x") -> None:
    log.add("srv", "tools/call", "look", {"n": n, "text": text}, prefix=[], status="miss", reason="none")


def test_misses_wait_for_another_writers_lock_and_are_all_written_when_it_frees(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    log = MissLog(store)
    with _locked(store.path):
        for n in range(50):
            _miss(log, n)
        _miss(log, 7)  # a repeat: one row, counted twice
        assert not log.flush(0.2)  # still waiting for the lock
        assert read_misses(store) == []
    assert log.flush(20)
    kept = read_misses(store)
    assert len(kept) == 50 and log.dropped == 0
    assert [m.count for m in kept if m.params["arguments"]["n"] == 7] == [2]
    log.close()
    store.close()


def test_past_its_byte_bound_what_waits_is_not_kept_and_that_is_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(misses_module, "MAX_WAITING_BYTES", 5_000)
    store = Store(tmp_path / "r.db")
    log = MissLog(store)
    with _locked(store.path), caplog.at_level(logging.WARNING, logger="replay_sim"):
        for n in range(20):
            _miss(log, n, "y" * 1_000)  # ~1 KB of params each: four or five fit
        while log.dropped < 15:  # the writer serialises them as they come, locked or not
            assert not log.flush(0.05)
    assert log.flush(20)
    assert len(read_misses(store)) + log.dropped == 20
    said = [r.getMessage() for r in caplog.records if "wait to be written" in r.getMessage()]
    assert len(said) == 1 and str(store.path) in said[0]
    log.close()
    store.close()


def test_closing_while_another_writer_keeps_the_lock_gives_up_after_its_bound_and_says_how_many(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(tmp_path / "r.db")
    log = MissLog(store)
    with _locked(store.path), caplog.at_level(logging.WARNING, logger="replay_sim"):
        for n in range(3):
            _miss(log, n)
        log.close(timeout=0.5)
    assert log.dropped == 3
    assert any("3 misses not kept at shutdown" in r.getMessage() for r in caplog.records)
    assert read_misses(store) == []
    store.close()
