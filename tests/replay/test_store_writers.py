"""A replay served over real HTTP while another process writes to its store.

``replay-sim import``, ``record``, ``backfill``, ``explore`` and ``index build`` all default to the
store a replay serves, so another process may hold its write lock at any time. Nothing a client
asks waits for that lock; what the replay writes meanwhile (kept misses) waits in a queue and is
written once the lock is free.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from recording_helpers import PYTHON, spawn
from replay_helpers import build_store, payload, raw_session, tool_call
from store_helpers import write_locked

from replay_sim.listener import serving_in_thread
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.http.app import create_app
from replay_sim.resolve.embedding import SentenceTransformerEmbedder
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store
from replay_sim.store.misses import read_misses

pytestmark = pytest.mark.anyio

# Holds an EXCLUSIVE write transaction on the store until it reads a line from stdin.
HOLD_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
conn.execute("INSERT OR REPLACE INTO meta VALUES ('other-writer', '1')")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
print("released", flush=True)
"""


async def _post(http: httpx2.AsyncClient, url: str, headers: dict[str, str], method: str, params: Any) -> Any:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return payload(await http.post(url, json=body, headers=headers))


def _status(answer: dict[str, Any]) -> str:
    return str(answer["result"]["_meta"]["replay-sim/match"]["status"])


def _served_replay(db: Path, embedder: SentenceTransformerEmbedder) -> Replay:
    """A replay of :func:`build_store` at ``db``, warm (its index loaded) before it serves."""
    store = build_store(db)
    replay = Replay(store, resolver=Resolver(store, index_dir=None, embedder=embedder))
    replay.resolver.warm()
    return replay


async def test_a_store_locked_by_another_process_delays_no_answer_and_loses_no_miss(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    db = tmp_path / "replay.db"
    replay = _served_replay(db, embedder)
    store = replay.store
    with serving_in_thread(create_app(replay)) as base:
        url = f"{base}/episodes/ep-locked/mcp/demo"
        async with spawn(PYTHON, "-c", HOLD_LOCK, str(db)) as holder:
            await holder.wait_for("^locked$")
            # Every answer arrives while the other process still holds the lock: well inside
            # SQLite's 30 s busy timeout, which the code before the fix waited out on each of them.
            with anyio.fail_after(20):
                async with httpx2.AsyncClient(timeout=30) as http:
                    headers = await raw_session(http, url)
                    first = await _post(
                        http, url, headers, "tools/call", tool_call("echo", message="never recorded")
                    )
                    listed = await _post(http, url, headers, "tools/list", {})
                    hit = await _post(http, url, headers, "tools/call", tool_call("echo", message="hello"))
                    second = await _post(
                        http, url, headers, "tools/call", tool_call("echo", message="nor this")
                    )
                    again = await _post(http, url, headers, "tools/list", {})
            assert (_status(first), _status(hit), _status(second)) == ("miss", "exact", "miss")
            assert [t["name"] for t in listed["result"]["tools"]] == ["echo", "counter", "increment", "slow"]
            assert again["result"]["tools"] == listed["result"]["tools"]
            assert holder.process.returncode is None  # the lock was held throughout
            with sqlite3.connect(db) as reader:  # WAL: a reader is not blocked by the writer either
                assert reader.execute("SELECT COUNT(*) FROM misses").fetchone() == (0,)
            assert holder.process.stdin is not None
            await holder.process.stdin.send(b"release\n")
            await holder.wait_for("^released$")
        assert replay.miss_log is not None and replay.miss_log.flush(20)
        kept = sorted(m.params["arguments"]["message"] for m in read_misses(store))
        assert kept == ["never recorded", "nor this"]
        assert replay.miss_log.dropped == 0
    store.close()


async def test_closing_a_replay_writes_its_queued_misses_before_closing_the_store(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    db = tmp_path / "replay.db"
    replay = _served_replay(db, embedder)
    with write_locked(db):  # the miss cannot be written at once: it waits in the queue
        await replay.resolve("demo", "tools/call", tool_call("echo", message="kept at close"), [])
    replay.close()
    with Store(db, readonly=True) as store:
        assert [m.params["arguments"]["message"] for m in read_misses(store)] == ["kept at close"]
