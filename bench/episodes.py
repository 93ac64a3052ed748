"""Episodes: the memory one costs, against an MCP session's, and the cost of routing by episode.

Reported (each against a baseline measured in the same run):

- memory per idle episode (created, then after a three-call rollout) and per idle MCP session
  (handshake era: the SDK's transport, streams and task of an initialized session), measured with
  ``tracemalloc`` over many of each in this process (the app served in a thread); the ratio says
  how many episodes cost what one session does;
- the round trip of an exact hit (median of sequential ``tools/call``) through an episode URL, the
  ``X-Replay-Episode`` header and ``_meta``, each against ``/mcp/<server>`` on a plain handshake
  session, with the replay served by ``replay-sim serve`` in a subprocess (target <= 1.10).

Run with ``python -m bench`` (every bench module) or ``python -m bench.episodes``.
"""

from __future__ import annotations

import gc
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2

EPISODES = 20_000
SESSIONS = 300
ROUND_TRIPS = 1000
WARMUP = 150
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
TOOLS = {
    "tools": [
        {
            "name": "echo",
            "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}},
            "annotations": {"readOnlyHint": True},
        },
        {"name": "put", "inputSchema": {"type": "object", "properties": {"value": {"type": "string"}}}},
    ]
}


def build_store(path: Path) -> None:
    """A store with one server: an echo (exact hits) and a write followed by reads (a stateful rollout)."""
    from replay_sim.store import ServerRecord, Store

    with Store(path) as store:
        store.put_server(
            ServerRecord("bench", {"name": "bench", "version": "1"}, {"tools": {}}, "2025-11-25")
        )
        store.put_listing("bench", "tools/list", TOOLS)
        session = store.start_session("bench", "s-1")
        result = {"content": [{"type": "text", "text": "hello"}], "isError": False}
        store.record_call(
            "bench",
            "tools/call",
            {"name": "echo", "arguments": {"message": "hello"}},
            result=result,
            session=session,
        )
        ok = {"content": [{"type": "text", "text": "ok"}], "isError": False}
        store.record_call(
            "bench", "tools/call", {"name": "put", "arguments": {"value": "x"}}, result=ok, session=session
        )
        store.record_call(
            "bench",
            "tools/call",
            {"name": "echo", "arguments": {"message": "hello"}},
            result=result,
            session=session,
        )


