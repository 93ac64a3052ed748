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

With the other MCP replayers installed (:mod:`bench._peers`), each one's replay of its own recording
of the bare server runs in the same rounds, started and asked by the same client: mcp-rec and
mcp-cassette over stdio, mcp-cassette and mcp-recorder over HTTP.

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

from bench._peers import PEER_ENV, free_port, peers_bin, record_http, wait_listening, write_script

URL_LINE = re.compile(r"(https?://\S+?)/mcp/(\S+)")
ROUNDS = 3

_BARE_SDK_SERVER = """
import mcp_types as types
from mcp.server import Server

RESULT = {"content": [{"type": "text", "text": "hello"}], "isError": False}
TOOL = {"name": "echo", "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}}}

async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[types.Tool.model_validate(TOOL)])

async def call_tool(ctx, params):
    return types.CallToolResult.model_validate(RESULT)

server = Server("bare", version="1", on_list_tools=list_tools, on_call_tool=call_tool)
"""
"""The bare MCP SDK server both baselines run: one tool answering a constant."""

BARE_SERVER = (
    _BARE_SDK_SERVER
    + """
import socket, sys
import uvicorn

app = server.streamable_http_app(streamable_http_path="/mcp/bare")
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(128)
print(f"replaying bare at http://127.0.0.1:{sock.getsockname()[1]}/mcp/bare", file=sys.stderr, flush=True)
uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
"""
)

