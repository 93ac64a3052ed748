"""Two replay replicas of one snapshot on a local Ray (num_cpus=2): episodes, sessions, a killed replica.

One Serve deployment for the module (starting Ray and loading the model twice takes ~30 s); the
killed-replica test runs last. The tests skip only where Ray is not installed.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from ray_helpers import ENVELOPE, MODERN, deployed_on_ray
from replay_helpers import raw_session

from replay_sim import Store, create_app, freeze, open_replay
from replay_sim.listener import serving_in_thread
from replay_sim.store.interchange import import_jsonl

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (make install does)")
serve = pytest.importorskip("ray.serve")

from replay_sim.errors import ConfigError  # noqa: E402
from replay_sim.scale.deploy import APP_NAME, ScaleSettings, app_builder  # noqa: E402
from replay_sim.scale.ring import owner  # noqa: E402

pytestmark = pytest.mark.anyio
DEMO = Path(__file__).parents[2] / "replay_sim" / "cli" / "demo_data" / "memory.jsonl"
SERVER = Path(__file__).parents[2] / "server"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def recorded_arguments() -> dict[str, dict[str, Any]]:
    calls = [json.loads(line) for line in DEMO.read_text().splitlines()]
    return {c["params"]["name"]: c["params"]["arguments"] for c in calls if c["type"] == "call"}


ARGS = recorded_arguments()
STEPS = ["read_graph", "create_entities", "create_relations", "read_graph"]
"""A stateful episode: the empty graph, two writes, then the graph they made (recorded as one session)."""


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scale")
    store = Store(folder / "memory.db")
    import_jsonl(store, DEMO)
    store.close()
    return freeze(folder / "memory.db", folder / "snapshot").path


def test_the_shipped_serve_config_builds_the_application(snapshot: Path) -> None:
    import yaml
    from ray.serve.schema import ServeDeploySchema

    config = ServeDeploySchema.model_validate(yaml.safe_load((SERVER / "ray.yaml").read_text()))
    (application,) = config.applications
    assert application.import_path == "replay_sim.scale.deploy:app_builder"
    assert config.http_options.keep_alive_timeout_s == 75  # past httpx's 5 s (Serve's default)
    args = dict(application.args) | {"snapshot": str(snapshot), "token": "t"}
    assert isinstance(app_builder(args), serve.Application)
    with pytest.raises(ConfigError, match="args: replica; known: allowed_hosts, "):
        app_builder(args | {"replica": 2})
    with pytest.raises(ConfigError, match="--autoscale-min <= --replicas"):
        app_builder(args | {"autoscale_min": 9})
    assert isinstance(app_builder(args | {"miss_detail": "none", "keep_alive": 90}), serve.Application)
    with pytest.raises(ConfigError, match="unknown miss detail 'leaky': choose full, reason, none"):
        app_builder(args | {"miss_detail": "leaky"})


def test_a_replica_a_call_found_dead_is_not_live_until_the_controller_lists_a_replacement() -> None:
    from replay_sim.scale import router

    try:
        router._note(listed=frozenset({"a", "b"}))
        router._note(died="a")
        assert router.live_replicas() == {"b"}
        router._note(listed=frozenset({"a", "b"}))  # the controller has not noticed the death yet
        assert router.live_replicas() == {"b"}
        router._note(listed=frozenset({"b", "c"}))
        assert router.live_replicas() == {"b", "c"} and not router._dead
    finally:
        router._note(listed=frozenset())


@pytest.fixture(scope="module")
def cluster(snapshot: Path) -> Iterator[str]:
    """Two replicas behind the gateway on a local Ray with 2 CPUs; yields the base URL."""
    with deployed_on_ray(ScaleSettings(str(snapshot), replicas=2, replica_cpus=0.5)) as url:
        yield url


@pytest.fixture(scope="module")
def single(snapshot: Path) -> Iterator[str]:
    """The same snapshot served by one plain ``replay-sim serve`` process (the reference)."""
    with serving_in_thread(create_app(open_replay(snapshot=snapshot))) as url:
        yield url


def test_a_deployment_is_ready_once_serve_run_returns(cluster: str) -> None:
    # A replica counts as up only once its warm-up (the index) is done: every replica says ready.
    for _ in range(8):
        ready = httpx2.get(f"{cluster}/api/ready", timeout=60)
        assert ready.status_code == 200, ready.text
        assert ready.json()["waiting_for"] == []


def modern(tool: str) -> dict[str, str]:
    """The 2026-07-28 era's per-request headers of a tools/call."""
    return {"Mcp-Method": "tools/call", "Mcp-Name": tool}


def body(step: int, name: str, episode: str, in_meta: bool) -> dict[str, Any]:
    meta = ENVELOPE | ({"replay-sim/episode": episode} if in_meta else {})
    params = {"_meta": meta, "name": name, "arguments": ARGS[name]}
    return {"jsonrpc": "2.0", "id": step + 1, "method": "tools/call", "params": params}


