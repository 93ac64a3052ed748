"""State at fixed paths under a private directory (``/tmp``), named only in the server's command line.

Each confined instance gets a fresh ``/tmp``; what its config names there is revealed copy-on-write.
A path can be named as ``--option=/path`` or as ``NAME=/path`` (a variable set through ``env(1)``,
the way to pass settings that are no secrets: ``env`` values are redacted from answers).
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from instances_helpers import MEMORY, sandboxes, text, tool

from replay_sim.record.instances import InstancePool

pytestmark = pytest.mark.anyio


def _entity(name: str) -> dict[str, object]:
    return {"type": "entity", "name": name, "entityType": "person", "observations": []}


async def test_a_state_file_named_as_a_variable_for_env_is_each_instances_own_copy(tmp_path: Path) -> None:
    state = tmp_path / "memory" / "memory.jsonl"  # under /tmp, as the probe sets keep theirs
    state.parent.mkdir()
    state.write_text(json.dumps(_entity("Ada")) + "\n")
    config = sandboxes(memory={"command": ["/usr/bin/env", f"MEMORY_FILE_PATH={state}", MEMORY]})
    with anyio.fail_after(90):
        async with InstancePool(config, pool=0, base=tmp_path / "instances") as pool:
            first = await pool.acquire("memory", timeout=30)
            graph = json.loads(text(await first.call(*tool("read_graph"))))
            assert [e["name"] for e in graph["entities"]] == ["Ada"]  # the state it was started with
            grace = {"name": "Grace", "entityType": "person", "observations": []}
            created = await first.call(*tool("create_entities", entities=[grace]))
            assert "Grace" in text(created)  # it may write where the server wrote when recorded
            second = await pool.acquire("memory", timeout=30)
            graph = json.loads(text(await second.call(*tool("read_graph"))))
            assert [e["name"] for e in graph["entities"]] == ["Ada"]  # not the first's write
    assert state.read_text() == json.dumps(_entity("Ada")) + "\n"  # nor the host's file