BARE_STDIO_SERVER = (
    _BARE_SDK_SERVER
    + """
import anyio
from mcp.server.stdio import stdio_server

async def main():
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())

anyio.run(main)
"""
)
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
    command: Sequence[str], tool: str, arguments: dict[str, Any], *, warm_up: bool = True
) -> tuple[float, float, float]:
    """Seconds from spawning a stdio server until its answer to one ``tools/call``, the CPU seconds it
    used until then, and its warm-up CPU seconds after it (0 when ``warm_up`` is false: a recorder
    run by :func:`stdio_peers` only has to pass the exchange through).

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
    process = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=PEER_ENV)
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write(lines)
        process.stdin.flush()
        while True:
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"{command[:5]}: exited without answering (status {process.wait()})")
            answer = json.loads(line)
            if answer.get("id") == 2:
                break
        elapsed = time.perf_counter() - started
        if "result" not in answer:
            raise RuntimeError(f"{command[:5]}: the first answer was an error: {answer}")
        match = answer["result"].get("_meta", {}).get("replay-sim/match")
        if match is not None and match.get("status") != "exact":
            raise RuntimeError(f"the first answer was not an exact hit: {match}")
        used = cpu_seconds(process.pid)
        return elapsed, used, (warm_up_cpu(process.pid) if warm_up else 0.0)
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def stdio_peers(directory: Path, found: Path) -> dict[str, list[str]]:
    """The stdio peers' replay commands, each on its own recording of the bare SDK stdio server.

    Each peer's recorder runs the bare server once, passing one exchange through (the same three
    lines :func:`stdio_first_answer` writes); ``found`` is the peers' ``bin`` directory.
    """
    bare = [sys.executable, str(write_script(directory, "bare_stdio.py", BARE_STDIO_SERVER))]
    rec, cassette = directory / "mcp-rec.jsonl", directory / "mcp-cassette-stdio.json"
    stdio_first_answer(
        [str(found / "mcp-rec"), "record", "-o", str(rec), "--", *bare], "echo", {}, warm_up=False
    )
    stdio_first_answer(
        [str(found / "mcp-cassette"), "record", "--cassette", str(cassette), "--", *bare],
        "echo",
        {},
        warm_up=False,
    )
    return {
        "mcp-rec": [str(found / "mcp-rec"), "replay", str(rec)],
        "mcp-cassette": [str(found / "mcp-cassette"), "serve", str(cassette)],
    }


def http_peers(directory: Path, found: Path) -> dict[str, tuple[list[str], str]]:
    """The HTTP peers' replay commands and URLs, each on its recording of the bare SDK server.

    mcp-recorder records through its HTTP proxy in front of the bare stdio server, mcp-cassette
    through its proxy in front of the bare HTTP server, one exchange each of the same client
    :func:`first_answer` uses; ``found`` is the peers' ``bin`` directory.
    """
    bare = f"{sys.executable} {write_script(directory, 'bare_stdio.py', BARE_STDIO_SERVER)}"
    cassette, port = directory / "mcp-recorder.json", free_port()
    record = [str(found / "mcp-recorder"), "record", "--target-stdio", bare, "--port", str(port)]

    async def call(url: str, deadline: float) -> None:
        await _first_call(url, "echo", {}, deadline)

    record_http([*record, "--output", str(cassette)], f"http://127.0.0.1:{port}/mcp", call)
    peers = {}
    port = free_port()
    replay = [str(found / "mcp-recorder"), "replay", "--cassette", str(cassette), "--port", str(port)]
    peers["mcp-recorder"] = (replay, f"http://127.0.0.1:{port}/mcp")

    bare_server = subprocess.Popen(bare_command(), stderr=subprocess.PIPE, text=True)
    try:
        assert bare_server.stderr is not None
        while (line := bare_server.stderr.readline()) and not URL_LINE.search(line):
            pass
        found_url = URL_LINE.search(line)
        if found_url is None:
            raise RuntimeError(f"the bare SDK server printed no URL (status {bare_server.wait()})")
        cassette, port = directory / "mcp-cassette-http.json", free_port()
        record = [str(found / "mcp-cassette"), "record", "--cassette", str(cassette), "--port", str(port)]
        record_http([*record, "--url", found_url.group(0)], f"http://127.0.0.1:{port}/mcp", call)
    finally:
        bare_server.terminate()
        bare_server.wait()
    port = free_port()
    replay = [str(found / "mcp-cassette"), "serve", str(cassette), "--port", str(port)]
    peers["mcp-cassette"] = (replay, f"http://127.0.0.1:{port}/mcp")
    return peers


def compare_stdio(
    db: Path,
    index_dir: Path | None,
    server: str,
    tool: str,
    arguments: dict[str, Any],
    rounds: int = ROUNDS,
    peers: dict[str, list[str]] | None = None,
) -> dict[str, float]:
    """Start to first answer over stdio, replay, bare SDK server and ``peers`` interleaved, and warm-up CPU.

    Returns:
        Medians: ``bare``, ``replay`` and each peer's name (seconds to the first answer),
        ``<kind>_start_cpu`` (CPU seconds until then), ``<kind>_cpu`` (warm-up CPU seconds after it),
        and the replay's first round (``replay_first``).
    """
    peers = peers or {}
    times: dict[str, list[tuple[float, float, float]]] = {"bare": [], "replay": [], **{p: [] for p in peers}}
    for _ in range(rounds):
        times["bare"].append(stdio_first_answer([sys.executable, "-c", BARE_STDIO_SERVER], "echo", {}))
        command = stdio_replay_command(db, server, index_dir)
        times["replay"].append(stdio_first_answer(command, tool, arguments))
        for name, peer in peers.items():
            times[name].append(stdio_first_answer(peer, "echo", {}))
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
    url: str | None = None,
) -> float:
    """Seconds from spawning ``command`` until the first answer to one ``tools/call``.

    Args:
        command: The server's command line; it prints ``.../mcp/<server>`` on stderr once listening.
        tool: The tool to call.
        arguments: Its arguments (a recorded call, for the replay).
        server: Which printed endpoint to call (the first one when None).
        cpu: Where to append the server's CPU seconds until the first answer and its warm-up CPU
            seconds after it (not measured when None).
        url: Where the server will listen, for a peer that prints no ``.../mcp/<server>`` URL (it
            is then called until it answers).

    Raises:
        RuntimeError: The server exited or printed no URL within a minute, or a replay's answer was
            not an exact hit.
    """
    lines: queue.Queue[str] = queue.Queue()
    started = time.perf_counter()
    process = subprocess.Popen(
        list(command), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=PEER_ENV
    )
    try:
        threading.Thread(target=_lines, args=(process.stderr, lines), daemon=True).start()
        deadline = time.monotonic() + 60
        while url is None:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"{command[2:4]}: no URL printed within a minute") from None
            found = URL_LINE.search(line)
            if found and (server is None or found.group(2) == server):
                url = f"{found.group(1)}/mcp/{found.group(2)}"
        wait_listening(url, deadline)
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
    peers: dict[str, tuple[list[str], str]] | None = None,
) -> dict[str, float]:
    """Start to first answer of the replay, the bare server and ``peers`` (command, URL), interleaved.

    Returns:
        The median of each (``bare``, ``replay``, each peer's name), of each one's CPU seconds until
        the first answer (``<kind>_start_cpu``) and after it, its warm-up (``<kind>_cpu``), and the
        replay's first round (``replay_first``).
    """
    peers = peers or {}
    times: dict[str, list[float]] = {"bare": [], "replay": [], **{p: [] for p in peers}}
    cpu: dict[str, list[float]] = {kind: [] for kind in times}
    for _ in range(rounds):
        times["bare"].append(first_answer(bare_command(), "echo", {"message": "hi"}, cpu=cpu["bare"]))
        times["replay"].append(
            first_answer(replay_command(db, index_dir), tool, arguments, server=server, cpu=cpu["replay"])
        )
        for name, (peer, url) in peers.items():
            times[name].append(first_answer(peer, "echo", {}, cpu=cpu[name], url=url))
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
        peers = {kind: numbers[kind] for kind in numbers if kind.startswith("mcp-") and "_" not in kind}
        for name, seconds in sorted(peers.items(), key=lambda item: item[1]):
            print(
                f"   {face}: peer {name} (its recording of the bare server) {seconds:.2f} s: replay-sim "
                f"{numbers['replay'] / seconds:.2f}x; CPU until its first answer "
                f"{numbers[f'{name}_start_cpu']:.2f} s"
            )


def main() -> None:
    """A 1,000-recording store (index built first): replay vs bare SDK start, over HTTP and stdio."""
    from bench.scale import generate, recorded_calls
    from replay_sim.replay.stdio.start.write import write_start_table
    from replay_sim.resolve.build import build_index
    from replay_sim.resolve.tooleffects import keep_effects

    with tempfile.TemporaryDirectory() as tmp:
        db, index_dir = Path(tmp) / "small.db", Path(tmp) / "index"
        store = generate(db, 1000)
        build_index(store, directory=index_dir)
        keep_effects(store)  # as `replay-sim index build` does
        ((server, params),) = recorded_calls(store, 1)
        store.close()
        write_start_table(db, index_dir)  # as `replay-sim index build` does
        peers = peers_bin()
        http = {} if peers is None else http_peers(Path(tmp), peers)
        stdio_ = {} if peers is None else stdio_peers(Path(tmp), peers)
        found = compare(db, index_dir, server, params["name"], params["arguments"], peers=http)
        stdio = compare_stdio(db, index_dir, server, params["name"], params["arguments"], peers=stdio_)
    report(found, stdio, "1,000 recordings")


if __name__ == "__main__":
    main()