async def run_episodes(base: str, episodes: list[str]) -> dict[str, list[tuple[bytes, str | None]]]:
    """Every episode's steps, interleaved (all episodes' step 1, then step 2, …): bodies and replicas."""
    answers: dict[str, list[tuple[bytes, str | None]]] = {e: [] for e in episodes}
    async with httpx2.AsyncClient(base_url=base, timeout=60) as http:

        async def one(step: int, episode: str) -> None:
            kind = episode.split("-")[0]  # where the episode is named: header, _meta or URL
            named = {"X-Replay-Episode": episode} if kind == "header" else {}
            sent = body(step, STEPS[step], episode, kind == "meta")
            path = f"/episodes/{episode}/mcp/memory" if kind == "url" else "/mcp/memory"
            response = await http.post(path, json=sent, headers=MODERN | modern(STEPS[step]) | named)
            assert response.status_code == 200, response.text
            answers[episode].append((response.content, response.headers.get("x-replay-replica")))

        for step in range(len(STEPS)):
            async with anyio.create_task_group() as group:
                for episode in episodes:
                    group.start_soon(one, step, episode)
    return answers


async def test_interleaved_episodes_get_the_single_servers_bytes_each_on_one_replica(
    cluster: str, single: str
) -> None:
    episodes = [f"{('header', 'meta', 'url')[i % 3]}-{i}" for i in range(64)]
    with anyio.fail_after(240):
        scaled = await run_episodes(cluster, episodes)
        reference = await run_episodes(single, episodes)
    for episode in episodes:
        assert [a for a, _ in scaled[episode]] == [a for a, _ in reference[episode]], episode
        assert len({r for _, r in scaled[episode]}) == 1, f"{episode} moved between replicas"
    # the final read is the graph the episode's own writes made, not the empty one
    final = json.loads(scaled[episodes[0]][-1][0])["result"]
    assert final["structuredContent"]["entities"] and final["_meta"]["replay-sim/match"]["status"] == "exact"
    replicas = {scaled[e][0][1] for e in episodes}
    assert len(replicas) == 2  # both replicas took episodes...
    # ...each the one its id hashes to (the router's choice, not a redirect or luck)
    # (an episode named only in _meta is held where its first call landed: the proxy cannot read bodies)
    assert all(scaled[e][0][1] == owner(e, replicas) for e in episodes if not e.startswith("meta"))
    async with httpx2.AsyncClient(base_url=cluster, timeout=60) as http:
        listed = (await http.get("/scale/replicas")).json()["replicas"]
        metrics = {r: await http.get("/metrics", headers={"X-Replay-Replica": r}) for r in listed}
    assert set(listed) == replicas
    for replica, scraped in metrics.items():
        assert scraped.headers["x-replay-replica"] == replica
        assert f'replica="{replica}"' in scraped.text and "replay_sim_" in scraped.text


@contextlib.asynccontextmanager
async def sdk(url: str, mode: str, seen: list[str], headers: dict[str, str]) -> AsyncIterator[Client]:
    """The MCP SDK client over streamable HTTP, noting which replica answered each request of an episode
    or session (the 2026 era's discovery and listings carry neither: any replica answers them)."""

    async def note(response: httpx2.Response) -> None:
        request = response.request
        if b"replay-sim/episode" in request.content or set(request.headers) & {
            "x-replay-episode",
            "mcp-session-id",
        }:
            seen.append(f"{request.method} {response.headers.get('x-replay-replica')}")

    async with (
        httpx2.AsyncClient(headers=headers, timeout=60, event_hooks={"response": [note]}) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,  # type: ignore[arg-type]
    ):
        yield client


def text(result: Any) -> str:
    return str(result.content[0].text)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_mcp_sdk_client_replays_statefully_through_ray_in_both_eras(
    cluster: str, mode: str
) -> None:
    episode = f"sdk-{mode}"
    meta = {"replay-sim/episode": episode}
    seen: list[str] = []
    headers = {} if mode == "auto" else {"X-Replay-Episode": episode}
    with anyio.fail_after(120):
        async with sdk(f"{cluster}/mcp/memory", mode, seen, headers) as client:
            empty = await client.call_tool("read_graph", {}, meta=meta)
            for name in STEPS[1:3]:
                await client.call_tool(name, ARGS[name], meta=meta)
            full = await client.call_tool("read_graph", {}, meta=meta)
    assert json.loads(text(empty)) == {"entities": [], "relations": []}
    assert "Ada Lovelace" in text(full) and full.meta["replay-sim/match"]["status"] == "exact"
    assert len({s.split()[1] for s in seen}) == 1, seen  # every request, GET stream and DELETE included
    assert len(seen) >= 4
    if mode == "legacy":  # the session's closing DELETE (and its GET stream, once the SDK opened it)
        assert {"POST", "DELETE"} <= {s.split()[0] for s in seen}, seen


async def test_a_handshake_session_without_an_episode_stays_on_its_replica(cluster: str) -> None:
    seen: list[str] = []
    with anyio.fail_after(120):
        async with sdk(f"{cluster}/mcp/memory", "legacy", seen, {}) as client:
            await client.call_tool("create_entities", ARGS["create_entities"])
            await client.call_tool("create_relations", ARGS["create_relations"])
            full = await client.call_tool("read_graph", {})
    assert "Ada Lovelace" in text(full)
    assert len({s.split()[1] for s in seen}) == 1 and {"POST", "DELETE"} <= {s.split()[0] for s in seen}


