"""Bounded load test on 127.0.0.1: 1,000 MCP sessions in bursts against ``replay-sim serve``'s app.

The replay runs in a subprocess through :func:`replay_sim.replay.http.runner.serve` (the listener and app
the CLI uses, ``gc.freeze`` included) on a free loopback port. The client opens ``BURSTS`` bursts of
``PER_BURST`` concurrent sessions over raw streamable HTTP (handshake era: ``initialize``,
``notifications/initialized``, then ``CALLS`` exact-hit ``tools/call``, then ``DELETE``), and checks
every answer: the content equals the recording and the provenance says ``exact``. Reported:
sessions/s, calls/s, p50/p99 latency of a ``tools/call`` and of a whole session, and the server's
peak RSS (``VmHWM``). Run with ``python -m bench load``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2

BURSTS = 10
PER_BURST = 100
CALLS = 3
RECORDED = 50
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
PROTOCOL = "2025-11-25"

SERVER = """
import sys
from replay_sim.store import ServerRecord, Store
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.http.runner import serve
from replay_sim.resolve.resolver import Resolver

store = Store(sys.argv[1])
replay = Replay(store, resolver=Resolver(store, index_dir=None))
serve(replay, "127.0.0.1", 0, on_ready=lambda url: print(url, flush=True))
"""


def answer(i: int) -> str:
    """The recorded text of the ``i``-th echo call."""
    return f"echo {i}: " + "x" * (i % 7)


def make_store(db: Path) -> None:
    """A store with one server ``demo`` and ``RECORDED`` distinct echo recordings."""
    from replay_sim.store import ServerRecord, Store

    store = Store(db)
    store.put_server(ServerRecord("demo", {"name": "demo", "version": "1"}, {"tools": {}}, PROTOCOL))
    tool = {
        "name": "echo",
        "annotations": {"readOnlyHint": True},
        "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}},
    }
    store.put_listing("demo", "tools/list", {"tools": [tool]})
    session = store.start_session("demo", "s-load")
    for i in range(RECORDED):
        store.record_call(
            "demo",
            "tools/call",
            {"name": "echo", "arguments": {"message": f"m{i}"}},
            result={"content": [{"type": "text", "text": answer(i)}], "isError": False},
            session=session,
        )
    store.close()


def initialize(client: str) -> dict[str, Any]:
    """A handshake-era ``initialize`` request from a client named ``client``."""
    params = {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": client, "version": "0"}}
    return {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}


def payload(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC message in a streamable HTTP answer (plain JSON or the last SSE data event)."""
    response.raise_for_status()
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.json()
    events = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    return json.loads([e for e in events if e][-1])


async def one_session(http: httpx2.AsyncClient, url: str, n: int, call_ms: list[float]) -> float:
    """Initialize, make ``CALLS`` checked exact-hit calls, close; returns the session's seconds."""
    started = time.perf_counter()
    response = await http.post(url, json=initialize("load"), headers=ACCEPT)
    assert payload(response)["result"]["serverInfo"]["name"] == "demo"
    headers = ACCEPT | {
        "Mcp-Session-Id": response.headers["mcp-session-id"],
        "MCP-Protocol-Version": PROTOCOL,
    }
    await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    for c in range(CALLS):
        i = (n * CALLS + c) % RECORDED
        request = {
            "jsonrpc": "2.0",
            "id": c + 1,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": f"m{i}"}},
        }
        t0 = time.perf_counter()
        result = payload(await http.post(url, json=request, headers=headers))["result"]
        call_ms.append((time.perf_counter() - t0) * 1000)
        assert result["content"] == [{"type": "text", "text": answer(i)}], result
        assert result["_meta"]["replay-sim/match"]["status"] == "exact", result["_meta"]
    await http.delete(url, headers=headers)
    return time.perf_counter() - started


def peak_rss_mb(pid: int) -> float:
    """A process's peak resident set (``VmHWM``), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def main() -> dict[str, Any]:
    """Run the load test once and print its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "load.db"
        make_store(db)
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(db)], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
        )
        try:
            assert proc.stdout is not None
            base = proc.stdout.readline().strip()
            if not base.startswith("http://127.0.0.1:"):
                raise RuntimeError(f"server did not start: {base!r}")
            url = f"{base}/mcp/demo"
            call_ms: list[float] = []
            session_s: list[float] = []

            async def run() -> float:
                limits = httpx2.Limits(max_connections=PER_BURST, max_keepalive_connections=PER_BURST)
                async with httpx2.AsyncClient(timeout=60, limits=limits) as http:
                    await one_session(http, url, -1, [])  # warm-up, not counted
                    started = time.perf_counter()
                    for burst in range(BURSTS):

                        async def go(n: int) -> None:
                            session_s.append(await one_session(http, url, n, call_ms))

                        async with anyio.create_task_group() as tg:
                            for k in range(PER_BURST):
                                tg.start_soon(go, burst * PER_BURST + k)
                    return time.perf_counter() - started

            elapsed = anyio.run(run)
            rss = peak_rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    sessions = BURSTS * PER_BURST
    assert len(session_s) == sessions and len(call_ms) == sessions * CALLS
    figures = {
        "sessions": sessions,
        "calls": len(call_ms),
        "sessions_per_s": sessions / elapsed,
        "calls_per_s": len(call_ms) / elapsed,
        "call_p50_ms": statistics.median(call_ms),
        "call_p99_ms": percentile(call_ms, 99),
        "session_p50_ms": statistics.median(session_s) * 1000,
        "session_p99_ms": percentile(session_s, 99) * 1000,
        "server_peak_rss_mb": rss,
        "cpus": os.cpu_count(),
    }
    print(
        f"   {sessions} sessions ({BURSTS} bursts x {PER_BURST} concurrent, {CALLS} exact calls each), "
        f"every answer checked, in {elapsed:.1f}s on {os.cpu_count()} CPUs\n"
        f"   {figures['sessions_per_s']:.0f} sessions/s, {figures['calls_per_s']:.0f} calls/s; "
        f"tools/call p50 {figures['call_p50_ms']:.1f} ms, p99 {figures['call_p99_ms']:.1f} ms; "
        f"session p50 {figures['session_p50_ms']:.0f} ms, p99 {figures['session_p99_ms']:.0f} ms; "
        f"server peak RSS {rss:.0f} MiB",
        flush=True,
    )
    return figures


if __name__ == "__main__":
    main()
