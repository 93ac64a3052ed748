"""Admission that slow clients cannot starve (issue 29, item 3): a body still arriving holds no
in-flight slot, so a flood of slow bodies with made-up session ids leaves room for new sessions."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx2
from mcp import Client
from replay_helpers import make_replay

from replay_sim.listener import serving_in_thread
from replay_sim.replay.http.app import create_app
from replay_sim.replay.options import Limits

FLOOD = 64


def _metric(url: str, name: str) -> float:
    """A gauge of ``/metrics`` (0 when the server does not report it)."""
    for line in httpx2.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _wait_until(url: str, done: Callable[[Callable[[str], float]], bool]) -> None:
    async def until() -> None:
        with anyio.fail_after(60):
            while not done(lambda name: _metric(url, name)):
                await anyio.sleep(0.05)

    anyio.run(until)


def _slow_body(url: str, session: str) -> socket.socket:
    """A POST claiming session ``session`` whose 200-byte body stops after 10 bytes."""
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    client = socket.create_connection((host, int(port)), timeout=60)
    client.sendall(
        f"POST /mcp/demo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\n"
        f'MCP-Protocol-Version: 2025-11-25\r\nContent-Length: 200\r\n\r\n{{"jsonrpc"'.encode()
    )
    return client


def test_slow_bodies_with_made_up_sessions_hold_no_slot_and_a_real_client_still_opens_a_session(
    tmp_path: Path,
) -> None:
    replay = make_replay(tmp_path / "flood.db")
    limits = Limits(max_concurrent=8, admission_wait=1, body_timeout=120)
    with serving_in_thread(create_app(replay, limits=limits)) as url:
        flood = [_slow_body(url, f"made-up-{i}") for i in range(FLOOD)]
        try:
            # every slow request has reached the server (read in flight before the fix, reading after)
            reached = ("replay_sim_requests_in_flight", "replay_sim_requests_reading_body")
            _wait_until(url, lambda metric: sum(metric(name) for name in reached) >= FLOOD)

            async def session() -> list[str]:
                with anyio.fail_after(60):
                    async with Client(f"{url}/mcp/demo", mode="legacy") as client:
                        return [tool.name for tool in (await client.list_tools()).tools]

            assert "echo" in anyio.run(session)
            assert _metric(url, "replay_sim_requests_in_flight") == 0  # they hold no slot
        finally:
            for sock in flood:
                sock.close()
        _wait_until(url, lambda metric: metric("replay_sim_requests_reading_body") == 0)
