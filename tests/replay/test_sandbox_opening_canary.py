"""The opening canary (issue 27, item 2): a server with no effect-free tool recorded from the initial
state is checked once, on a spare instance, against the first call of a recorded session.

server-memory over real stdio, its graph in a file at a fixed path (``MEMORY_FILE_PATH``); the only
calls recorded from the initial state create entities, so no read can serve as a canary.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client
from recording_helpers import NODE_BIN, proxy_stdio, run_script, step
from sandbox_helpers import live_instances, match, sandboxed, text, until

from replay_sim.store import Origin, Store

pytestmark = pytest.mark.anyio

MEMORY = NODE_BIN / "mcp-server-memory"
ENTITY = {"name": "ada", "entityType": "person", "observations": ["writes programs"]}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _recorded(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Two sessions recorded from an empty graph (each opens by creating ``ada``); the db, the graph
    file (absent again: the initial state) and a recorder config naming it at its fixed path."""
    db, graph = tmp_path / "replay.db", tmp_path / "graph" / "memory.jsonl"
    graph.parent.mkdir()
    for _ in range(2):
        target = proxy_stdio(db, "memory", [MEMORY], f"--env=MEMORY_FILE_PATH={graph}")
        await run_script(target, [step("create_entities", entities=[ENTITY]), step("read_graph")])
        graph.unlink()
    config = tmp_path / "recorder.toml"
    config.write_text(
        f"[servers.memory]\ncommand = {json.dumps(str(MEMORY))}\n"
        f"env = {{ MEMORY_FILE_PATH = {json.dumps(str(graph))} }}\nsandbox = true\n"
    )
    return db, graph, config


async def test_a_server_whose_state_is_not_the_initial_one_is_refused_by_its_opening_canary(
    tmp_path: Path,
) -> None:
    db, graph, config = await _recorded(tmp_path)
    other = {"type": "entity", "name": "ada", "entityType": "robot", "observations": []}
    graph.write_text(json.dumps(other) + "\n")  # other data where the recordings had none
    async with sandboxed(db, config, tmp_path) as sim:
        async with Client(sim.episode("e").url("memory")) as client:
            missed = await client.call_tool("search_nodes", {"query": "ada"})
            assert missed.is_error and match(missed)["status"] == "miss"
            said = text(missed)
            assert "the sandbox of 'memory' is refused" in said
            assert "canary create_entities(" in said and "the first call of a recorded session" in said
            assert "first difference at content[0].text → [0]" in said  # no ada made: it was there
            assert "re-played (absent)" in said
        async with Client(sim.episode("f").url("memory")) as client:  # refused for good
            later = await client.call_tool("open_nodes", {"names": ["ada"]})
            assert match(later)["status"] == "miss" and "refused" in text(later)
        await until(lambda: live_instances(sim, "memory") == 0)
        assert sim.replay.policy.stats()["canaries"] == 1  # type: ignore[attr-defined]
    with Store(db) as store:
        assert all(r.origin != Origin.SANDBOX for r in store.recordings())


async def test_a_server_at_the_initial_state_passes_its_opening_canary_once(tmp_path: Path) -> None:
    db, _, config = await _recorded(tmp_path)
    async with sandboxed(db, config, tmp_path) as sim:
        for episode, tool, arguments in (
            ("e", "search_nodes", {"query": "ada"}),
            ("f", "open_nodes", {"names": ["ada"]}),
        ):
            async with Client(sim.episode(episode).url("memory")) as client:
                found = await client.call_tool(tool, arguments)
                assert match(found)["status"] == "sandbox", text(found)
                assert json.loads(text(found)) == {
                    "entities": [],
                    "relations": [],
                }  # the spare's create is gone
        assert sim.replay.policy.stats()["canaries"] == 1  # type: ignore[attr-defined]
