"""``replay-sim explore`` and ``replay-sim backfill`` (real processes: the recorder, the replay server
over stdio, the counter fixture server as the upstream).

A miss a replay server made is kept in the store across its restart, backfill asks it of the real
server, and the restarted replay answers it exactly.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from recording_helpers import BIN, PYTHON, ROOT, proxy_stdio, run_script, stdio, step

from replay_sim.store import Store
from replay_sim.store.misses import side_file
from replay_sim.store.misslog import MissLog

COUNTER = ROOT / "fixtures" / "counter_server.py"
REPLAY_SIM = [sys.executable, "-m", "replay_sim"]


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*REPLAY_SIM, *map(str, args)], capture_output=True, text=True)


def _config(tmp_path: Path, extra: str = "") -> Path:
    config = tmp_path / "recorder.toml"
    config.write_text(f'[servers.counter]\ncommand = "{PYTHON}"\nargs = ["{COUNTER}"]\n{extra}')
    return config


def _replayed(db: Path, cwd: Path, *calls: tuple[str, dict[str, Any]]) -> list[str]:
    """Run calls through ``replay-sim serve --stdio`` (one history); each answer's match status."""
    serve = stdio(BIN / "replay-sim", "serve", "--stdio", "--server", "counter", "--db", db)
    serve.cwd = str(cwd)
    answers = anyio.run(run_script, serve, list(calls))
    return [a.get("_meta", {}).get("replay-sim/match", {}).get("status", "error") for a in answers]


@pytest.mark.slow
def test_a_miss_survives_the_replay_server_and_backfill_makes_it_an_exact_hit(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    anyio.run(
        run_script,
        proxy_stdio(db, "counter", [PYTHON, COUNTER]),
        [step("get", key="a"), step("put", key="a", value="1")],
    )
    missed = (step("put", key="a", value="1"), step("get", key="a"))
    # The index built first: the replay's warm-up only loads it, so the miss is a miss, not "still
    # starting" (an index built by the warm-up embeds every recording: seconds on a busy machine).
    index = [*REPLAY_SIM, "index", "build", "--db", str(db)]
    built = subprocess.run(index, cwd=tmp_path, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    assert _replayed(db, tmp_path, *missed) == ["exact", "miss"]  # the read after the write: never recorded

    plain = _run("backfill", "--config", _config(tmp_path), "--db", db)
    assert plain.returncode == 0, plain.stderr
    assert (
        "needs a reset command" in plain.stdout and "the store now answers 0 of the 1 misses" in plain.stdout
    )

    # The counter keeps its state in its process: a fresh one is its initial state.
    done = _run("backfill", "--config", _config(tmp_path, 'reset = "true"\n'), "--db", db)
    assert done.returncode == 0, done.stderr
    assert (
        "backfilled 1 of 1 misses" in done.stdout and "the store now answers 1 of the 1 misses" in done.stdout
    )
    assert _replayed(db, tmp_path, *missed) == ["exact", "exact"]


@pytest.mark.slow
def test_explore_and_backfill_report_a_failing_reset_and_a_gone_upstream_in_one_line_each(
    tmp_path: Path,
) -> None:
    db = tmp_path / "r.db"
    anyio.run(run_script, proxy_stdio(db, "counter", [PYTHON, COUNTER]), [step("get", key="a")])
    failing = _config(tmp_path, 'reset = "exit 4"\n')
    explored = _run("explore", "--config", failing, "--db", db)
    assert explored.returncode == 0, explored.stderr
    assert (
        "counter: not explored: reset command of upstream 'counter' (exit 4) failed with exit status 4"
        in explored.stdout
    )

    gone = tmp_path / "gone.toml"
    gone.write_text(f'[servers.counter]\ncommand = "{tmp_path / "gone"}"\n')
    explored = _run("explore", "--config", gone, "--db", db)
    assert explored.returncode == 0 and "cannot be started" in explored.stdout

    missing = _run("backfill", "--config", gone, "--db", tmp_path / "none.db")
    assert (
        missing.returncode == 1
        and missing.stderr.count("\n") == 1
        and "no such recording store" in missing.stderr
    )


def test_backfill_reads_a_miss_log_from_an_older_snapshot_as_holding_none(tmp_path: Path) -> None:
    older = tmp_path / "older"
    older.mkdir()
    Store(older / "store.db").close()
    with sqlite3.connect(older / "store.db") as conn:  # a bundle store from before misses were kept
        conn.executescript("DROP TABLE miss_steps; DROP TABLE misses;")
    db = tmp_path / "r.db"
    Store(db).close()
    done = _run("backfill", "--config", _config(tmp_path), "--db", db, "--misses", older)
    assert done.returncode == 0, done.stderr
    assert f"no misses kept in {older}" in done.stdout and "backfilled 0 of 0 misses" in done.stdout

    # Served read-only, the snapshot's misses went to a side file next to the bundle: backfill reads it.
    with Store(older / "store.db", readonly=True) as frozen:
        log = MissLog(frozen)
        log.add("counter", "tools/call", "get", {"key": "k"}, prefix=[], status="miss", reason="none")
        log.close()
    assert side_file(older / "store.db") == tmp_path / "older.misses.db"
    done = _run("backfill", "--config", _config(tmp_path), "--db", db, "--misses", older)
    assert done.returncode == 0, done.stderr
    assert "backfilled 0 of 1 misses" in done.stdout
    assert "the call may change state; upstream 'counter' needs a reset command" in done.stdout
