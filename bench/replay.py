"""Replay server vs a bare MCP SDK server returning a constant, over the same transport (HTTP).

Both servers run as uvicorn subprocesses on 127.0.0.1, on a socket bound by the listener
``replay-sim serve`` uses (``replay_sim.listener.listen``: what it sets on accepted connections,
TCP_NODELAY, decides kept-alive latency); this process is the client. Reported:

- exact-hit round trip (median of sequential ``tools/call`` on one session): replay / bare, target <= 1.10;
- throughput at 64 and 256 concurrent sessions (calls/s): replay / bare, target >= 0.9.

Run with ``python -m bench`` (every bench module) or ``python -m bench.replay``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client

RESULT = {"content": [{"type": "text", "text": "hello"}], "isError": False}
TOOL = {
    "name": "echo",
    "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]},
    "annotations": {"readOnlyHint": True},
}
ARGS = {"message": "hello"}
ROUND_TRIPS = 1500
WARMUP = 200


def bare_app() -> Any:
    """The baseline: a plain SDK server whose tool returns the same constant result."""
    import mcp_types as types
    from mcp.server import Server

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool.model_validate(TOOL)])

    async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
        return types.CallToolResult.model_validate(RESULT)

    server = Server("bare", version="1", on_list_tools=list_tools, on_call_tool=call_tool)
    return server.streamable_http_app(streamable_http_path="/mcp/bench")


def replay(db: str) -> Any:
    """The replay over a store holding the same call and result."""
    from replay_sim.replay.replay import Replay
    from replay_sim.resolve.resolver import Resolver
    from replay_sim.store import Store

    store = Store(db)
    return Replay(store, resolver=Resolver(store, index_dir=None))


def make_store(db: Path) -> None:
    """Record the benchmark's one call."""
    from replay_sim.store import ServerRecord, Store

    with Store(db) as store:
        store.put_server(ServerRecord("bench", {"name": "bench", "version": "1"}, {"tools": {}}))
        store.put_listing("bench", "tools/list", {"tools": [TOOL]})
        store.record_call("bench", "tools/call", {"name": "echo", "arguments": ARGS}, result=RESULT)


def _serve(kind: str, port: int, db: str) -> None:
    import uvicorn

    from replay_sim.listener import listen
    from replay_sim.replay.runner import serve

    if kind == "replay":  # exactly as `replay-sim serve` runs it
        serve(replay(db), "127.0.0.1", port, log_level="warning")
        return
    with listen("127.0.0.1", port) as sock:  # the same socket options for the baseline
        uvicorn.Server(uvicorn.Config(bare_app(), log_level="warning")).run(sockets=[sock])


@contextmanager
def server(kind: str, db: Path) -> Iterator[str]:
    """Run one server in a subprocess; yields its MCP URL once it answers."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "bench.replay", "serve", kind, str(port), str(db)])
    url = f"http://127.0.0.1:{port}/mcp/bench"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx2.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx2.TransportError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"{kind} server did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


async def round_trip(url: str) -> float:
    """Median seconds of one sequential exact-hit ``tools/call`` on one session."""
    async with Client(url, mode="legacy") as client:
        for _ in range(WARMUP):
            await client.call_tool("echo", ARGS)
        times = []
        for _ in range(ROUND_TRIPS):
            started = time.perf_counter()
            result = await client.call_tool("echo", ARGS)
            times.append(time.perf_counter() - started)
            assert result.content[0].text == "hello"
    return statistics.median(times)


async def throughput(url: str, sessions: int, calls: int) -> float:
    """Calls per second with ``sessions`` concurrent sessions making ``calls`` calls each.

    Every session connects first; the clock runs from the moment all are open until all are done.
    """
    ready, go = anyio.Event(), anyio.Event()
    opened = 0
    finished: list[float] = []

    async def session() -> None:
        nonlocal opened
        async with Client(url, mode="legacy") as client:
            opened += 1
            if opened == sessions:
                ready.set()
            await go.wait()
            for _ in range(calls):
                await client.call_tool("echo", ARGS)
            finished.append(time.perf_counter())

    async with anyio.create_task_group() as tg:
        for _ in range(sessions):
            tg.start_soon(session)
        await ready.wait()
        started = time.perf_counter()
        go.set()
    return sessions * calls / (max(finished) - started)


def measure(kind: str, db: Path) -> dict[str, float]:
    """Every figure for one server."""
    with server(kind, db) as url:
        return {
            "round_trip_ms": anyio.run(round_trip, url) * 1000,
            "throughput_64": anyio.run(throughput, url, 64, 40),
            "throughput_256": anyio.run(throughput, url, 256, 12),
        }


def main() -> dict[str, Any]:
    """Run the benchmark (bare, replay, bare, replay; best of each) and print the ratios."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        make_store(db)
        runs: dict[str, list[dict[str, float]]] = {"bare": [], "replay": []}
        for _ in range(2):
            for kind in ("bare", "replay"):
                runs[kind].append(measure(kind, db))
    best = {
        kind: {
            "round_trip_ms": min(r["round_trip_ms"] for r in rs),
            "throughput_64": max(r["throughput_64"] for r in rs),
            "throughput_256": max(r["throughput_256"] for r in rs),
        }
        for kind, rs in runs.items()
    }
    report = {
        "bare": best["bare"],
        "replay": best["replay"],
        "round_trip_ratio": best["replay"]["round_trip_ms"] / best["bare"]["round_trip_ms"],
        "throughput_64_ratio": best["replay"]["throughput_64"] / best["bare"]["throughput_64"],
        "throughput_256_ratio": best["replay"]["throughput_256"] / best["bare"]["throughput_256"],
    }
    report["targets_met"] = (
        report["round_trip_ratio"] <= 1.10
        and report["throughput_64_ratio"] >= 0.9
        and report["throughput_256_ratio"] >= 0.9
    )
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "serve":
        _serve(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        main()
