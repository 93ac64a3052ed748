"""Start to first exact answer: ``replay-sim serve`` through the real CLI, versus a bare SDK server.

Over HTTP, each server runs as a fresh subprocess on a free port (``--port 0``; the URL is read from
what it prints); the clock runs from just before the process is spawned until a real MCP client
(handshake era: ``initialize``, then ``tools/call``) has the first answer, and for the replay that
answer must be an exact hit. The baseline is a bare MCP SDK server (its default streamable HTTP app)
answering a constant, started the same way in the same run. Over stdio (``serve --stdio``), a raw
line client writes ``initialize``, ``notifications/initialized`` and the call at once and the clock
stops at the call's answer; the baseline is a bare SDK stdio server. After the first answer, the
server's **warm-up CPU** is read from ``/proc/<pid>/stat`` until it stops growing (the background
warm-up done). Rounds are interleaved; medians are reported.

The first replay start after new recordings learns the servers' tool effects and keeps them in the
store (:func:`replay_sim.resolve.tooleffects.remembered_effects`), unless ``replay-sim index build``
kept them already (:func:`~replay_sim.resolve.tooleffects.keep_effects`, as :func:`main` and
:mod:`bench.scale` do after their builds); later starts read them back. The first round is the
first start after the build, and is reported on its own too.

Run with ``python -m bench startup``; :mod:`bench.scale` uses :func:`first_answer` on its
100,000-recording store.
"""

from __future__ import annotations

import json
import os
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client

URL_LINE = re.compile(r"(https?://\S+?)/mcp/(\S+)")
ROUNDS = 3

BARE_SERVER = """
import socket, sys
import mcp_types as types
import uvicorn
from mcp.server import Server

RESULT = {"content": [{"type": "text", "text": "hello"}], "isError": False}
TOOL = {"name": "echo", "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}}}

async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[types.Tool.model_validate(TOOL)])

async def call_tool(ctx, params):
    return types.CallToolResult.model_validate(RESULT)

server = Server("bare", version="1", on_list_tools=list_tools, on_call_tool=call_tool)
app = server.streamable_http_app(streamable_http_path="/mcp/bare")
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(128)
print(f"replaying bare at http://127.0.0.1:{sock.getsockname()[1]}/mcp/bare", file=sys.stderr, flush=True)
uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
"""


