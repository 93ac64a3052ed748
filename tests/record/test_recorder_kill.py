"""Stopping the recording proxy: a SIGKILL while 8 sessions record loses nothing acknowledged and
leaves a sound file; a SIGTERM stops it cleanly, with every call in the main database file."""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

import anyio
import httpx2
import mcp_types as types
import pytest
from anyio.streams.text import TextReceiveStream
from mcp.shared.exceptions import MCPError
from recording_helpers import ECHO_SERVER, PYTHON, REPLAY_SIM, proxy_http, raw_client

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

SESSIONS = 8
KILL_AFTER = 120  # acknowledged calls, across all sessions, once each session has some


async def test_every_acknowledged_call_survives_a_sigkill_of_the_proxy(tmp_path: Path) -> None:
    db = tmp_path / "kill.db"
    acknowledged: list[str] = []
    per_session = [0] * SESSIONS
    enough = anyio.Event()
    killed = anyio.Event()  # set just before the SIGKILL: no session may fail before it

    async def session(url: str, number: int) -> None:
        try:
            async with raw_client(url) as client:
                for i in range(10_000):
                    text = f"session {number} call {i}"
                    result = await client.call_tool("echo", {"text": text})
                    assert result.content[0].text == text  # a wrong answer fails the test
                    acknowledged.append(text)
                    per_session[number] += 1
                    if len(acknowledged) >= KILL_AFTER and min(per_session) >= 3:
                        enough.set()
        except Exception as exc:
            # The proxy died under us: expected once it is killed, and only as a lost connection.
            if not killed.is_set() or not _connection_lost(exc):
                raise

    with anyio.fail_after(120):
        async with (
            proxy_http(db, "--name", "echo", "--", PYTHON, ECHO_SERVER) as (base, proxy),
            anyio.create_task_group() as tg,
        ):
            for number in range(SESSIONS):
                tg.start_soon(session, f"{base}/mcp/echo", number)
            await enough.wait()
            killed.set()
            proxy.process.send_signal(signal.SIGKILL)
            await proxy.process.wait()
            killed_at = len(acknowledged)
    assert killed_at >= KILL_AFTER
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    rows = conn.execute("SELECT arguments, session FROM calls WHERE result IS NOT NULL").fetchall()
    recorded = {json.loads(arguments)["text"] for arguments, _ in rows}
    missing = [text for text in acknowledged if text not in recorded]
    assert not missing, f"{len(missing)} acknowledged calls are not in the database: {missing[:5]}"
    assert len({s for _, s in rows}) == SESSIONS, "one store session per client session"


def _connection_lost(exc: Exception) -> bool:
    """Whether ``exc`` says the connection to the proxy broke (for a group: every error in it does)."""
    group = exc if isinstance(exc, ExceptionGroup) else ExceptionGroup("", [exc])
    _, other = group.split(_broken_connection)
    return other is None


def _broken_connection(exc: BaseException) -> bool:
    if isinstance(exc, MCPError):
        return exc.error.code == types.CONNECTION_CLOSED  # e.g. "SSE stream ended without a response"
    return isinstance(exc, httpx2.TransportError)  # e.g. ReadError, ConnectError


def _main_file_alone(db: Path, tmp_path: Path) -> list[str]:
    """The texts of the calls the main database file holds by itself (a copy without -wal/-shm)."""
    alone = tmp_path / "alone.db"
    alone.write_bytes(db.read_bytes())
    conn = sqlite3.connect(alone)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return [json.loads(a)["text"] for (a,) in conn.execute("SELECT arguments FROM calls ORDER BY id")]
    finally:
        conn.close()


# What each terminating signal exits with: Ctrl-C keeps its 130; the others stop as a hang-up does.
_EXIT = {signal.SIGTERM: 0, signal.SIGHUP: 0, signal.SIGQUIT: 0, signal.SIGINT: 130}


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
async def test_a_terminating_signal_stops_the_http_recorder_with_everything_in_the_main_file(
    tmp_path: Path, stop: signal.Signals
) -> None:
    db = tmp_path / "term.db"
    with anyio.fail_after(60):
        async with proxy_http(db, "--name", "echo", "--", PYTHON, ECHO_SERVER) as (base, proxy):
            async with raw_client(f"{base}/mcp/echo") as client:
                assert (await client.call_tool("echo", {"text": "kept"})).content[0].text == "kept"
            proxy.process.send_signal(stop)  # SIGTERM: the README's `kill %1`; SIGHUP: a closed terminal
            assert await proxy.process.wait() == _EXIT[stop]
            await proxy.wait_for(f"stopped \\({stop.name}\\)")
    assert not (tmp_path / "term.db-wal").exists()
    assert _main_file_alone(db, tmp_path) == ["kept"]


async def _stop_stdio_recorder(tmp_path: Path, stop: signal.Signals, *launcher: str) -> None:
    """Record one call over stdio, stop the recorder with ``stop``: the call is in the main file."""
    db = tmp_path / "term.db"
    command = [
        *launcher,
        REPLAY_SIM,
        "record",
        "--db",
        str(db),
        "--name",
        "echo",
        "--",
        PYTHON,
        str(ECHO_SERVER),
    ]
    call = {"name": "echo", "arguments": {"text": "kept"}}
    with anyio.fail_after(60):
        async with await anyio.open_process(command) as process:
            assert process.stdin is not None and process.stdout is not None
            lines = TextReceiveStream(process.stdout)
            await process.stdin.send(
                b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
                b'"capabilities":{},"clientInfo":{"name":"t","version":"1"}}}\n'
                b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
                + json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}).encode()
                + b"\n"
            )
            received = ""
            async for chunk in lines:
                received += chunk
                if '"id":2' in received.replace(" ", "") and received.endswith("\n"):
                    break
            assert '"kept"' in received
            process.send_signal(stop)
            assert await process.wait() == _EXIT[stop]
    assert not (tmp_path / "term.db-wal").exists()
    assert _main_file_alone(db, tmp_path) == ["kept"]


@pytest.mark.parametrize(
    "stop", [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGINT], ids=lambda s: s.name
)
async def test_a_terminating_signal_stops_the_stdio_recorder_with_everything_in_the_main_file(
    tmp_path: Path, stop: signal.Signals
) -> None:
    await _stop_stdio_recorder(tmp_path, stop)


# Starts the rest of its command line with SIGINT ignored, as a script's background job (`&`) is.
IGNORING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


async def test_a_recorder_started_with_sigint_ignored_still_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    await _stop_stdio_recorder(tmp_path, signal.SIGTERM, PYTHON, "-c", IGNORING_SIGINT)
