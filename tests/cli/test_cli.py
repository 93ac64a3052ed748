"""The store commands of the CLI: `sessions` and `stats` (real subprocesses, real files)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from replay_sim.store import Store

REPLAY_SIM = [sys.executable, "-m", "replay_sim"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*REPLAY_SIM, *args], capture_output=True, text=True)


def test_sessions_lists_sessions_and_shows_one(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with Store(db) as store:
        session = store.start_session("echo", "s-abc")
        store.record_call(
            "echo",
            "tools/call",
            {"name": "echo", "arguments": {"x": 1}},
            result={"content": []},
            session=session,
        )
        store.record_call(
            "echo",
            "tools/call",
            {"name": "boom"},
            error={"code": -32603, "message": "crashed"},
            session=session,
        )
    listing = _run("sessions", "--db", str(db))
    assert listing.returncode == 0 and "s-abc\techo" in listing.stdout and "2 calls" in listing.stdout
    shown = _run("sessions", "--db", str(db), "s-abc")
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("1\t#1\ttools/call\techo") and lines[0].split("\t")[5] == "ok"
    assert lines[1].split("\t")[5] == "error"
    unknown = _run("sessions", "--db", str(db), "s-nope")
    assert unknown.returncode == 1 and "no session 's-nope'" in unknown.stderr


def test_stats_counts_calls_and_errors_per_tool(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with Store(db) as store:
        for _ in range(3):
            store.record_call("echo", "tools/call", {"name": "echo"}, result={"content": []}, latency_ms=2.0)
        store.record_call(
            "echo", "tools/call", {"name": "echo"}, result={"content": [], "isError": True}, latency_ms=4.0
        )
    rows = json.loads(_run("stats", "--db", str(db), "--json").stdout)
    assert rows == [
        {
            "server": "echo",
            "method": "tools/call",
            "name": "echo",
            "origin": "live",
            "calls": 4,
            "errors": 1,
            "mean_latency_ms": 2.5,
        }
    ]


def test_commands_on_a_missing_store_fail_with_one_line(tmp_path: Path) -> None:
    failed = _run("stats", "--db", str(tmp_path / "none.db"))
    assert failed.returncode == 1
    assert failed.stderr.count("\n") == 1 and "none.db: no such recording store" in failed.stderr
