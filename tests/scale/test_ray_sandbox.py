"""``--miss sandbox`` on Ray Serve: each replica its own pool of real server-memory instances.

Two replicas of a snapshot that holds one recorded ``read_graph`` of the real
``@modelcontextprotocol/server-memory``, on a local Ray (num_cpus=2). Episodes write what nobody
recorded, over real HTTP through Serve's proxy; each replica builds its own pool from the recorder
config, and an episode's every call reaches the replica holding its instance. Answers are checked
against the same episode run on its own real server. The tests skip only where Ray is not installed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from ray_helpers import ENVELOPE, MODERN, deployed_on_ray
from recording_helpers import NODE_BIN, proxy_stdio, run_script, step

from replay_sim import MATCH_META_KEY, freeze

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (make install does)")
serve = pytest.importorskip("ray.serve")

from replay_sim.scale.deploy import ScaleSettings  # noqa: E402

pytestmark = pytest.mark.anyio
MEMORY = NODE_BIN / "mcp-server-memory"
EPISODES = [f"{('header', 'url')[i % 2]}-{i}" for i in range(6)]
CAP = 4
"""Live instances at most per replica (``--max-sandboxes``)."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def calls(entity: str) -> list[tuple[str, dict[str, Any]]]:
    """An episode's calls: a write nobody recorded, another, and two reads of what it wrote."""
    return [
        ("create_entities", {"entities": [{"name": entity, "entityType": "probe", "observations": ["a"]}]}),
        ("add_observations", {"observations": [{"entityName": entity, "contents": ["b"]}]}),
        ("open_nodes", {"names": [entity]}),
        ("read_graph", {}),
    ]


def canonical(result: dict[str, Any]) -> str:
    """What is compared of a tool result: content, structured content and ``isError``."""
    return json.dumps(
        [result["content"], result.get("structuredContent"), bool(result.get("isError"))], sort_keys=True
    )


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A snapshot of one recorded ``read_graph`` of server-memory, and the config declaring it a sandbox."""
    folder = tmp_path_factory.mktemp("ray-sandbox")
    db = folder / "replay.db"
    target = proxy_stdio(db, "memory", [MEMORY], f"--env=MEMORY_FILE_PATH={folder / 'recorded.jsonl'}")
    target.env = dict(os.environ)  # this checkout's replay_sim (PYTHONPATH)
    anyio.run(run_script, target, [step("read_graph")])
    (folder / "pristine").mkdir()
    config = folder / "recorder.toml"
    config.write_text(
        f'[servers.memory]\ncommand = "{MEMORY}"\nenv = {{ MEMORY_FILE_PATH = "{{state}}/memory.jsonl" }}\n'
        f'sandbox = true\nstate = "{folder / "pristine"}"\n'
    )
    return freeze(db, folder / "snapshot").path, config


@pytest.fixture(scope="module")
def truth(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each episode's answers from its own fresh real server over stdio."""
    folder = tmp_path_factory.mktemp("direct")

    async def direct(episode: str) -> list[str]:
        env = {**os.environ, "MEMORY_FILE_PATH": str(folder / f"{episode}.jsonl")}
        async with Client(StdioServerParameters(command=str(MEMORY), env=env), mode="legacy") as client:
            answers = [await client.call_tool(t, a) for t, a in calls(episode)]
        return [canonical(a.model_dump(mode="json", by_alias=True, exclude_none=True)) for a in answers]

    return {episode: anyio.run(direct, episode) for episode in EPISODES}


@pytest.fixture(scope="module")
def cluster(deployed: tuple[Path, Path]) -> Iterator[str]:
    """Two sandbox replicas (no warm instances, at most ``CAP`` live each) on a local Ray; the base URL."""
    snapshot, config = deployed
    settings = ScaleSettings(
        str(snapshot), replicas=2, replica_cpus=0.5, miss="sandbox", config=str(config),
        sandbox_pool=0, max_sandboxes=CAP,
    )  # fmt: skip
    with deployed_on_ray(settings) as url:
        yield url


async def run_episode(http: httpx2.AsyncClient, episode: str) -> list[tuple[dict[str, Any], str]]:
    """An episode's calls, named in the header or the URL: each result and the replica that answered."""
    named = {"X-Replay-Episode": episode} if episode.startswith("header") else {}
    path = f"/episodes/{episode}/mcp/memory" if episode.startswith("url") else "/mcp/memory"
    answered = []
    for i, (tool, arguments) in enumerate(calls(episode)):
        sent = {"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                "params": {"_meta": ENVELOPE, "name": tool, "arguments": arguments}}  # fmt: skip
        headers = MODERN | {"Mcp-Method": "tools/call", "Mcp-Name": tool} | named
        response = await http.post(path, json=sent, headers=headers)
        assert response.status_code == 200, response.text
        answered.append((response.json()["result"], response.headers["x-replay-replica"]))
    return answered


async def test_each_replica_answers_its_episodes_from_its_own_sandbox_instances(
    cluster: str, truth: dict[str, list[str]]
) -> None:
    results: dict[str, list[tuple[dict[str, Any], str]]] = {}
    with anyio.fail_after(300):
        async with httpx2.AsyncClient(base_url=cluster, timeout=120) as http:

            async def one(episode: str) -> None:
                results[episode] = await run_episode(http, episode)

            async with anyio.create_task_group() as group:
                for episode in EPISODES:
                    group.start_soon(one, episode)
            replicas = (await http.get("/scale/replicas")).json()["replicas"]
            stats = {
                r: (await http.get("/api/stats", headers={"X-Replay-Replica": r})).json()["sandbox"]
                for r in replicas
            }
    held: dict[str, list[str]] = {r: [] for r in replicas}
    for episode, answered in results.items():
        assert [canonical(result) for result, _ in answered] == truth[episode], episode
        # the snapshot cannot hold the new state: every call is the episode's instance's answer
        assert [result["_meta"][MATCH_META_KEY]["status"] for result, _ in answered] == ["sandbox"] * 4
        (holder,) = {replica for _, replica in answered}  # an episode never moves between replicas
        held[holder].append(episode)
    assert all(held.values()), f"one replica took every episode: {held}"
    for replica, figures in stats.items():
        pool = figures["pool"]["memory"]
        # its own pool started an instance for each episode it held, within its own cap
        assert pool["started"] >= len(held[replica]), (replica, pool, held)
        assert pool["live"] <= CAP
        assert figures["answers"] == 4 * len(held[replica]), (replica, figures)
