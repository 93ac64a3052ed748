"""State snapshots in the ``sandbox`` policy, over real HTTP with real servers over real stdio.

A second episode at a state a first one's instance reached starts from a snapshot of that
instance's files and re-plays nothing — where the server keeps its state in files (server-memory's
graph in its copy-on-write layer, the counter server's values in its ``state`` copy). Where it keeps
it in the process (the counter server without ``--state``), the snapshot-started instance fails the
probe, the server is marked process-stated and the episode is re-played as before: answers stay right.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from recording_helpers import NODE_BIN, PYTHON, ROOT, proxy_stdio, run_script, step
from sandbox_helpers import live_instances, match, text, until

import replay_sim
from replay_sim.record.config_file import load_config
from replay_sim.record.instances.building import sandbox_pool

pytestmark = pytest.mark.anyio

MEMORY = NODE_BIN / "mcp-server-memory"
COUNTER = ROOT / "fixtures" / "counter_server.py"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _entity(name: str) -> tuple[str, dict[str, Any]]:
    return step("create_entities", entities=[{"name": name, "entityType": "t", "observations": [name]}])


PREFIX = [
    _entity("alpha"),
    step("add_observations", observations=[{"entityName": "alpha", "contents": ["one"]}]),
    _entity("beta"),
]
"""Three recorded state-changing calls of server-memory, made by both episodes."""


async def _episode(sim: Any, name: str, script: list[tuple[str, dict[str, Any]]], server: str) -> list[Any]:
    """Play ``script`` as episode ``name``; its answers. Then wait until its sandbox answers are written."""
    async with Client(sim.episode(name).url(server)) as client:
        answers = [await client.call_tool(params["name"], params["arguments"]) for _, params in script]
    await until(lambda: sim.replay.policy.log.waiting == 0)
    return answers


def _wire(result: Any) -> str:
    """What is compared with the real server: content and ``isError``."""
    dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return json.dumps({k: dumped.get(k) for k in ("content", "isError")}, sort_keys=True)


async def test_a_second_episode_at_the_same_state_starts_from_a_snapshot_and_replays_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "replay.db"
    recorded = f"--env=MEMORY_FILE_PATH={tmp_path / 'recorded.jsonl'}"
    await run_script(proxy_stdio(db, "memory", [MEMORY], recorded), [step("read_graph"), *PREFIX])
    graph = f"{os.environ.get('HOME', '/root')}/replay-sim-{uuid.uuid4().hex}.jsonl"  # in its own layer
    config = tmp_path / "recorder.toml"
    config.write_text(f'[servers.memory]\ncommand = "{MEMORY}"\nenv = {{ MEMORY_FILE_PATH = "{graph}" }}\n'
                      "sandbox = true\n")  # fmt: skip
    first = [*PREFIX, step("search_nodes", query="alpha")]  # the last two: nobody recorded them here
    second = [*PREFIX, step("open_nodes", names=["alpha", "beta"])]
    env = {**os.environ, "MEMORY_FILE_PATH": str(tmp_path / "live.jsonl")}
    live = StdioServerParameters(command=str(MEMORY), env=env)
    async with Client(live, mode="legacy") as client:  # the truth: the real server, from empty
        truth = [_wire(await client.call_tool(p["name"], p["arguments"])) for _, p in [*first, second[-1]]]
    pool = sandbox_pool(load_config(config), pool=0, max_instances=4, snapshot_after=2)
    async with replay_sim.serving(db=db, miss="sandbox", sandboxes=pool, index_dir=tmp_path / "index") as sim:
        one = await _episode(sim, "one", first, "memory")
        two = await _episode(sim, "two", second, "memory")
        stats = sim.replay.policy.stats()["snapshots"]  # type: ignore[attr-defined]
        counted = {name: sim.replay.episodes.get(name).sandbox for name in ("one", "two")}
    assert [match(r)["status"] for r in one] == ["exact"] * 3 + ["sandbox"]
    assert [match(r)["status"] for r in two] == ["exact"] * 3 + ["sandbox"]
    assert [_wire(r) for r in one] == truth[:4] and _wire(two[-1]) == truth[4]
    assert counted["one"]["replayed"] == 3 and counted["two"]["replayed"] == 0  # started at its state
    assert match(two[-1])["sandbox"]["replayed"] == 0
    assert stats["taken"] >= 1 and stats["started"] == 1 and stats["restored"] == 3
    assert stats["process_stated"] == [] and stats["store"]["kept"] >= 1


@pytest.mark.parametrize("kept", ["in files", "in the process"])
async def test_a_server_whose_state_a_snapshot_cannot_hold_is_told_apart_and_replayed(
    tmp_path: Path, kept: str
) -> None:
    db = tmp_path / "replay.db"
    files = kept == "in files"
    state = ["--state", str(tmp_path / "recorded.json")] if files else []
    puts = [step("put", key=f"k{n}", value=v) for n, v in ((1, "a"), (2, "b"), (3, "c"))]
    await run_script(proxy_stdio(db, "counter", [PYTHON, COUNTER, *state]), [step("get", key="k1"), *puts])
    pristine = tmp_path / "pristine"
    pristine.mkdir()
    args = [str(COUNTER), *(["--state", "{state}/values.json"] if files else [])]
    config = tmp_path / "recorder.toml"
    table = f"command = {json.dumps(PYTHON)}\nargs = {json.dumps(args)}\nsandbox = true\n"
    table += f"state = {json.dumps(str(pristine))}\n" if files else ""
    config.write_text(f"[servers.counter]\n{table}")
    pool = sandbox_pool(load_config(config), pool=0, max_instances=4, snapshot_after=2)
    async with replay_sim.serving(db=db, miss="sandbox", sandboxes=pool, index_dir=tmp_path / "index") as sim:
        runs = [
            await _episode(sim, name, [*puts, step("get", key=key), step("get", key="k1")], "counter")
            for name, key in (("one", "k2"), ("two", "k3"), ("three", "k9"))
        ]
        stats = sim.replay.policy.stats()["snapshots"]  # type: ignore[attr-defined]
        episodes = [sim.replay.episodes.get(name) for name in ("one", "two", "three")]
        replayed = [episode.sandbox.get("replayed", 0) for episode in episodes]
    assert [[text(r) for r in run[3:]] for run in runs] == [["b", "a"], ["c", "a"], ["(unset)", "a"]]
    assert all(match(run[3])["status"] == "sandbox" for run in runs)
    assert stats["taken"] == 1  # one state: the three episodes' puts
    if files:
        assert replayed == [3, 0, 0] and stats["started"] == 2 and stats["process_stated"] == []
    else:  # the snapshot-started instance answered the probe from the initial state: not used again
        assert replayed == [3, 3, 3] and stats["started"] == 0 and stats["refused"] == 1
        assert stats["process_stated"] == ["counter"]


async def _recorded_memory(tmp_path: Path, max_instances: int) -> tuple[Path, Any]:
    """A store of server-memory writing ``alpha``, and a pool of its sandbox (its graph a file at a
    fixed path under ``$HOME``: in each instance's layer), snapshotted from 2 state-changing calls."""
    db = tmp_path / "replay.db"
    await run_script(proxy_stdio(db, "memory", [MEMORY], f"--env=MEMORY_FILE_PATH={tmp_path / 'r.jsonl'}"),
                     [step("read_graph"), _entity("alpha")])  # fmt: skip
    graph = f"{os.environ.get('HOME', '/root')}/replay-sim-{uuid.uuid4().hex}.jsonl"
    config = tmp_path / "recorder.toml"
    config.write_text(f'[servers.memory]\ncommand = "{MEMORY}"\nenv = {{ MEMORY_FILE_PATH = "{graph}" }}\n'
                      "sandbox = true\n")  # fmt: skip
    return db, sandbox_pool(load_config(config), pool=0, max_instances=max_instances, snapshot_after=2)


@contextlib.asynccontextmanager
async def _gamma_written(db: Path, pool: Any, tmp_path: Path) -> AsyncIterator[tuple[Any, Client]]:
    """Episode ``one`` on a replay that gives an instance back after 0.5 s idle, once it wrote
    ``alpha`` (recorded: the cache) and ``gamma`` (its instance): the replay and its client."""
    async with (
        replay_sim.serving(
            db=db, miss="sandbox", sandboxes=pool, index_dir=tmp_path / "index", sandbox_idle=0.5
        ) as sim,
        Client(sim.episode("one").url("memory")) as client,
    ):
        await client.call_tool("create_entities", PREFIX[0][1]["arguments"])  # recorded: the cache
        await client.call_tool("create_entities", _entity("gamma")[1]["arguments"])  # its instance
        yield sim, client


async def test_an_instance_given_back_idle_is_snapshotted_and_its_episode_rebuilt_from_it(
    tmp_path: Path,
) -> None:
    db, pool = await _recorded_memory(tmp_path, max_instances=4)
    async with _gamma_written(db, pool, tmp_path) as (sim, client):
        policy: Any = sim.replay.policy
        await until(lambda: policy.counts.get("released", 0) == 1)  # given back idle: snapshotted
        await until(lambda: policy.states.counts["taken"] == 1)
        again = await client.call_tool("open_nodes", {"names": ["alpha", "gamma"]})
        assert match(again)["status"] == "sandbox" and match(again)["sandbox"]["replayed"] == 0
        assert sorted(e["name"] for e in json.loads(text(again))["entities"]) == ["alpha", "gamma"]
        assert policy.states.counts["started"] == 1 and policy.states.counts["restored"] == 2
        await anyio.sleep(0)


async def test_a_snapshot_that_fails_is_counted_with_its_why_and_its_episode_is_re_played(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, pool = await _recorded_memory(tmp_path, max_instances=4)

    async def full(*_: Any, **__: Any) -> bool:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pool.snapshots, "take", full)  # its files cannot be read
    async with _gamma_written(db, pool, tmp_path) as (sim, client):
        policy: Any = sim.replay.policy
        await until(lambda: policy.states.counts["failed"] == 1)  # given back idle: no snapshot
        again = await client.call_tool("open_nodes", {"names": ["alpha", "gamma"]})
        async with httpx2.AsyncClient(timeout=30) as http:
            stats = (await http.get(f"{sim.url}/api/stats")).json()["sandbox"]["snapshots"]
    assert match(again)["status"] == "sandbox" and match(again)["sandbox"]["replayed"] == 2  # re-played
    assert sorted(e["name"] for e in json.loads(text(again))["entities"]) == ["alpha", "gamma"]
    assert stats["failed"] == 2 and stats["taken"] == 0  # given back, and again once re-played
    assert "OSError" in stats["failure"] and "No space left on device" in stats["failure"]


async def test_an_instance_reclaimed_at_the_cap_is_snapshotted_and_its_episode_rebuilt_from_it(
    tmp_path: Path,
) -> None:
    db, pool = await _recorded_memory(tmp_path, max_instances=1)
    served = {"sandboxes": pool, "index_dir": tmp_path / "index", "sandbox_idle": None}  # only reclaimed
    async with (
        replay_sim.serving(db=db, miss="sandbox", **served) as sim,
        Client(sim.episode("one").url("memory")) as one,
        Client(sim.episode("two").url("memory")) as two,
    ):
        policy: Any = sim.replay.policy
        await one.call_tool("create_entities", PREFIX[0][1]["arguments"])  # recorded: the cache
        await one.call_tool("create_entities", _entity("gamma")[1]["arguments"])  # its instance: 2 writes
        await two.call_tool("create_entities", _entity("delta")[1]["arguments"])  # takes the one place
        assert policy.counts["reclaimed"] == 1 and live_instances(sim, "memory") == 1
        again = await one.call_tool("open_nodes", {"names": ["alpha", "gamma"]})  # takes it back
        async with httpx2.AsyncClient(timeout=30) as http:
            stats = (await http.get(f"{sim.url}/api/stats")).json()["sandbox"]
    assert match(again)["status"] == "sandbox" and match(again)["sandbox"]["replayed"] == 0
    assert sorted(e["name"] for e in json.loads(text(again))["entities"]) == ["alpha", "gamma"]
    assert stats["reclaimed"] == 2 and stats["pool"]["memory"]["reclaimed"] == 2
    snapshots = stats["snapshots"]
    assert snapshots["taken"] == 1 and snapshots["reclaimed"] == 1  # one's state; two's single write is not
    assert snapshots["started"] == 1 and snapshots["restored"] == 2
