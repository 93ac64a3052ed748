"""The replay's exact hit over HTTP and stdio, against the baselines measured in the same run.

HTTP: four servers run as uvicorn subprocesses on 127.0.0.1, each on a socket bound by the
listener ``replay-sim serve`` uses (``replay_sim.listener.listen``: TCP_NODELAY on accepted
connections), in interleaved rounds; this process is the client (the MCP SDK's ``Client``, as a
rollout worker would use it):

- ``replay``: the replay app exactly as ``replay-sim serve`` runs it (``replay.runner.serve``);
- ``bare_json``: a bare SDK server returning the same constant, with JSON responses (the target);
- ``bare_sse``: the same bare server with the SDK's default SSE responses (for reference);
- ``raw``: a minimal raw-ASGI JSON-RPC server answering constants (the floor for Python over HTTP here).

Reported: the median of sequential exact-hit ``tools/call`` round trips on one session, server CPU
per call in that phase, and calls/s at 64 and 256 concurrent sessions. Targets: round trip <= 1.0x
``bare_json`` and <= 1.5x ``raw``; throughput >= 1.0x ``bare_json``.

stdio: ``replay-sim serve --stdio``, a bare SDK stdio server and a bare Python line echo (a blocking
loop answering each line with a constant: the floor for a Python stdio server here), driven by a
raw line client (write a request line, read its answer line), interleaved in rounds; the replay's
median exact hit must be <= 0.1 ms. With ``REPLAY_SIM_BENCH_BEFORE=DIR`` (a checkout of another
version, e.g. a ``git worktree`` of the previous commit) that checkout's ``serve --stdio`` runs in
the same rounds. With the peers installed (:mod:`bench._peers`), mcp-rec (the issue's best stdio
peer) runs in the same rounds too, replaying its own recording of the same calls to the bare SDK
stdio server (``mcp-rec record`` in front of it, driven by the same client; mcp-rec serves each
recorded answer once, so the recording holds every call of a round).

Run with ``python -m bench`` (every bench module), ``python -m bench.replay``, or
``python -m bench.replay stdio`` for the stdio figures alone.
"""

from __future__ import annotations

import json
import os
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

from bench._peers import PEER_ENV, peers_bin

RESULT = {"content": [{"type": "text", "text": "hello"}], "isError": False}
TOOL = {
    "name": "echo",
    "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]},
    "annotations": {"readOnlyHint": True},
}
ARGS = {"message": "hello"}
ROUND_TRIPS = 1500
WARMUP = 200
ROUNDS = 3
KINDS = ("bare_json", "replay", "raw", "bare_sse")
STDIO_CALLS = 3000
STDIO_ROUNDS = 5
STDIO_TARGET_MS = 0.1
BIN = Path(sys.executable).parent


