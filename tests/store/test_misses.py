"""The miss log's bounds: what waits while another connection holds the store's write lock, and its size.

Another connection of this process holds the lock here (SQLite's locks are per connection); the
replay served over HTTP beside a second *process* is tests/replay/test_store_writers.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from store_helpers import write_locked

from replay_sim.canonical import call_key
from replay_sim.store import Store, misslog
from replay_sim.store.miss_history import log_size
from replay_sim.store.misses import read_misses
from replay_sim.store.misslog import MissLog


def _miss(log: MissLog, n: int, text: str = "x") -> None:
    log.add("srv", "tools/call", "look", {"n": n, "text": text}, prefix=[], status="miss", reason="none")


def test_misses_wait_for_another_writers_lock_and_are_all_written_when_it_frees(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    log = MissLog(store)
    with write_locked(store.path):
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
    monkeypatch.setattr(misslog, "MAX_WAITING_BYTES", 5_000)
    store = Store(tmp_path / "r.db")
    log = MissLog(store)
    with write_locked(store.path), caplog.at_level(logging.WARNING, logger="replay_sim"):
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
    with write_locked(store.path), caplog.at_level(logging.WARNING, logger="replay_sim"):
        for n in range(3):
            _miss(log, n)
        log.close(timeout=0.5)
    assert log.dropped == 3
    assert any("3 misses not kept at shutdown" in r.getMessage() for r in caplog.records)
    assert read_misses(store) == []
    store.close()


def _db_bytes(store: Store) -> int:
    """The store file's size with its write-ahead log folded in."""
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return store.path.stat().st_size


def test_300_misses_of_1_kb_in_one_diverged_episode_keep_a_log_linear_in_their_size(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    empty = _db_bytes(store)
    log = MissLog(store)
    history: list[str] = []
    for n in range(300):  # each a state-changing call no recording answers: the next one's history grows
        arguments = {"n": n, "text": "z" * 1_000}
        log.add("srv", "tools/call", "write", arguments, prefix=list(history), status="miss", reason="none")
        history.append(call_key("srv", "tools/call", "write", arguments))
    assert log.flush(60) and log.dropped == 0
    # Each step's params are kept once: about two copies of each 1 KB call, not 150 (55 MB once).
    assert _db_bytes(store) - empty < 300 * 4_096
    last = max(read_misses(store), key=lambda m: len(m.prefix or []))
    assert last.prefix is not None and len(last.prefix) == 299 and last.obstacle() is None
    assert [step["params"]["arguments"]["n"] for step in last.prefix] == list(range(299))
    assert last.prefix[-1]["key"] == history[-2] and last.params["arguments"]["n"] == 299
    log.close()
    store.close()


def test_past_its_byte_cap_the_log_evicts_the_least_recently_missed_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(tmp_path / "r.db")
    log = MissLog(store, max_bytes=50_000)
    with caplog.at_level(logging.WARNING, logger="replay_sim"):
        for n in range(300):
            _miss(log, n, "y" * 1_000)
            if n % 50 == 49:
                assert log.flush(30)  # in several transactions, as a replay's misses come
    assert log.flush(30)
    kept = sorted(m.params["arguments"]["n"] for m in read_misses(store))
    assert 0 < len(kept) < 50 and kept == list(range(300 - len(kept), 300))  # the newest, all of them
    assert log.evicted == 300 - len(kept) and log.dropped == 0
    assert log_size(store.conn)[1] <= 50_000
    assert sum("is full" in r.getMessage() for r in caplog.records) == 1
    log.close()
    store.close()
