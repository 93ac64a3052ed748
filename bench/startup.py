"""Start to first exact answer: ``replay-sim serve`` through the real CLI, versus a bare SDK server.

Each server runs as a fresh subprocess on a free port (``--port 0``; the URL is read from what it
prints); the clock runs from just before the process is spawned until a real MCP client (handshake
era: ``initialize``, then ``tools/call``) has the first answer, and for the replay that answer must
be an exact hit. The baseline is a bare MCP SDK server (its default streamable HTTP app) answering
a constant, started the same way in the same run. Rounds are interleaved; medians are reported.

The first replay start after new recordings learns the servers' tool effects and keeps them in the
store (:func:`replay_sim.resolve.tooleffects.remembered_effects`), unless ``replay-sim index build``
kept them already (:func:`~replay_sim.resolve.tooleffects.keep_effects`, as :func:`main` and
:mod:`bench.scale` do after their builds); later starts read them back. The first round is the
first start after the build, and is reported on its own too.

Run with ``python -m bench startup``; :mod:`bench.scale` uses :func:`first_answer` on its
100,000-recording store.
"""

from __future__ import annotations

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
    command: Sequence[str], tool: str, arguments: dict[str, Any], *, server: str | None = None
) -> float:
    """Seconds from spawning ``command`` until the first answer to one ``tools/call``.

    Args:
        command: The server's command line; it prints ``.../mcp/<server>`` on stderr once listening.
        tool: The tool to call.
        arguments: Its arguments (a recorded call, for the replay).
        server: Which printed endpoint to call (the first one when None).

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
        The median of each (``bare``, ``replay``), and the replay's first round (``replay_first``).
    """
    times: dict[str, list[float]] = {"bare": [], "replay": []}
    for _ in range(rounds):
        times["bare"].append(first_answer(bare_command(), "echo", {"message": "hi"}))
        times["replay"].append(first_answer(replay_command(db, index_dir), tool, arguments, server=server))
    found = {kind: statistics.median(found) for kind, found in times.items()}
    return {**found, "replay_first": times["replay"][0]}


def main() -> None:
    """A 1,000-recording generated store (index built first): replay start vs bare SDK start."""
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
    print(
        f"   start to first exact answer: replay-sim serve {found['replay']:.2f} s, bare SDK server "
        f"{found['bare']:.2f} s (ratio {found['replay'] / found['bare']:.2f}); 1,000 recordings, "
        f"median of {ROUNDS}; the first start after the build: {found['replay_first']:.2f} s"
    )


if __name__ == "__main__":
    main()