def bare_server() -> Any:
    """The baseline: a plain SDK server whose tool returns the same constant result."""
    import mcp_types as types
    from mcp.server import Server

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool.model_validate(TOOL)])

    async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
        return types.CallToolResult.model_validate(RESULT)

    return Server("bare", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


def raw_app() -> Any:
    """The floor: the least an ASGI app can do to answer MCP over HTTP (constants, no validation)."""
    import uuid

    results = {
        "initialize": {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "1"},
        },
        "tools/list": {"tools": [TOOL]},
        "tools/call": RESULT,
    }

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 405, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body)
        session = dict(scope["headers"]).get(b"mcp-session-id") or uuid.uuid4().hex.encode()
        if "id" not in request:
            await send(
                {"type": "http.response.start", "status": 202, "headers": [(b"mcp-session-id", session)]}
            )
            await send({"type": "http.response.body", "body": b""})
            return
        answer = {"jsonrpc": "2.0", "id": request["id"], "result": results.get(request["method"], {})}
        data = json.dumps(answer, separators=(",", ":")).encode()
        headers = [(b"content-type", b"application/json"), (b"mcp-session-id", session)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    return app


def replay(db: str) -> Any:
    """The replay over a store holding the same call and result."""
    from replay_sim.replay.core.replay import Replay
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
    from replay_sim.replay.http.runner import serve

    if kind == "replay":  # exactly as `replay-sim serve` runs it
        serve(replay(db), "127.0.0.1", port)
        return
    if kind == "raw":
        app = raw_app()
    else:
        app = bare_server().streamable_http_app(
            streamable_http_path="/mcp/bench", json_response=kind == "bare_json"
        )
    with listen("127.0.0.1", port) as sock:  # the same socket options for every baseline
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


@contextmanager
def server(kind: str, db: Path) -> Iterator[tuple[str, int]]:
    """Run one server in a subprocess; yields its MCP URL and pid once it answers."""
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
        settle(process.pid)
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(pid: int, timeout: float = 120) -> None:
    """Wait until a server is idle: its background warm-up (the embedding model) is not measured here.

    bench/startup.py measures start-up; this bench measures answers once a server is warm.
    """
    deadline = time.monotonic() + timeout
    before = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = cpu_seconds(pid)
        if now - before < 0.03:
            return
        before = now


async def round_trip(url: str, pid: int) -> tuple[float, float]:
    """Median seconds of one sequential exact-hit ``tools/call`` on one session, and server CPU per call."""
    async with Client(url, mode="legacy") as client:
        for _ in range(WARMUP):
            await client.call_tool("echo", ARGS)
        times = []
        cpu = cpu_seconds(pid)
        for _ in range(ROUND_TRIPS):
            started = time.perf_counter()
            result = await client.call_tool("echo", ARGS)
            times.append(time.perf_counter() - started)
            assert result.content[0].text == "hello"
        cpu = cpu_seconds(pid) - cpu
    return statistics.median(times), cpu / ROUND_TRIPS


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
    """Every HTTP figure for one server."""
    with server(kind, db) as (url, pid):
        median, cpu = anyio.run(round_trip, url, pid)
        return {
            "round_trip_ms": median * 1000,
            "server_cpu_us": cpu * 1e6,
            "throughput_64": anyio.run(throughput, url, 64, 40),
            "throughput_256": anyio.run(throughput, url, 256, 12),
        }


def stdio_round_trip(command: list[str], calls: int = STDIO_CALLS, cwd: str | None = None) -> float:
    """Median milliseconds of an exact-hit ``tools/call`` over a stdio server, by a raw line client."""
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, cwd=cwd, env=PEER_ENV
    )
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    def ask(message: dict[str, Any]) -> bytes:
        stdin.write(json.dumps(message).encode() + b"\n")
        return stdout.readline() if "id" in message else b""

    try:
        init = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "b", "version": "0"},
        }
        ask({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init})
        ask({"jsonrpc": "2.0", "method": "notifications/initialized"})
        settle(process.pid)
        call = {"name": "echo", "arguments": ARGS}
        times = []
        for i in range(1, WARMUP + calls + 1):
            line = (
                json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": call}).encode()
                + b"\n"
            )
            started = time.perf_counter()
            stdin.write(line)
            answer = stdout.readline()
            times.append(time.perf_counter() - started)
            assert b'"hello"' in answer, answer
        return statistics.median(times[WARMUP:]) * 1000
    finally:
        stdin.close()
        process.wait(timeout=30)


def _bare_stdio() -> None:
    """A bare SDK stdio server (``Server.run`` over the SDK's ``stdio_server``)."""
    from mcp.server.stdio import stdio_server

    async def main() -> None:
        bare = bare_server()
        async with stdio_server() as (read, write):
            await bare.run(read, write, bare.create_initialization_options())

    anyio.run(main)


