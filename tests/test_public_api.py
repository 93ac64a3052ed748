"""The whole loop through ``replay_sim``'s public API only, the way a user's script would run it.

Record the fixture server over stdio, index the recordings, replay them over real HTTP on
127.0.0.1, ask the replay with ``mcp.Client``, then freeze the store into a snapshot and verify it.
Nothing here imports a replay-sim module by its path inside the package.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import anyio
import pytest
import uvicorn
from mcp import Client

from replay_sim import (
    Store,
    UpstreamSpec,
    build_index,
    create_app,
    freeze,
    open_replay,
    recording,
    verify,
)

ECHO_SERVER = Path(__file__).resolve().parent.parent / "fixtures" / "echo_server.py"

pytestmark = pytest.mark.anyio


async def test_a_user_records_indexes_replays_over_http_and_freezes_with_the_public_api_alone(
    tmp_path: Path,
) -> None:
    db, index_dir, bundle = tmp_path / "replay.db", tmp_path / "index", tmp_path / "snapshot"
    echo = UpstreamSpec(command=sys.executable, args=(str(ECHO_SERVER),))
    with anyio.fail_after(120):
        # 1. Record: a client talks to the real server through the recorder.
        async with recording(db, {"echo": echo}) as recorder, Client(recorder.server("echo")) as client:
            recorded = await client.call_tool("echo", {"text": "hello, replay"})
        assert recorded.content[0].text == "hello, replay"

        # 2. Index the recordings.
        with Store(db) as store:
            build_index(store, directory=index_dir)
        assert (index_dir / "manifest.json").is_file()

        # 3. Replay over real HTTP: uvicorn in this event loop, on a port the OS picks.
        app = create_app(open_replay(db, index_dir=index_dir))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            sock.listen()
            port = sock.getsockname()[1]
            server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: server.serve(sockets=[sock]))
                try:
                    async with Client(f"http://127.0.0.1:{port}/mcp/echo") as client:
                        # The SDK's default (2026-era) client has no session, and echo is not
                        # annotated read-only (it may change state): a rollout names its episode.
                        episode = {"replay-sim/episode": "rollout-1"}
                        replayed = await client.call_tool("echo", {"text": "hello, replay"}, meta=episode)
                finally:
                    server.should_exit = True

    assert replayed.content == recorded.content
    assert replayed.meta is not None and replayed.meta["replay-sim/match"]["status"] == "exact"

    # 4. Freeze a snapshot and verify it: the id it was frozen with is the id it verifies as.
    frozen = freeze(db, bundle)
    assert verify(bundle).id == frozen.id
