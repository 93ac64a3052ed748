"""Every HTTP server we run (issue 20, items 1, 6, 7, 8; issue 29, item 3): connections are kept
past every client's keep-alive, half-sent headers time out, open connections stay below the
descriptor limit, nothing is logged per request, and one line says when it is ready. Real
``replay-sim serve`` and ``record --http`` processes, raw sockets on 127.0.0.1."""

from __future__ import annotations

import signal
from pathlib import Path

import anyio
import anyio.abc
import pytest
from recording_helpers import ECHO_SERVER, PYTHON, REPLAY_SIM, Process, spawn
from replay_helpers import build_store, make_replay

from replay_sim.httpserver import HttpOptions, connection_budget
from replay_sim.listener import serving_in_thread
from replay_sim.replay.http.app import create_app

pytestmark = pytest.mark.anyio

LISTENING = r"^listening on (http://127\.0\.0\.1:(\d+))$"
GAPS = [4.5 + 0.1 * i for i in range(16)]
"""Idle seconds before a connection is reused: the band around httpx's (the MCP SDK's) 5 s expiry."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _serve(tmp_path: Path, *options: str) -> list[str | Path]:
    """``replay-sim serve`` of a small store on a free port: exact and canonical tiers only, so it is
    ready without loading the model (these tests are about the transport)."""
    build_store(tmp_path / "serve.db").close()
    (tmp_path / "match.toml").write_text("[defaults]\nsemantic = false\n")
    db, config = tmp_path / "serve.db", tmp_path / "match.toml"
    return [REPLAY_SIM, "serve", "--db", db, "--match-config", config, "--port", "0", *options]


async def _exchange(stream: anyio.abc.ByteStream, request: bytes) -> int:
    """Send one request on an open connection and read its whole answer; its status code."""
    await stream.send(request)
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive()  # EndOfStream / BrokenResourceError: the server closed it
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    while len(body) < length:
        body += await stream.receive()
    return int(lines[0].split()[1])


async def _reused_after(port: int, gap: float, path: str) -> tuple[int, int]:
    """One connection: a request, ``gap`` idle seconds, a second request on the same connection."""
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        first = await _exchange(stream, request)
        await anyio.sleep(gap)  # the idle time under test, not a wait for something
        return first, await _exchange(stream, request)


async def _reuse_across_the_band(port: int, path: str) -> list[object]:
    outcomes: list[object] = [None] * len(GAPS)

    async def one(i: int) -> None:
        try:
            outcomes[i] = await _reused_after(port, GAPS[i], path)
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError) as exc:
            outcomes[i] = f"gap {GAPS[i]:.1f} s: {type(exc).__name__}"

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(len(GAPS)):
                tg.start_soon(one, i)
    return outcomes


async def _stopped(process: Process) -> list[str]:
    """Stop a server with SIGTERM; every line it printed."""
    process.process.send_signal(signal.SIGTERM)
    return await process.finished()


async def test_serve_keeps_connections_across_the_keep_alive_band_and_prints_only_its_listening_line(
    tmp_path: Path,
) -> None:
    async with spawn(*_serve(tmp_path)) as process:
        match = await process.wait_for(LISTENING)
        outcomes = await _reuse_across_the_band(int(match.group(2)), "/api/health")
        assert outcomes == [(200, 200)] * len(GAPS)
        said = await _stopped(process)
    assert [line for line in said if "listening on" in line] == [f"listening on {match.group(1)}"]
    assert not any("HTTP/1.1" in line for line in said)  # no access-log line for its 32 requests


async def test_the_http_recorder_keeps_connections_across_the_keep_alive_band(tmp_path: Path) -> None:
    command = [REPLAY_SIM, "record", "--db", tmp_path / "r.db", "--http", "127.0.0.1:0", "--name", "echo"]
    async with spawn(*command, "--", PYTHON, ECHO_SERVER) as process:
        match = await process.wait_for(LISTENING)
        outcomes = await _reuse_across_the_band(int(match.group(2)), "/nowhere")  # 404: still kept alive
        assert outcomes == [(404, 404)] * len(GAPS)


async def test_serve_logs_each_request_only_when_asked(tmp_path: Path) -> None:
    async with spawn(*_serve(tmp_path, "--access-log", "--log-level", "info")) as process:
        port = int((await process.wait_for(LISTENING)).group(2))
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            request = f"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
            assert await _exchange(stream, request) == 200
        await process.wait_for(r'"GET /api/health HTTP/1\.1" 200')


async def test_half_sent_request_headers_get_408_and_a_real_request_is_answered_meanwhile(
    tmp_path: Path,
) -> None:
    async with spawn(*_serve(tmp_path, "--body-timeout", "1")) as process:
        port = int((await process.wait_for(LISTENING)).group(2))
        half = f"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ".encode()  # never ends
        answers: list[bytes] = []

        async def half_sent(stream: anyio.abc.ByteStream) -> None:
            data = b""
            try:
                while True:
                    data += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                answers.append(data)  # the server answered and closed the connection

        with anyio.fail_after(60):
            streams = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(200)]
            async with anyio.create_task_group() as tg:
                for stream in streams:
                    await stream.send(half)
                    tg.start_soon(half_sent, stream)
                async with await anyio.connect_tcp("127.0.0.1", port) as real:
                    request = f"GET /api/ready HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
                    assert await _exchange(real, request) == 200
            for stream in streams:
                await stream.aclose()
        assert len(answers) == 200
        assert all(a.startswith(b"HTTP/1.1 408 ") and b"connection: close" in a for a in answers)


# -- issue 29, item 3: descriptors bounded below the process's limit -------------------------------

NOFILE = 256
"""The descriptor limit of the server under test (``ulimit -n``), set in the child before it starts."""
LIMITED = (
    "import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]),) * 2); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)


async def _answer(port: int, path: str) -> bytes:
    """What the server answers a whole GET on a new connection (until it closes or answers)."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode()
        )
        data = b""
        try:
            while chunk := await stream.receive():
                data += chunk
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            pass
        return data