async def test_a_sessions_get_stream_and_delete_reach_the_replica_that_minted_it(cluster: str) -> None:
    url = f"{cluster}/mcp/memory"
    with anyio.fail_after(120):
        async with httpx2.AsyncClient(timeout=60) as http:
            headers = await raw_session(http, url)
            minted_by = headers["Mcp-Session-Id"].split(".")[0].removeprefix("r-")
            async with http.stream("GET", url, headers=headers | {"Accept": "text/event-stream"}) as stream:
                assert stream.status_code == 200, await stream.aread()
                assert stream.headers["content-type"].startswith("text/event-stream")
                assert stream.headers["x-replay-replica"] == minted_by
            deleted = await http.delete(url, headers=headers)
            assert deleted.status_code == 200 and deleted.headers["x-replay-replica"] == minted_by
            foreign = headers | {"Mcp-Session-Id": "r-gone.0123"}
            refused = await http.post(url, json=body(0, "read_graph", "x", False), headers=foreign)
    assert refused.status_code == 410
    assert "MCP session 'r-gone.0123' was held by replay replica gone" in refused.json()["error"]["message"]


async def test_an_episode_created_through_the_admin_api_is_served_and_described_by_one_replica(
    cluster: str,
) -> None:
    with anyio.fail_after(120):
        async with httpx2.AsyncClient(base_url=cluster, timeout=60) as http:
            created = await http.post("/api/episodes", json={"metadata": {"run": 1}})
            assert created.status_code == 201, created.text
            episode, holder = created.json()["id"], created.headers["x-replay-replica"]
            url = created.json()["urls"]["memory"]
            answers = []
            for i, name in enumerate(STEPS):
                sent = body(i, name, episode, False)
                answers.append(await http.post(url, json=sent, headers=MODERN | modern(name)))
            described = await http.get(f"/api/episodes/{episode}")
    assert "Ada Lovelace" in answers[-1].text
    assert {a.headers["x-replay-replica"] for a in answers} == {holder}
    assert described.headers["x-replay-replica"] == holder and described.json()["calls"] == 4


def replica_states() -> dict[str, int]:
    status = serve.status().applications[APP_NAME].deployments["ReplayReplica"]
    return {str(k): int(v) for k, v in status.replica_states.items()}


async def test_a_killed_replicas_episodes_are_refused_by_name_and_the_rest_go_on(cluster: str) -> None:
    # Episodes named in a header go to their replica; those named only in _meta land anywhere and are
    # forwarded to their holder: after the kill, forwards to the dead replica are in flight at once.
    episodes = [f"kill-{i}" for i in range(8)] + [f"meta-kill-{i}" for i in range(8)]
    # A call held by the dead replica is refused once any call finds it dead, without waiting for
    # Serve's controller to notice (seconds here, minutes on a loaded machine).
    async with httpx2.AsyncClient(base_url=cluster, timeout=60) as http:

        async def step(i: int, episode: str) -> httpx2.Response:
            in_meta = episode.startswith("meta")
            named = {} if in_meta else {"X-Replay-Episode": episode}
            headers = MODERN | modern(STEPS[i]) | named
            return await http.post("/mcp/memory", json=body(i, STEPS[i], episode, in_meta), headers=headers)

        with anyio.fail_after(300):
            holders = {e: (await step(1, e)).headers["x-replay-replica"] for e in episodes}
            victim = holders[episodes[0]]
            handle = ray.get_actor(f"SERVE_REPLICA::{APP_NAME}#ReplayReplica#{victim}", namespace="serve")
            ray.kill(handle, no_restart=True)

            answers: dict[str, httpx2.Response] = {}

            async def second(episode: str) -> None:
                answers[episode] = await step(2, episode)

            async with anyio.create_task_group() as group:
                for episode in episodes:
                    group.start_soon(second, episode)
            for episode, holder in holders.items():
                answer = answers[episode]
                if holder == victim:
                    error = answer.json()["error"]
                    assert answer.status_code == 410, answer.text
                    assert error["data"] == {"episode": episode, "replica": victim}
                    assert (
                        f"episode {episode!r} was held by replay replica {victim}, which is gone"
                        in error["message"]
                    )
                else:
                    assert answer.status_code == 200 and answer.headers["x-replay-replica"] == holder
                    final = await step(3, episode)
                    assert "Ada Lovelace" in final.text and final.headers["x-replay-replica"] == holder
            assert any(h != victim for h in holders.values()), "every episode hashed to one replica"

            fresh = [await step(i, "after-the-kill") for i in range(len(STEPS))]
            assert [r.status_code for r in fresh] == [200] * 4 and "Ada Lovelace" in fresh[-1].text
            assert fresh[-1].headers["x-replay-replica"] != victim

            while replica_states().get("RUNNING") != 2:  # Serve starts a replacement replica
                await anyio.sleep(0.5)
            still_lost = await step(3, episodes[0])
            assert still_lost.status_code == 410  # the replacement does not pretend to hold it