def _traced(build: Any) -> tuple[int, Any]:
    """Bytes still allocated after ``build()`` (what it keeps alive), and what it returned."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    kept = build()
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    return grown, kept


def episode_memory(db: Path) -> dict[str, float]:
    """Bytes per idle episode: created only, and after a three-call rollout (write, then reads)."""
    from replay_sim.replay.core.replay import Replay
    from replay_sim.resolve.resolver import Resolver
    from replay_sim.store import Store

    store = Store(db, readonly=True)
    replay = Replay(store, resolver=Resolver(store, index_dir=None))
    calls = [
        {"name": "echo", "arguments": {"message": "hello"}},
        {"name": "put", "arguments": {"value": "x"}},
        {"name": "echo", "arguments": {"message": "hello"}},
    ]

    def created() -> Any:
        return [replay.episodes.create(f"created-{i}") for i in range(EPISODES)]

    def rolled_out() -> Any:
        kept = []
        for i in range(EPISODES):
            episode = replay.episodes.open(f"rollout-{i}")
            trail = episode.trail("bench")
            for params in calls:
                resolution = replay.resolver.resolve("bench", "tools/call", params, trail)
                replay.resolver.advance(trail, resolution)
                episode.called("bench")
                episode.count("bench", params["name"], resolution.tier.value, None)
            kept.append(episode)
        return kept

    replay.episodes.max_live = 10 * EPISODES
    replay.resolver.resolve("bench", "tools/call", calls[0], ())  # caches warm before measuring
    empty, _ = _traced(created)
    used, _ = _traced(rolled_out)
    store.close()
    return {"created": empty / EPISODES, "rolled_out": used / EPISODES}


def session_memory(db: Path) -> float:
    """Bytes per idle, initialized handshake-era MCP session of the replay app (served in this process)."""
    from replay_sim.listener import serving_in_thread
    from replay_sim.replay.factory import open_replay
    from replay_sim.replay.http.app import create_app
    from replay_sim.replay.options import Limits

    replay = open_replay(db, index_dir=db.parent / "index")
    with serving_in_thread(create_app(replay, limits=Limits(max_sessions=SESSIONS * 2))) as url:
        endpoint = f"{url}/mcp/bench"

        async def open_sessions(http: httpx2.AsyncClient, count: int) -> list[str]:
            ids = []
            for _ in range(count):
                ids.append((await _initialize(http, endpoint))["Mcp-Session-Id"])
            return ids

        async def measure() -> float:
            async with httpx2.AsyncClient(timeout=60) as http:
                await open_sessions(http, 20)  # the server's own caches warm first
                await anyio.sleep(0.5)
                gc.collect()
                tracemalloc.start()
                before = tracemalloc.take_snapshot()
                await open_sessions(http, SESSIONS)
                await anyio.sleep(0.5)  # each session's task settles
                gc.collect()
                after = tracemalloc.take_snapshot()
                tracemalloc.stop()
                grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
                return grown / SESSIONS

        per_session = anyio.run(measure)
    replay.close()
    return per_session


async def _initialize(
    http: httpx2.AsyncClient, url: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    headers = ACCEPT | (extra or {})
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"},
        },
    }
    response = await http.post(url, json=init, headers=headers)
    headers |= {"Mcp-Session-Id": response.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    return headers


@contextmanager
def served(db: Path) -> Iterator[str]:
    """``replay-sim serve`` over ``db`` in a subprocess; yields its base URL."""
    command = [sys.executable, "-m", "replay_sim", "serve", "--db", str(db), "--port", "0"]
    command += ["--index-dir", str(db.parent / "index")]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                raise RuntimeError("replay-sim serve exited before it listened")
            found = re.search(r"replaying bench at (http://\S+)/mcp/bench", line)
            url = found.group(1) if found else None
        assert url is not None
        threading.Thread(target=process.stderr.read, daemon=True).start()  # drained: never blocks the server
        while httpx2.get(f"{url}/api/ready", timeout=30).status_code != 200:
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def round_trips(url: str) -> dict[str, float]:
    """Median exact-hit round trip (ms) on one handshake session per way of naming the episode."""
    call = {
        "jsonrpc": "2.0",
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"message": "hello"}},
    }
    ways: dict[str, tuple[str, dict[str, str], dict[str, Any] | None]] = {
        "plain /mcp/<server> (baseline)": (f"{url}/mcp/bench", {}, None),
        "episode URL": (f"{url}/episodes/bench-url/mcp/bench", {}, None),
        "X-Replay-Episode header": (f"{url}/mcp/bench", {"X-Replay-Episode": "bench-header"}, None),
        "_meta episode": (f"{url}/mcp/bench", {}, {"replay-sim/episode": "bench-meta"}),
    }

    async def median(endpoint: str, extra: dict[str, str], meta: dict[str, Any] | None) -> float:
        async with httpx2.AsyncClient(timeout=60) as http:
            headers = await _initialize(http, endpoint, extra)
            body = json.loads(json.dumps(call))
            if meta is not None:
                body["params"]["_meta"] = meta
            times = []
            for i in range(WARMUP + ROUND_TRIPS):
                body["id"] = i + 1
                started = time.perf_counter()
                response = await http.post(endpoint, json=body, headers=headers)
                if response.status_code != 200 or b'"hello"' not in response.content:
                    raise RuntimeError(f"{endpoint}: {response.status_code} {response.text[:300]}")
                if i >= WARMUP:
                    times.append(time.perf_counter() - started)
            return statistics.median(times) * 1000

    results = {}
    for _ in range(2):  # interleaved twice; the better of two runs each
        for name, (endpoint, extra, meta) in ways.items():
            took = anyio.run(median, endpoint, extra, meta)
            results[name] = min(results.get(name, took), took)
    return results


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "bench.db"
        build_store(db)
        memory = episode_memory(db)
        per_session = session_memory(db)
        created, rolled_out = memory["created"], memory["rolled_out"]
        print(
            f"   memory per idle episode: {created:.0f} B created, {rolled_out:.0f} B after a "
            f"3-call rollout (over {EPISODES:,})"
        )
        print(f"   memory per idle MCP session (handshake era): {per_session:.0f} B (over {SESSIONS})")
        print(f"   an MCP session costs what {per_session / memory['rolled_out']:.1f} rolled-out episodes do")
        with served(db) as url:
            times = round_trips(url)
        baseline = times["plain /mcp/<server> (baseline)"]
        for name, took in times.items():
            print(f"   exact hit round trip, {name}: {took:.3f} ms (x{took / baseline:.2f})")


if __name__ == "__main__":
    main()