async def test_a_flood_of_half_sent_requests_past_the_descriptor_limit_is_refused_and_the_server_stays_up(
    tmp_path: Path,
) -> None:
    command = _serve(tmp_path, "--body-timeout", "300")  # half-sent headers are held five minutes
    async with spawn(PYTHON, "-c", LIMITED, str(NOFILE), *command) as process:
        port = int((await process.wait_for(LISTENING)).group(2))
        half = f"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ".encode()  # never ends
        flood = []
        try:
            with anyio.fail_after(60):
                for _ in range(NOFILE + 100):
                    stream = await anyio.connect_tcp("127.0.0.1", port)
                    flood.append(stream)
                    await stream.send(half)
                # at the bound a new connection is answered 503 at once, not left unaccepted
                refused = await _answer(port, "/api/health")
            assert refused.startswith(b"HTTP/1.1 503 "), refused[:200]
            assert b"retry-after: 1" in refused.lower() and b"too many open connections" in refused
            assert process.process.returncode is None  # still up
        finally:
            for stream in flood:
                await stream.aclose()
        with anyio.fail_after(60):  # once the flood's connections end, it answers as before
            while not (answer := await _answer(port, "/api/health")).startswith(b"HTTP/1.1 200 "):
                assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
                await anyio.sleep(0.05)
        assert process.process.returncode is None
        said = await _stopped(process)
    assert not any("Traceback" in line or "Too many open files" in line for line in said), said


async def test_a_connection_past_max_connections_gets_503_and_the_others_are_served(tmp_path: Path) -> None:
    bound, batch = connection_budget()
    assert bound > 0 and 16 <= batch <= 2048 and connection_budget(4)[0] == 4
    app = create_app(make_replay(tmp_path / "bound.db"))
    with serving_in_thread(app, options=HttpOptions(max_connections=4)) as url:
        port = int(url.rsplit(":", 1)[1])
        request = f"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        with anyio.fail_after(60):
            held = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(4)]
            try:
                for stream in held:  # answered: each connection is open and kept alive
                    assert await _exchange(stream, request) == 200
                assert (await _answer(port, "/api/health")).startswith(b"HTTP/1.1 503 ")
                assert await _exchange(held[0], request) == 200  # the open ones go on
            finally:
                for stream in held:
                    await stream.aclose()
            while not (await _answer(port, "/api/health")).startswith(b"HTTP/1.1 200 "):
                await anyio.sleep(0.05)  # until the server has seen the four close
