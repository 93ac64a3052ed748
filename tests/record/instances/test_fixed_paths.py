"""State at fixed paths under a private directory (``/tmp``), named only in the server's command line.

Each confined instance gets a fresh ``/tmp``; what its config names there is revealed copy-on-write.
A path can be named as ``--option=/path`` or as ``NAME=/path`` (a variable set through ``env(1)``,
the way to pass settings that are no secrets: ``env`` values are redacted from answers).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import anyio
import pytest
from instances_helpers import ECHO, MEMORY, sandboxes, text, tool
from recording_helpers import PYTHON

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


async def test_a_state_file_not_there_yet_is_made_in_its_folder_by_each_instance(tmp_path: Path) -> None:
    state = tmp_path / "memory" / "memory.jsonl"  # the server makes it on its first write
    state.parent.mkdir()
    config = sandboxes(memory={"command": [MEMORY], "env": {"MEMORY_FILE_PATH": str(state)}})
    with anyio.fail_after(90):
        async with InstancePool(config, pool=0, base=tmp_path / "instances") as pool:
            instance = await pool.acquire("memory", timeout=30)
            created = await instance.call(*tool("create_entities", entities=[_entity("Ada")]))
            assert "Ada" in text(created)  # not ENOENT: its folder is there, and its own
    assert not state.exists()  # nothing reached the host


async def test_a_server_writing_next_to_its_code_in_its_virtual_environment_starts(tmp_path: Path) -> None:
    # Outside /tmp (an instance's /tmp is its own): a virtual environment as root left it, with a
    # log an earlier run wrote; the server appends to it and makes another at start (excel-mcp-server).
    env = Path(tempfile.mkdtemp(prefix="replay-sim-venv-", dir="/var/tmp"))
    try:
        (env / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (env / "lib" / "python3.11").mkdir(parents=True)
        (env / "lib" / "python3.11" / "server.log").write_text("an earlier run\n")
        (env / "bin").mkdir()
        program = env / "bin" / "logging-echo"
        program.write_text(
            f"#!{PYTHON}\nimport runpy\nhere = {str(env)!r}\n"
            "open(here + '/lib/python3.11/server.log', 'a').write('started\\n')\n"
            "open(here + '/lib/made.log', 'w').write('started\\n')\n"
            f"runpy.run_path({str(ECHO[1])!r}, run_name='__main__')\n"
        )
        program.chmod(0o755)
        config = sandboxes(echo={"command": [str(program)]})
        with anyio.fail_after(90):
            async with InstancePool(config, pool=0, base=tmp_path / "instances") as pool:
                instance = await pool.acquire("echo", timeout=30)  # it started: no PermissionError
                assert text(await instance.call(*tool("echo", text="hi"))) == "hi"
        assert (env / "lib" / "python3.11" / "server.log").read_text() == "an earlier run\n"  # the host's
        assert not (env / "lib" / "made.log").exists()
    finally:
        shutil.rmtree(env)