BARE_STDIO_SERVER = """
import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

RESULT = {"content": [{"type": "text", "text": "hello"}], "isError": False}
TOOL = {"name": "echo", "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}}}

async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[types.Tool.model_validate(TOOL)])

async def call_tool(ctx, params):
    return types.CallToolResult.model_validate(RESULT)

server = Server("bare", version="1", on_list_tools=list_tools, on_call_tool=call_tool)

async def main():
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())

anyio.run(main)
"""
SETTLED_S = 2.0
"""A server whose CPU time grew by no more than a tick over this long has finished its warm-up."""


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` has used so far, from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def warm_up_cpu(pid: int, deadline_s: float = 600.0) -> float:
    """CPU seconds process ``pid`` uses from now until it settles (idle for :data:`SETTLED_S`)."""
    tick = 1 / os.sysconf("SC_CLK_TCK")
    start = last = cpu_seconds(pid)
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        time.sleep(SETTLED_S)
        now = cpu_seconds(pid)
        if now - last <= tick:
            return last - start
        last = now
    raise RuntimeError(f"process {pid} was still busy {deadline_s:g} s after its first answer")


def stdio_replay_command(db: Path, server: str, index_dir: Path | None = None) -> list[str]:
    """``replay-sim serve --stdio --server SERVER`` on ``db``, as an agent framework runs it."""
    command = [sys.executable, "-m", "replay_sim", "serve", "--stdio", "--server", server, "--db", str(db)]
    return command + ([] if index_dir is None else ["--index-dir", str(index_dir)])


def stdio_first_answer(
    command: Sequence[str], tool: str, arguments: dict[str, Any]
) -> tuple[float, float, float]:
    """Seconds from spawning a stdio server until its answer to one ``tools/call``, the CPU seconds it
    used until then, and its warm-up CPU seconds after it.

    Raises:
        RuntimeError: The server exited without answering, or a replay's answer was not an exact hit.
    """
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "b", "version": "0"}}
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": arguments}},
    ]
    lines = b"".join(json.dumps(m).encode() + b"\n" for m in messages)
    started = time.perf_counter()
    process = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write(lines)
        process.stdin.flush()
        while True:
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"{command[2:5]}: exited without answering (status {process.wait()})")
            answer = json.loads(line)
            if answer.get("id") == 2:
                break
        elapsed = time.perf_counter() - started
        match = (answer.get("result") or {}).get("_meta", {}).get("replay-sim/match")
        if match is not None and match.get("status") != "exact":
            raise RuntimeError(f"the first answer was not an exact hit: {match}")
        used = cpu_seconds(process.pid)
        return elapsed, used, warm_up_cpu(process.pid)
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def compare_stdio(
    db: Path, index_dir: Path | None, server: str, tool: str, arguments: dict[str, Any], rounds: int = ROUNDS
) -> dict[str, float]:
    """Start to first answer over stdio, replay and bare SDK server interleaved, and warm-up CPU.

    Returns:
        Medians: ``bare``, ``replay`` (seconds to the first answer), ``bare_start_cpu``,
        ``replay_start_cpu`` (CPU seconds until then), ``bare_cpu``, ``replay_cpu`` (warm-up CPU
        seconds after it), and the replay's first round (``replay_first``).
    """
    times: dict[str, list[tuple[float, float, float]]] = {"bare": [], "replay": []}
    for _ in range(rounds):
        times["bare"].append(stdio_first_answer([sys.executable, "-c", BARE_STDIO_SERVER], "echo", {}))
        command = stdio_replay_command(db, server, index_dir)
        times["replay"].append(stdio_first_answer(command, tool, arguments))
    found = {kind: statistics.median(t for t, _, _ in runs) for kind, runs in times.items()}
    start = {f"{kind}_start_cpu": statistics.median(c for _, c, _ in runs) for kind, runs in times.items()}
    cpu = {f"{kind}_cpu": statistics.median(c for _, _, c in runs) for kind, runs in times.items()}
    return {**found, **start, **cpu, "replay_first": times["replay"][0][0]}


def replay_command(db: Path, index_dir: Path | None = None) -> list[str]:
    """``replay-sim serve --port 0`` on ``db``, as a user runs it."""
    command = [sys.executable, "-m", "replay_sim", "serve", "--db", str(db), "--port", "0"]
    return command + ([] if index_dir is None else ["--index-dir", str(index_dir)])


def bare_command() -> list[str]:
    """The baseline: a bare SDK server in a fresh interpreter."""
    return [sys.executable, "-c", BARE_SERVER]


def _lines(stream: Any, out: queue.Queue[str]) -> None:
    for line in iter(stream.readline, ""):
        out.put(line)


async def _first_call(url: str, tool: str, arguments: dict[str, Any], deadline: float) -> dict[str, Any]:
    """Call until the server answers (the socket listens before the app is up); returns ``_meta``."""
    while True:
        try:
            async with Client(url, mode="legacy") as client:
                result = await client.call_tool(tool, arguments)
                return dict(result.meta or {})
        except (httpx2.TransportError, OSError):
            if time.monotonic() > deadline:
                raise
            await anyio.sleep(0.01)


def first_answer(
    command: Sequence[str],
    tool: str,
    arguments: dict[str, Any],
    *,
    server: str | None = None,
    cpu: list[float] | None = None,
) -> float:
    """Seconds from spawning ``command`` until the first answer to one ``tools/call``.

    Args:
        command: The server's command line; it prints ``.../mcp/<server>`` on stderr once listening.
        tool: The tool to call.
        arguments: Its arguments (a recorded call, for the replay).
        server: Which printed endpoint to call (the first one when None).
        cpu: Where to append the server's CPU seconds until the first answer and its warm-up CPU
            seconds after it (not measured when None).

    Raises:
        RuntimeError: The server exited or printed no URL within a minute, or a replay's answer was
            not an exact hit.
    """
    lines: queue.Queue[str] = queue.Queue()
    started = time.perf_counter()
    process = subprocess.Popen(list(command), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        threading.Thread(target=_lines, args=(process.stderr, lines), daemon=True).start()
        deadline = time.monotonic() + 60
        url = None
        while url is None:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"{command[2:4]}: no URL printed within a minute") from None
            found = URL_LINE.search(line)
            if found and (server is None or found.group(2) == server):
                url = f"{found.group(1)}/mcp/{found.group(2)}"
        meta = anyio.run(_first_call, url, tool, arguments, deadline)
        elapsed = time.perf_counter() - started
        match = meta.get("replay-sim/match")
        if match is not None and match.get("status") != "exact":
            raise RuntimeError(f"the first answer was not an exact hit: {match}")
        if cpu is not None:
            cpu += [cpu_seconds(process.pid), warm_up_cpu(process.pid)]
        return elapsed
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def compare(
    db: Path,
    index_dir: Path | None,
    server: str,
    tool: str,
    arguments: dict[str, Any],
    rounds: int = ROUNDS,
) -> dict[str, float]:
    """Start to first answer of the replay and of the bare server, interleaved.

    Returns:
        The median of each (``bare``, ``replay``), of each one's CPU seconds until the first answer
        (``bare_start_cpu``, ``replay_start_cpu``) and after it, its warm-up (``bare_cpu``,
        ``replay_cpu``), and the replay's first round (``replay_first``).
    """
    times: dict[str, list[float]] = {"bare": [], "replay": []}
    cpu: dict[str, list[float]] = {"bare": [], "replay": []}
    for _ in range(rounds):
        times["bare"].append(first_answer(bare_command(), "echo", {"message": "hi"}, cpu=cpu["bare"]))
        times["replay"].append(
            first_answer(replay_command(db, index_dir), tool, arguments, server=server, cpu=cpu["replay"])
        )
    found = {kind: statistics.median(found) for kind, found in times.items()}
    start = {f"{kind}_start_cpu": statistics.median(found[0::2]) for kind, found in cpu.items()}
    used = {f"{kind}_cpu": statistics.median(found[1::2]) for kind, found in cpu.items()}
    return {**found, **start, **used, "replay_first": times["replay"][0]}


def report(found: dict[str, float], stdio: dict[str, float], recordings: str) -> None:
    """Print the HTTP and stdio start-up figures of one store beside the bare SDK servers'."""
    for face, numbers, target in (("HTTP", found, 0.5), ("stdio", stdio, 0.3)):
        print(
            f"   {face}: start to first exact answer {numbers['replay']:.2f} s vs bare SDK server "
            f"{numbers['bare']:.2f} s (ratio {numbers['replay'] / numbers['bare']:.2f}; target <= "
            f"{target} s); {recordings}, median of {ROUNDS}; the first start after the build: "
            f"{numbers['replay_first']:.2f} s; CPU until the first answer "
            f"{numbers['replay_start_cpu']:.2f} s vs {numbers['bare_start_cpu']:.2f} s bare; warm-up CPU "
            f"after it {numbers['replay_cpu']:.2f} s (bare {numbers['bare_cpu']:.2f} s)"
        )


def main() -> None:
    """A 1,000-recording store (index built first): replay vs bare SDK start, over HTTP and stdio."""
    from bench.scale import generate, recorded_calls
    from replay_sim.resolve.build import build_index
    from replay_sim.resolve.tooleffects import keep_effects

    with tempfile.TemporaryDirectory() as tmp:
        db, index_dir = Path(tmp) / "small.db", Path(tmp) / "index"
        store = generate(db, 1000)
        build_index(store, directory=index_dir)
        keep_effects(store)  # as `replay-sim index build` does
        ((server, params),) = recorded_calls(store, 1)
        store.close()
        found = compare(db, index_dir, server, params["name"], params["arguments"])
        stdio = compare_stdio(db, index_dir, server, params["name"], params["arguments"])
    report(found, stdio, "1,000 recordings")


if __name__ == "__main__":
    main()
