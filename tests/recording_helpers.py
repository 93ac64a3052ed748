"""Helpers for the recorder tests: real servers, real processes, raw MCP clients, no sleeps."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from anyio.streams.text import TextReceiveStream
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from pydantic import TypeAdapter

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
BIN = Path(PYTHON).parent
ECHO_SERVER = ROOT / "fixtures" / "echo_server.py"
NODE_BIN = ROOT / "fixtures" / "node_modules" / ".bin"
REPLAY_SIM = str(BIN / "replay-sim")

_RAW = TypeAdapter(dict[str, Any])
_REQUESTS: dict[str, type[Any]] = {
    "tools/call": types.CallToolRequest,
    "resources/read": types.ReadResourceRequest,
    "prompts/get": types.GetPromptRequest,
    "completion/complete": types.CompleteRequest,
    "tools/list": types.ListToolsRequest,
    "resources/list": types.ListResourcesRequest,
    "resources/templates/list": types.ListResourceTemplatesRequest,
    "prompts/list": types.ListPromptsRequest,
}

Script = list[tuple[str, dict[str, Any]]]


def step(name: str, **arguments: Any) -> tuple[str, dict[str, Any]]:
    """A ``tools/call`` step of a :data:`Script`."""
    return "tools/call", {"name": name, "arguments": arguments}


def stdio(command: str | Path, *args: str | Path, env: dict[str, str] | None = None) -> StdioServerParameters:
    """Stdio server parameters for a command."""
    return StdioServerParameters(command=str(command), args=[str(a) for a in args], env=env)


def proxy_stdio(db: Path, name: str, command: Iterable[str | Path], *options: str) -> StdioServerParameters:
    """Launch ``replay-sim record`` (the real CLI) over stdio in front of ``command``."""
    return stdio(
        REPLAY_SIM, "record", "--db", str(db), "--name", name, *options, "--", *[str(c) for c in command]
    )


@asynccontextmanager
async def raw_client(target: StdioServerParameters | str | Any) -> AsyncIterator[Client]:
    """A handshake-era SDK client with the response cache off."""
    async with Client(target, mode="legacy", cache=None) as client:
        yield client


async def raw_request(client: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Send one request and return the result as wire JSON (an error as ``{"error": {...}}``)."""
    request = _REQUESTS[method].model_validate({"method": method, "params": params})
    try:
        return await client.session.send_request(request, _RAW)  # type: ignore[arg-type]
    except Exception as exc:  # MCPError: keep code/message for comparison
        error = getattr(exc, "error", None)
        if error is None:
            raise
        return {"error": {"code": error.code, "message": error.message}}


async def run_script(target: StdioServerParameters | str | Any, script: Script) -> list[dict[str, Any]]:
    """Run a scripted session against a server; every answer in order."""
    with anyio.fail_after(60):
        async with raw_client(target) as client:
            return [await raw_request(client, method, params) for method, params in script]


HUNG = 600
"""Seconds after which a process that neither prints the awaited line nor exits counts as hung.

Not a start-up time: a process is waited for until it says it is ready or it exits, however busy
the machine; this only ends a test whose process hangs."""


class Process:
    """A subprocess whose stderr/stdout lines can be awaited (until printed, or the process ends)."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._changed = anyio.Event()
        self._open = 2  # stdout and stderr, until each reaches its end

    def _said(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def pump(self, stream: Any) -> None:
        buffer = ""
        async for chunk in TextReceiveStream(stream, errors="replace"):
            buffer += chunk
            *complete, buffer = buffer.split("\n")
            self.lines.extend(complete)
            self._said()
        if buffer:
            self.lines.append(buffer)
        self._open -= 1
        self._said()

    async def wait_for(self, pattern: str, timeout: float = HUNG) -> re.Match[str]:
        """The first output line matching ``pattern``, waiting until it is printed or the process ends."""
        regex = re.compile(pattern)
        with anyio.fail_after(timeout):
            while True:
                for line in self.lines:
                    if match := regex.search(line):
                        return match
                if self._open == 0 or self.process.returncode is not None:
                    raise AssertionError(
                        f"process exited ({self.process.returncode}):\n" + "\n".join(self.lines)
                    )
                await self._changed.wait()

    async def finished(self, timeout: float = HUNG) -> list[str]:
        """Every line the process printed, once it has closed its output (exited)."""
        with anyio.fail_after(timeout):
            while self._open:
                await self._changed.wait()
        return self.lines


@asynccontextmanager
async def spawn(*command: str | Path, env: dict[str, str] | None = None) -> AsyncIterator[Process]:
    """Run a process, collecting stdout and stderr lines; killed on exit."""
    full_env = {**os.environ, **(env or {})}
    async with await anyio.open_process([str(c) for c in command], env=full_env) as process:
        watched = Process(process)
        async with anyio.create_task_group() as tg:
            tg.start_soon(watched.pump, process.stdout)
            tg.start_soon(watched.pump, process.stderr)
            try:
                yield watched
            finally:
                if process.returncode is None:
                    process.kill()
                with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                    await process.wait()
                tg.cancel_scope.cancel()


@asynccontextmanager
async def echo_http() -> AsyncIterator[str]:
    """Serve fixtures/echo_server.py over streamable HTTP on 127.0.0.1; yields its URL."""
    async with spawn(PYTHON, ECHO_SERVER, "--http", "--port", "0") as process:
        match = await process.wait_for(r"(http://127\.0\.0\.1:\d+/mcp)")
        yield match.group(1)


@asynccontextmanager
async def proxy_http(db: Path, *arguments: str | Path) -> AsyncIterator[tuple[str, Process]]:
    """Run ``replay-sim record --http 127.0.0.1:0`` (the real CLI); yields its base URL and process."""
    async with spawn(REPLAY_SIM, "record", "--db", str(db), "--http", "127.0.0.1:0", *arguments) as process:
        match = await process.wait_for(r"^listening on (http://127\.0\.0\.1:\d+)$")
        yield match.group(1), process
