"""The stdio transport under bad input, through real processes: ``replay-sim serve --stdio`` and the
recorder's stdio face (``replay-sim record -- CMD``), which share it.

A line that is not JSON (or nests deeper than 201 levels) gets a ``-32700`` answer, a line that
is not a JSON-RPC message ``-32600``, a line over the length cap an error naming the cap — and the
session goes on. Long lines are read in time linear in their length, so a 20 MB line is just a
request.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from recording_helpers import ECHO_SERVER, PYTHON, REPLAY_SIM
from replay_helpers import build_store

from replay_sim.stdio_transport import MAX_LINE_ENV, LineSplitter, TooLong

pytestmark = pytest.mark.anyio

MiB = 1 << 20


class Wire:
    """A JSON-RPC peer over a process's stdin/stdout, one message per line."""

    def __init__(self, process: anyio.abc.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self.stdin = process.stdin
        self.stdout = process.stdout
        self.buffer = bytearray()

    async def send(self, message: dict[str, Any] | bytes) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode()
        await self.stdin.send(data + b"\n")

    async def receive(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            self.buffer += await self.stdout.receive(1 << 20)
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer = bytearray(rest)
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def request(self, id_: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        await self.send({"jsonrpc": "2.0", "id": id_, "method": method, "params": params or {}})
        return await self.receive()

    async def handshake(self) -> None:
        init = await self.request(
            0,
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        )
        assert "result" in init, init
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})


@asynccontextmanager
async def stdio_peer(tmp_path: Path, face: str, env: dict[str, str] | None = None) -> AsyncIterator[Wire]:
    """A handshaken peer of ``serve --stdio`` (face ``replay``) or ``record -- echo_server`` (``record``)."""
    if face == "replay":
        build_store(tmp_path / "replay.db").close()
        command = [REPLAY_SIM, "serve", "--stdio", "--server", "demo", "--db", str(tmp_path / "replay.db")]
    else:
        command = [REPLAY_SIM, "record", "--db", str(tmp_path / "rec.db"), "--name", "echo", "--"]
        command += [PYTHON, str(ECHO_SERVER)]
    async with await anyio.open_process(command, env={**os.environ, **(env or {})}, stderr=None) as process:
        wire = Wire(process)
        try:
            await wire.handshake()
            yield wire
        finally:
            await wire.stdin.aclose()
            with anyio.move_on_after(30):
                await process.wait()
            if process.returncode is None:
                process.kill()


def _echo(face: str, text: str) -> tuple[dict[str, Any], str]:
    """An echo call's params for ``face`` and its answer's text (the replay's one recorded echo)."""
    if face == "replay":
        return {"name": "echo", "arguments": {"message": "hello"}}, "hello"
    return {"name": "echo", "arguments": {"text": text}}, text


@pytest.mark.parametrize("face", ["replay", "record"])
async def test_a_line_that_is_not_json_gets_a_parse_error_and_the_session_goes_on(
    tmp_path: Path, face: str
) -> None:
    with anyio.fail_after(120):
        async with stdio_peer(tmp_path, face) as wire:
            await wire.send(b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {')
            error = await wire.receive()
            assert error["id"] is None and error["error"]["code"] == -32700, error
            await wire.send(b'{"jsonrpc": "2.0", "id": 8, "method": 5}')  # JSON, not a request
            invalid = await wire.receive()
            assert invalid["id"] == 8 and invalid["error"]["code"] == -32600, invalid
            params, text = _echo(face, "hello")
            answer = await wire.request(9, "tools/call", params)
            assert answer["id"] == 9 and answer["result"]["content"][0]["text"] == text


@pytest.mark.parametrize("face", ["replay", "record"])
async def test_a_20_mb_line_is_just_a_request(tmp_path: Path, face: str) -> None:
    with anyio.fail_after(240):
        async with stdio_peer(tmp_path, face) as wire:
            listed = await wire.request(3, "tools/list", {"_meta": {"padding": "x" * (20 * MiB)}})
            assert listed["id"] == 3 and "echo" in {tool["name"] for tool in listed["result"]["tools"]}


@pytest.mark.parametrize("face", ["replay", "record"])
async def test_an_oversize_line_gets_an_error_naming_the_cap_and_the_next_request_works(
    tmp_path: Path, face: str
) -> None:
    with anyio.fail_after(120):
        async with stdio_peer(tmp_path, face, {MAX_LINE_ENV: str(MiB)}) as wire:
            params = {"name": "echo", "arguments": {"text": "y" * (3 * MiB)}}
            await wire.send({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": params})
            refused = await wire.receive()
            assert refused["id"] == 4 and refused["error"]["code"] == -32600, refused
            assert str(MiB) in refused["error"]["message"] and MAX_LINE_ENV in refused["error"]["message"]
            params, text = _echo(face, "after")
            answer = await wire.request(5, "tools/call", params)
            assert answer["id"] == 5 and answer["result"]["content"][0]["text"] == text


@pytest.mark.parametrize(
    ("chunks", "cap", "expected"),
    [
        ([b"a\nb", b"c\n"], 10, [b"a", b"bc"]),
        ([b"ab", b"cd", b"ef\n", b"g\n"], 4, [TooLong(6, b"abcdef"), b"g"]),  # dropped over many chunks
        ([b"abcdef", b"gh", b"\nxy\n"], 4, [TooLong(8, b"abcdefgh"), b"xy"]),
        ([b"abcd\n"], 4, [b"abcd"]),  # exactly the cap is allowed
        ([b"\n\n", b"z"], 4, [b"", b""]),  # an unfinished line waits for its newline
    ],
)
def test_the_line_splitter_frames_lines_across_chunks_and_drops_long_ones(
    chunks: list[bytes], cap: int, expected: list[bytes | TooLong]
) -> None:
    splitter = LineSplitter(cap)
    assert [line for chunk in chunks for line in splitter.feed(chunk)] == expected


@pytest.mark.parametrize("face", ["replay", "record"])
async def test_a_2_kb_line_nested_1100_deep_gets_a_parse_error_and_the_process_lives_on(
    tmp_path: Path, face: str
) -> None:
    deep = b"[" * 1_100 + b"]" * 1_100
    line = b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "echo", "arguments": '
    with anyio.fail_after(120):
        async with stdio_peer(tmp_path, face) as wire:
            await wire.send(line + b'{"text": ' + deep + b"}}}")
            error = await wire.receive()
            assert error["id"] is None and error["error"]["code"] == -32700, error
            assert "nested deeper than 201 levels" in error["error"]["message"]
            params, text = _echo(face, "after")
            answer = await wire.request(8, "tools/call", params)
            assert answer["id"] == 8 and answer["result"]["content"][0]["text"] == text


@pytest.mark.parametrize("face", ["replay", "record"])
def test_a_stdin_no_selector_can_poll_ends_the_session_cleanly(tmp_path: Path, face: str) -> None:
    # /dev/null (or a regular file) is always readable and epoll refuses it: read, do not poll.
    if face == "replay":
        build_store(tmp_path / "replay.db").close()
        command = [REPLAY_SIM, "serve", "--stdio", "--server", "demo", "--db", str(tmp_path / "replay.db")]
    else:
        command = [REPLAY_SIM, "record", "--db", str(tmp_path / "rec.db"), "--name", "echo", "--"]
        command += [PYTHON, str(ECHO_SERVER)]
    ran = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr[-2000:]
