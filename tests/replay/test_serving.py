"""The Python API for trainers: ``replay_sim.serving`` in ``with`` and ``async with``, episode handles,
``Replay`` as a context manager, and reading a result's match (public names only)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import mcp_types as types
import pytest
from mcp import Client
from replay_helpers import build_store

import replay_sim
from replay_sim import EPISODE_HEADER, EPISODE_META_KEY, MATCH_META_KEY, EpisodeError, Match, match_of

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    build_store(tmp_path / "replay.db").close()
    return tmp_path / "replay.db"


def _text(result: types.CallToolResult) -> str:
    assert isinstance(result.content[0], types.TextContent)
    return result.content[0].text


def _refuses_connections(url: str) -> bool:
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port), timeout=5).close()
    except OSError:
        return True
    return False


async def test_async_serving_hands_out_episodes_whose_urls_keep_their_own_history(
    db: Path, tmp_path: Path
) -> None:
    async with replay_sim.serving(db=db, index_dir=tmp_path / "index") as sim:
        assert sim.url.startswith("http://127.0.0.1:") and sim.servers == ["demo", "other"]
        one, two = sim.episode(seed=3), sim.episode("rollout-2", metadata={"task": 1})
        assert one.url("demo") == f"{sim.url}/episodes/{one.id}/mcp/demo" and one.seed == 3
        async with Client(one.url("demo")) as a, Client(two.url("demo")) as b:
            await a.call_tool("increment", {})
            assert _text(await b.call_tool("counter", {})) == "0"
            assert _text(await a.call_tool("counter", {})) == "1"
        stats = one.stats()
        assert stats["calls"] == 2 and stats["tiers"] == {"exact": 2} and stats["seed"] == 3
        assert two.stats()["metadata"] == {"task": 1}
        assert sim.stats()["episodes"] == 2
        closed = one.close()
        assert closed is not None and closed["calls"] == 2 and one.close() is None
        with pytest.raises(KeyError, match="no longer live"):
            one.stats()
        url = sim.url
    assert _refuses_connections(url)  # shut down on the way out


def test_sync_serving_for_trainers_without_an_event_loop(db: Path, tmp_path: Path) -> None:
    with (
        replay_sim.serving(db=db, index_dir=tmp_path / "index", port=0) as sim,
        sim.episode("sync-1") as episode,
    ):
        config = episode.mcp_servers_json()
        assert config == {
            "mcpServers": {
                "demo": {"url": f"{sim.url}/episodes/sync-1/mcp/demo", "transport": "http"},
                "other": {"url": f"{sim.url}/episodes/sync-1/mcp/other", "transport": "http"},
            }
        }
        assert (
            episode.mcp_servers_json("streamable-http")["mcpServers"]["demo"]["transport"]
            == "streamable-http"
        )

        async def rollout() -> str:
            async with Client(episode.url("demo")) as client:
                await client.call_tool("increment", {})
                return _text(await client.call_tool("counter", {}))

        assert anyio.run(rollout) == "1"
        with pytest.raises(EpisodeError) as taken:
            sim.episode("sync-1")
        assert taken.value.status == 409
        with pytest.raises(KeyError, match="no recorded server"):
            episode.url("nope")
    assert sim.replay.episodes.get("sync-1") is None  # the handle ended it


def test_serving_takes_latency_faults_and_episode_bounds(db: Path, tmp_path: Path) -> None:
    options: dict[str, Any] = {"latency": "fixed:0", "faults": "demo/increment=1:is_error", "max_episodes": 1}
    with replay_sim.serving(db=db, index_dir=tmp_path / "index", **options) as sim:
        episode = sim.episode()
        with pytest.raises(EpisodeError, match="--max-episodes 1"):
            sim.episode()

        async def rollout() -> types.CallToolResult:
            async with Client(episode.url("demo")) as client:
                return await client.call_tool("increment", {})

        failed = anyio.run(rollout)
        assert failed.is_error and match_of(failed) == Match("fault", 0.0, fault="is_error")
        assert sim.stats()["faults"] == [
            {"server": "demo", "tool": "increment", "kind": "is_error", "count": 1}
        ]


def test_serving_a_missing_store_fails_before_starting(tmp_path: Path) -> None:
    with pytest.raises(replay_sim.StoreError), replay_sim.serving(db=tmp_path / "missing.db"):
        pass  # pragma: no cover
    with pytest.raises(replay_sim.ConfigError, match="fixed:MS"):
        replay_sim.serving(db=tmp_path / "missing.db", latency="slow")


def test_replay_is_a_context_manager_that_closes_its_store(db: Path) -> None:
    with replay_sim.open_replay(db, index_dir=db.parent / "index") as replay:
        assert replay.names() == ["demo", "other"]
    with pytest.raises(replay_sim.StoreError):
        replay.store.servers()


def test_match_of_reads_a_result_model_a_wire_dict_and_an_error() -> None:
    record = {
        "status": "canonical",
        "score": 0.97,
        "recording": 12,
        "snapshot": "sha256:abc",
        "differences": [{"field": "path", "recorded": "a", "requested": "A"}],
    }
    wire = {"content": [], "_meta": {MATCH_META_KEY: record}}
    model = types.CallToolResult.model_validate(wire)
    expected = Match(
        "canonical", 0.97, 12, "sha256:abc", ({"field": "path", "recorded": "a", "requested": "A"},)
    )
    assert match_of(wire) == match_of(model) == match_of(record) == expected
    assert expected.hit and not Match("miss", 0.0).hit
    assert match_of({"content": []}) is None and match_of(types.CallToolResult(content=[])) is None
    assert (EPISODE_HEADER, EPISODE_META_KEY, MATCH_META_KEY) == (
        "x-replay-episode",
        "replay-sim/episode",
        "replay-sim/match",
    )
