"""Concurrent instances of one real server never see each other's state: state dirs, mounts, processes."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from instances_helpers import COUNTER, FILESYSTEM, MEMORY, sandboxes, text, tool

from replay_sim.record.instances import Instance, InstancePool

pytestmark = pytest.mark.anyio


async def _both(pool: InstancePool, server: str) -> list[Instance]:
    """Two instances of ``server``, started side by side."""
    got: list[Instance] = []

    async def one() -> None:
        got.append(await pool.acquire(server, timeout=30))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        tg.start_soon(one)
    return got


def _entity(name: str) -> dict[str, object]:
    return {"name": name, "entityType": "person", "observations": [f"{name} was here"]}


async def test_two_memory_instances_with_state_isolation_each_read_back_only_their_own_entities(
    tmp_path: Path,
) -> None:
    pristine = tmp_path / "pristine"
    pristine.mkdir()
    (pristine / "memory.jsonl").write_text(json.dumps({"type": "entity", **_entity("Ada")}) + "\n")
    config = sandboxes(
        memory={
            "command": [MEMORY],
            "env": {"MEMORY_FILE_PATH": "{state}/memory.jsonl"},
            "state": str(pristine),
        }
    )
    with anyio.fail_after(60):
        async with InstancePool(config, pool=0, base=tmp_path) as pool:
            first, second = await _both(pool, "memory")
            async with anyio.create_task_group() as tg:  # both write at once
                tg.start_soon(first.call, *tool("create_entities", entities=[_entity("Grace")]))
                tg.start_soon(second.call, *tool("create_entities", entities=[_entity("Linus")]))
            graphs = [json.loads(text(await i.call(*tool("read_graph")))) for i in (first, second)]
            names = [sorted(e["name"] for e in graph["entities"]) for graph in graphs]
            assert names == [["Ada", "Grace"], ["Ada", "Linus"]]
            directories = [first.directory, second.directory]
            assert all(d is not None and (d / "state" / "memory.jsonl").exists() for d in directories)
            await first.close()
            await second.close()
            assert not any(d is not None and d.exists() for d in directories)  # closing deletes the state
    assert (pristine / "memory.jsonl").read_text().count("\n") == 1  # the pristine copy is untouched


async def test_two_filesystem_instances_with_mount_isolation_write_the_same_path_and_each_reads_its_own(
    tmp_path: Path,
) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "notes.txt").write_text("original")
    config = sandboxes(files={"command": [FILESYSTEM, str(files)], "mounts": [str(files)]})
    target = str(files / "notes.txt")
    with anyio.fail_after(60):
        async with InstancePool(config, pool=0, base=tmp_path / "instances") as pool:
            first, second = await _both(pool, "files")
            for instance, content in ((first, "from the first"), (second, "from the second")):
                assert "Successfully wrote" in text(
                    await instance.call(*tool("write_file", path=target, content=content))
                )
            reads = [text(await i.call(*tool("read_text_file", path=target))) for i in (first, second)]
            assert reads == ["from the first", "from the second"]
            await first.close()
            await second.close()
    assert (files / "notes.txt").read_text() == "original"  # nobody outside an instance saw a write


async def test_a_fresh_process_instance_of_an_in_process_state_server_starts_at_the_initial_state() -> None:
    config = sandboxes(counter={"command": COUNTER})
    with anyio.fail_after(60):
        async with InstancePool(config, pool=0) as pool:
            first, second = await _both(pool, "counter")
            assert text(await first.call(*tool("put", key="k", value="written"))) == "ok"
            assert text(await first.call(*tool("get", key="k"))) == "written"
            assert first.id != second.id
            assert text(await second.call(*tool("get", key="k"))) == "(unset)"
            assert text(await first.call(*tool("get", key="k"))) == "written"
