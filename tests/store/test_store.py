"""The SQLite store: durability, concurrency and clear errors, on real files."""

from __future__ import annotations

import multiprocessing
import re
import sqlite3
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from store_helpers import echo_call, write_from_process

from replay_sim.errors import StoreError, StoreLockedError
from replay_sim.store import Origin, ServerRecord, Store, utc_now


def test_a_recorded_call_reads_back_exactly_as_written(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        session = store.start_session("echo")
        result = {"content": [{"type": "text", "text": "é"}], "structuredContent": {"z": 1, "a": 2.5}}
        rid = store.record_call(
            "echo",
            "tools/call",
            {"name": "echo", "arguments": {"b": 1.0, "a": "x"}, "_meta": {"progressToken": 7}},
            result=result,
            session=session,
            latency_ms=3.25,
            notifications=[{"method": "notifications/progress", "params": {"progress": 1}}],
        )
        rec = store.recording(rid)
    assert rec is not None
    assert rec.result == result and list(rec.result["structuredContent"]) == ["z", "a"]  # key order kept
    assert rec.params == {"name": "echo", "arguments": {"b": 1.0, "a": "x"}}  # _meta dropped
    assert rec.arguments == {"a": "x", "b": 1}
    assert (rec.session, rec.seq, rec.latency_ms, rec.origin) == (session, 1, 3.25, Origin.LIVE)
    assert rec.notifications[0]["method"] == "notifications/progress"


def test_sequence_numbers_count_up_per_session(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        a, b = store.start_session("echo"), store.start_session("echo")
        for n in range(3):
            echo_call(store, n, a)
        echo_call(store, 9, b)
        assert [r.seq for r in store.recordings(session=a)] == [1, 2, 3]
        assert [r.seq for r in store.recordings(session=b)] == [1]
        assert {s["id"]: s["calls"] for s in store.sessions()} == {a: 3, b: 1}


def test_servers_and_listings_round_trip(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        store.put_server(
            ServerRecord("echo", {"name": "echo", "version": "1"}, {"tools": {}}, "2025-11-25", "hi")
        )
        store.put_listing(
            "echo", "tools/list", {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}
        )
        assert store.server("echo") == ServerRecord(
            "echo", {"name": "echo", "version": "1"}, {"tools": {}}, "2025-11-25", "hi"
        )
        assert store.listings("echo")["tools/list"]["tools"][0]["name"] == "echo"
        with pytest.raises(StoreError, match="not a listing method"):
            store.put_listing("echo", "tools/call", {})


def test_threads_writing_at_once_lose_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    sessions = [store.start_session("echo") for _ in range(8)]

    def work(session: str) -> None:
        for n in range(50):
            echo_call(store, n, session)

    threads = [threading.Thread(target=work, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for session in sessions:
        assert [r.seq for r in store.recordings(session=session)] == list(range(1, 51))
    store.close()


def test_processes_writing_to_one_file_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "r.db")
    Store(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=write_from_process, args=(path, f"p{i}")) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    with Store(path) as store:
        assert len(store.recordings()) == 160
        assert store.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_full_disk_is_a_clear_error_and_leaves_no_partial_rows(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        echo_call(store, 0)
        pages = store.conn.execute("PRAGMA page_count").fetchone()[0]
        store.conn.execute(f"PRAGMA max_page_count={pages}")  # the file cannot grow: SQLITE_FULL
        big = {"content": [{"type": "text", "text": "x" * 200_000}]}
        with pytest.raises(StoreError, match=r"r\.db.*full"):
            store.record_call("echo", "tools/call", {"name": "echo", "arguments": {}}, result=big)
        assert len(store.recordings()) == 1


def test_a_locked_store_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    Store(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with (
            Store(path, timeout=0.05) as store,
            pytest.raises(StoreError, match="another process holds a write lock"),
        ):
            echo_call(store, 1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_read_only_store_refuses_writes_and_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    with Store(path) as store:
        echo_call(store, 1)
    with Store(path, readonly=True) as store:
        assert len(store.recordings()) == 1
        with pytest.raises(StoreError, match="read-only"):
            echo_call(store, 2)
    with pytest.raises(StoreError, match="no such recording store"):
        Store(tmp_path / "missing.db", readonly=True)


def test_a_store_from_another_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="schema version 99"):
        Store(path)


def test_a_store_opened_without_create_refuses_a_missing_file_or_a_folder(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"typo\.db: no such recording store; record or import first"):
        Store(tmp_path / "typo.db", create=False)
    assert not (tmp_path / "typo.db").exists()
    with pytest.raises(StoreError, match="is a folder"):
        Store(tmp_path, create=False)
    Store(tmp_path / "r.db").close()  # recording and import create the store
    with Store(tmp_path / "r.db", create=False) as store:
        echo_call(store, 1)  # an existing store opens for writing (e.g. the embedding cache)
        assert len(store.recordings()) == 1


def test_a_store_whose_folder_cannot_be_created_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(StoreError, match=r"taken/r\.db: cannot create its folder"):
        Store(tmp_path / "taken" / "r.db")


def _corrupt(path: Path) -> None:
    """Overwrite the middle of a page of the calls table, as a bad disk or a stray write would."""
    with Store(path) as store:
        for n in range(300):
            store.record_call("echo", "tools/call", {"name": "echo", "arguments": {"text": f"{n} " * 200}})
    data = bytearray(path.read_bytes())
    page = 4096
    middle = (len(data) // page // 2) * page
    data[middle + 8 : middle + 200] = b"\xa5" * 192
    path.write_bytes(bytes(data))


def test_a_store_failing_its_integrity_check_is_refused_naming_the_check(tmp_path: Path) -> None:
    db = tmp_path / "broken.db"
    _corrupt(db)
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone() != ("ok",)
    conn.close()
    for opening in (
        lambda: Store(db, create=False),
        lambda: Store(db, readonly=True),
        lambda: Store(db),  # a recorder appending to it would make it worse
    ):
        with pytest.raises(StoreError, match=r"fails its integrity check") as refused:
            opening()
        assert str(db) in str(refused.value)
        assert f"sqlite3 {db} 'PRAGMA integrity_check'" in str(refused.value)


def test_a_sqlite_file_that_is_not_a_store_is_refused_and_left_unchanged(tmp_path: Path) -> None:
    other = tmp_path / "app.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users VALUES (1, 'ada')")
    conn.commit()
    conn.close()
    before = other.read_bytes()
    for opening in (
        lambda: Store(other),
        lambda: Store(other, create=False),
        lambda: Store(other, readonly=True),
    ):
        with pytest.raises(StoreError, match="not a replay-sim store") as refused:
            opening()
        assert str(other) in str(refused.value) and "users" in str(refused.value)
    assert other.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]  # no -wal, no -shm


def test_serving_a_damaged_store_or_a_foreign_sqlite_file_is_a_one_line_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.db"
    _corrupt(broken)
    foreign = tmp_path / "foreign.db"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.close()
    replay_sim = [sys.executable, "-m", "replay_sim"]
    for db, said in ((broken, "fails its integrity check"), (foreign, "not a replay-sim store")):
        run = subprocess.run(
            [*replay_sim, "serve", "--stdio", "--server", "echo", "--db", str(db)],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=120,
        )
        assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
        assert str(db) in run.stderr and said in run.stderr


def test_a_write_that_must_not_wait_fails_at_once_while_another_process_writes(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    other = sqlite3.connect(tmp_path / "r.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreLockedError, match=r"r\.db: cannot record note: another process holds a"):
            store.set_meta("note", 1, wait=False)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert store.meta("note") is None  # a read waits again for others
    assert store.conn.execute("PRAGMA busy_timeout").fetchone() == (30000,)
    store.set_meta("note", 2, wait=False)
    assert store.meta("note") == 2


def test_a_recorder_commits_each_call_in_three_statements_and_reads_still_wait_for_others(
    tmp_path: Path,
) -> None:
    # A recorder commits every call before answering it: SQLite's busy wait, off for BEGIN
    # IMMEDIATE (the store waits for other writers itself), is not switched back on in between.
    store = Store(tmp_path / "r.db")
    session = store.start_session("echo")
    echo_call(store, 1, session)
    statements: list[str] = []
    # (the content version's trigger runs inside the INSERT, traced again as the INSERT: not a statement)
    store.conn.set_trace_callback(lambda s: None if statements[-1:] == [s] else statements.append(s))
    for n in (2, 3):
        echo_call(store, n, session)
    assert [s.split()[0] for s in statements] == ["BEGIN", "INSERT", "COMMIT"] * 2
    assert [r.seq for r in store.recordings(session=session)] == [1, 2, 3]
    assert statements[-2:][0] == "PRAGMA busy_timeout = 30000"  # before that read
    store.conn.set_trace_callback(None)


def test_the_recorded_names_are_the_keys_of_the_stats(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    assert store.names() == set()
    store.record_call("a", "tools/call", {"name": "echo", "arguments": {}})
    store.record_call("a", "tools/call", {"name": "echo", "arguments": {"x": 1}}, origin="backfill")
    store.record_call("b", "resources/read", {"uri": "file:///x"})
    assert store.names() == {(r["server"], r["method"], r["name"]) for r in store.stats()}
    assert store.names() == {("a", "tools/call", "echo"), ("b", "resources/read", "file:///x")}


def test_a_damaged_page_of_any_index_of_the_calls_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    _corrupt(db)
    conn = sqlite3.connect(db)
    roots = dict(conn.execute("SELECT name, rootpage FROM sqlite_master WHERE tbl_name='calls'").fetchall())
    conn.close()
    data = db.read_bytes()
    for name in ("calls", "calls_key", "calls_tool", "calls_session"):
        broken = bytearray(data)
        page = (roots[name] - 1) * 4096
        broken[page : page + 12] = b"\xa5" * 12  # its page header
        (tmp_path / f"{name}.db").write_bytes(bytes(broken))
        with pytest.raises(StoreError, match=r"fails its integrity check|not a SQLite file"):
            Store(tmp_path / f"{name}.db", create=False)


def test_a_servers_outcomes_are_the_columns_of_its_recordings(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    session = store.start_session("a")
    store.record_call(
        "a", "tools/call", {"name": "e", "arguments": {"é": [1, 2.5]}}, result={"x": 1}, session=session
    )
    store.record_call("a", "tools/call", {"name": "e", "arguments": {}}, error={"code": -1, "message": "no"})
    store.record_call("a", "resources/read", {"uri": "file:///x"}, result={"contents": []}, session=session)
    store.record_call("b", "tools/call", {"name": "e", "arguments": {}}, result={"isError": True})
    for server in ("a", "b", "c"):
        assert store.outcomes(server) == [
            (r.id, r.method, r.name, r.key, r.arguments, r.result, r.error, r.session, r.seq)
            for r in store.recordings(server)
        ]


def test_a_store_whose_key_index_points_at_another_calls_row_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with Store(db) as store:
        for n in range(3):
            store.record_call("echo", "tools/call", {"name": "echo", "arguments": {"n": n}}, result={"n": n})
    conn = sqlite3.connect(db)
    first, second = (key for (key,) in conn.execute("SELECT key FROM calls ORDER BY key LIMIT 2"))
    (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name='calls_key'").fetchone()
    conn.close()
    data = bytearray(db.read_bytes())
    page = (root - 1) * 4096
    at = page + data[page : page + 4096].index(first.encode())
    data[at : at + len(first)] = second.encode()  # its pages stay well formed, in order
    db.write_bytes(bytes(data))
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA quick_check").fetchone() == ("ok",)  # the structure is sound
    assert len(conn.execute("SELECT id FROM calls WHERE key=?", (second,)).fetchall()) == 2  # a wrong answer
    conn.close()
    for opening in (lambda: Store(db, create=False), lambda: Store(db, readonly=True)):
        with pytest.raises(
            StoreError, match=r"fails its integrity check \(row \d+ missing from index calls_key\)"
        ):
            opening()


def _view_only(path: Path) -> None:
    path_conn = sqlite3.connect(path)
    path_conn.execute("CREATE VIEW report AS SELECT 1 AS answer")
    path_conn.commit()
    path_conn.close()


def _someone_elses_meta(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    conn.commit()
    conn.close()


def _calls_of_another_shape(path: Path) -> None:
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE calls")
    conn.execute("CREATE TABLE calls (id INTEGER PRIMARY KEY, what TEXT)")
    conn.commit()
    conn.close()


@pytest.mark.parametrize(
    ("make", "holds"),
    [(_view_only, "report (view)"), (_someone_elses_meta, "meta"), (_calls_of_another_shape, "calls")],
)
def test_a_foreign_sqlite_file_is_refused_by_what_it_holds_and_left_unchanged(
    tmp_path: Path, make: Any, holds: str
) -> None:
    other = tmp_path / "app.db"
    make(other)
    before = other.read_bytes()
    for opening in (
        lambda: Store(other),
        lambda: Store(other, create=False),
        lambda: Store(other, readonly=True),
    ):
        with pytest.raises(StoreError, match="not a replay-sim store") as refused:
            opening()
        assert str(other) in str(refused.value) and holds in str(refused.value)
    assert other.read_bytes() == before


def _corrupt_column(path: Path, table: str, column: str, where: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute(f"UPDATE {table} SET {column} = '{{\"content\": [trunc' WHERE {where}")
    conn.commit()
    conn.close()


@pytest.mark.parametrize(
    ("table", "column", "where", "reading", "named"),
    [
        ("calls", "result", "id = 2", lambda s: s.recordings(), "recording #2 is corrupt: its result"),
        (
            "calls",
            "arguments",
            "id = 2",
            lambda s: s.outcomes("git"),
            "recording #2 is corrupt: its arguments",
        ),
        ("servers", "info", "name = 'git'", lambda s: s.servers(), "server 'git' is corrupt: its info"),
        (
            "listings",
            "result",
            "server = 'git'",
            lambda s: s.listings("git"),
            "the tools/list listing of 'git' is corrupt: its result",
        ),
        (
            "meta",
            "value",
            "key = 'note'",
            lambda s: s.meta("note"),
            "meta value 'note' is corrupt: its value",
        ),
    ],
)
def test_a_row_whose_json_is_corrupt_is_an_error_naming_the_row_and_the_store(
    tmp_path: Path, table: str, column: str, where: str, reading: Any, named: str
) -> None:
    path = tmp_path / "r.db"
    with Store(path) as store:
        store.put_server(ServerRecord("git", {"name": "git", "version": "1"}, {}))
        store.put_listing("git", "tools/list", {"tools": []})
        store.set_meta("note", {"a": 1})
        for n in range(3):
            store.record_call(
                "git", "tools/call", {"name": "log", "arguments": {"n": n}}, result={"content": []}
            )
    _corrupt_column(path, table, column, where)
    # It passes the open-time check (the file is sound); reading the row fails, naming it.
    with Store(path, readonly=True) as store, pytest.raises(StoreError) as refused:
        reading(store)
    assert f"{path}: {named} is not JSON" in str(refused.value)


def test_exporting_a_store_with_a_corrupt_row_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    with Store(path) as store:
        for n in range(3):
            store.record_call(
                "git", "tools/call", {"name": "log", "arguments": {"n": n}}, result={"content": []}
            )
    _corrupt_column(path, "calls", "result", "id = 3")
    run = subprocess.run(
        [sys.executable, "-m", "replay_sim", "export", "--db", str(path)], capture_output=True, text=True
    )
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
    assert f"{path}: recording #3 is corrupt" in run.stderr


def test_a_call_is_stamped_with_the_utc_time_to_the_microsecond() -> None:
    before = datetime.now(UTC)
    stamp = utc_now()
    after = datetime.now(UTC)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", stamp)
    assert before - timedelta(microseconds=1) <= datetime.fromisoformat(stamp) <= after
