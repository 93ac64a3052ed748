"""A store that passed its integrity check and was not written since is not checked again on open."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from replay_sim.errors import StoreError
from replay_sim.store import Store
from replay_sim.store import opening as store_opening
from replay_sim.store.verified import VERIFY_ENV


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Path]:
    """The stores whose integrity check ran, in order (each a fresh cache folder of stamps)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ran: list[Path] = []
    check = store_opening.integrity

    def counted(conn: sqlite3.Connection) -> str:
        ran.append(Path(conn.execute("PRAGMA database_list").fetchone()[2]))
        return check(conn)

    monkeypatch.setattr(store_opening, "integrity", counted)
    return ran


def _store(path: Path, calls: int = 300) -> Path:
    with Store(path) as store:
        for n in range(calls):
            store.record_call("echo", "tools/call", {"name": "echo", "arguments": {"text": f"{n} " * 200}})
    return path


def test_a_store_that_passed_and_was_not_written_since_opens_without_the_check(
    checks: list[Path], tmp_path: Path
) -> None:
    db = _store(tmp_path / "r.db")
    for opening in (
        lambda: Store(db, create=False),
        lambda: Store(db, create=False),
        lambda: Store(db, readonly=True),
        lambda: Store(db),
    ):
        with opening() as store:
            assert len(store.recordings()) == 300
    assert checks == [db]


def test_a_store_written_since_it_passed_is_checked_again(checks: list[Path], tmp_path: Path) -> None:
    db = _store(tmp_path / "r.db")
    Store(db, create=False).close()
    with Store(db, create=False) as store:
        store.record_call("echo", "tools/call", {"name": "echo", "arguments": {"text": "one more"}})
    Store(db, create=False).close()
    Store(db, create=False).close()
    assert checks == [db, db]


def test_a_store_damaged_after_it_passed_is_refused(checks: list[Path], tmp_path: Path) -> None:
    db = _store(tmp_path / "r.db")
    Store(db, create=False).close()  # passes, stamped
    data = bytearray(db.read_bytes())
    middle = (len(data) // 4096 // 2) * 4096
    data[middle + 8 : middle + 200] = b"\xa5" * 192  # a stray write over a page of the calls
    db.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"fails its integrity check"):
        Store(db, create=False)
    assert checks == [db, db]


def test_a_store_copied_over_a_verified_one_is_checked(checks: list[Path], tmp_path: Path) -> None:
    db, other = _store(tmp_path / "r.db"), _store(tmp_path / "other.db", calls=5)
    Store(db, create=False).close()
    other.replace(db)  # same path, another file
    with Store(db, create=False) as store:
        assert len(store.recordings()) == 5
    assert checks == [db, db]


def test_verify_always_checks_on_every_open(
    checks: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = _store(tmp_path / "r.db", calls=3)
    monkeypatch.setenv(VERIFY_ENV, "always")
    for _ in range(3):
        Store(db, create=False).close()
    assert checks == [db, db, db]


def test_an_unwritable_cache_folder_only_means_checking_every_time(
    checks: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = _store(tmp_path / "r.db", calls=3)
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    for _ in range(2):
        with Store(db, create=False) as store:
            assert len(store.recordings()) == 3
    assert checks == [db, db]