def _line_echo() -> None:
    """The floor: a blocking loop answering each request line with a constant result (no MCP at all)."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    result = json.dumps(RESULT, separators=(",", ":")).encode()
    for line in stdin:
        request = json.loads(line)
        if "id" in request:
            id_ = json.dumps(request["id"]).encode()
            stdout.write(b'{"jsonrpc":"2.0","id":' + id_ + b',"result":' + result + b"}\n")
            stdout.flush()


def stdio(db: Path) -> dict[str, float]:
    """The stdio figures: the replay, the bare SDK server, the line echo and mcp-rec, interleaved, best
    of each."""
    commands = {
        "replay": [str(BIN / "replay-sim"), "serve", "--stdio", "--server", "bench", "--db", str(db)],
        "bare": [sys.executable, "-m", "bench.replay", "bare-stdio"],
        "echo": [sys.executable, "-m", "bench.replay", "line-echo"],
    }
    cwd: dict[str, str] = {}
    before = os.environ.get("REPLAY_SIM_BENCH_BEFORE")
    if before:  # `python -m replay_sim` in that checkout imports its own package
        commands["before"] = [sys.executable, "-m", "replay_sim", *commands["replay"][1:]]
        cwd["before"] = before
    peers = peers_bin()
    if peers is not None:  # the best stdio peer, on its recording of the same calls to the bare server
        session = db.parent / "mcp-rec.jsonl"
        stdio_round_trip([str(peers / "mcp-rec"), "record", "-o", str(session), "--", *commands["bare"]])
        commands["mcp-rec"] = [str(peers / "mcp-rec"), "replay", str(session)]
    best: dict[str, float] = {}
    for _ in range(STDIO_ROUNDS):
        for kind, command in commands.items():
            median = stdio_round_trip(command, cwd=cwd.get(kind))
            best[kind] = min(best.get(kind, median), median)
    figures = {f"{kind}_ms": figure for kind, figure in best.items()}
    figures["vs_bare"] = best["replay"] / best["bare"]
    figures["vs_echo"] = best["replay"] / best["echo"]
    if "before" in best:
        figures["vs_before"] = best["replay"] / best["before"]
    if "mcp-rec" in best:
        figures["vs_mcp_rec"] = best["replay"] / best["mcp-rec"]
    return figures


def main() -> dict[str, Any]:
    """Run the benchmark (every server once per round, interleaved; best of each) and print the ratios."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        make_store(db)
        runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
        for _ in range(ROUNDS):
            for kind in KINDS:
                runs[kind].append(measure(kind, db))
        stdio_figures = stdio(db)
    best = {
        kind: {
            "round_trip_ms": min(r["round_trip_ms"] for r in rs),
            "server_cpu_us": min(r["server_cpu_us"] for r in rs),
            "throughput_64": max(r["throughput_64"] for r in rs),
            "throughput_256": max(r["throughput_256"] for r in rs),
        }
        for kind, rs in runs.items()
    }
    ours, bare, raw = best["replay"], best["bare_json"], best["raw"]
    report: dict[str, Any] = {
        **best,
        "round_trip_vs_bare_json": ours["round_trip_ms"] / bare["round_trip_ms"],
        "round_trip_vs_raw": ours["round_trip_ms"] / raw["round_trip_ms"],
        "server_cpu_vs_bare_json": ours["server_cpu_us"] / bare["server_cpu_us"],
        "throughput_64_vs_bare_json": ours["throughput_64"] / bare["throughput_64"],
        "throughput_256_vs_bare_json": ours["throughput_256"] / bare["throughput_256"],
        "stdio": stdio_figures,
    }
    report["targets"] = {
        "round_trip_vs_bare_json <= 1.0": report["round_trip_vs_bare_json"] <= 1.0,
        "round_trip_vs_raw <= 1.5": report["round_trip_vs_raw"] <= 1.5,
        "throughput_64_vs_bare_json >= 1.0": report["throughput_64_vs_bare_json"] >= 1.0,
        "throughput_256_vs_bare_json >= 1.0": report["throughput_256_vs_bare_json"] >= 1.0,
        f"stdio replay <= {STDIO_TARGET_MS} ms": stdio_figures["replay_ms"] <= STDIO_TARGET_MS,
    }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "serve":
        _serve(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif len(sys.argv) >= 2 and sys.argv[1] == "bare-stdio":
        _bare_stdio()
    elif len(sys.argv) >= 2 and sys.argv[1] == "line-echo":
        _line_echo()
    elif len(sys.argv) >= 2 and sys.argv[1] == "stdio":
        with tempfile.TemporaryDirectory() as tmp:
            make_store(Path(tmp) / "bench.db")
            print(json.dumps(stdio(Path(tmp) / "bench.db"), indent=2))
    else:
        main()
