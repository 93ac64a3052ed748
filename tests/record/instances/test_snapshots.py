"""State snapshots of confined instances: the real server-memory, its graph in its layer or its state copy.

An instance started from a snapshot answers from the snapshot's state (its own files, as its own
uid); snapshots are bounded in count and bytes (least recently used evicted first) and deleted
with the pool; an unconfined pool takes none.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from instances_helpers import MEMORY, memory, sandboxes, text, tool, until

from replay_sim.errors import ConfigError, SandboxUnavailable
from replay_sim.record.instances import InstancePool
from replay_sim.record.instances.snapshots import WAITED_FILES, StateSnapshots

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _entity(name: str) -> tuple[str, dict[str, Any]]:
    return tool("create_entities", entities=[{"name": name, "entityType": "t", "observations": [name]}])


def _names(answer: dict[str, Any]) -> list[str]:
    return sorted(entity["name"] for entity in json.loads(text(answer))["entities"])


def _layer_config() -> Any:
    """server-memory with its graph at a fixed path in its home: written to its copy-on-write layer."""
    home = os.environ.get("HOME", "/root")
    graph = {"MEMORY_FILE_PATH": f"{home}/replay-sim-memory.jsonl"}
    return sandboxes(memory={"command": [MEMORY], "env": graph})


@pytest.mark.parametrize(("where", "warm"), [("layer", 0), ("state", 1)])
async def test_an_instance_started_from_a_snapshot_answers_from_its_state_as_its_own_uid(
    tmp_path: Path, where: str, warm: int
) -> None:
    config = _layer_config() if where == "layer" else sandboxes(memory=memory(tmp_path / "pristine"))
    snapshots = StateSnapshots(after=1)
    async with InstancePool(config, pool=warm, base=tmp_path / "base", snapshots=snapshots) as pool:
        first = await pool.acquire("memory", timeout=60)
        await first.call(*_entity("alpha"))
        assert await snapshots.take(first, "one", {"said": 1})
        await first.call(*_entity("beta"))  # after the snapshot: not in it
        if warm:  # a warm instance (at the initial state) is at hand: never the one handed out for it
            await until(lambda: pool.stats()["memory"]["warm"] == warm, timeout=60)
            # ... and it re-plays what takes less than a process start sooner than a snapshot starts
            assert not snapshots.worth("memory", 0.0) and snapshots.worth("memory", 3600.0)
        started = await pool.acquire("memory", timeout=60, snapshot="one")
        assert _names(await started.call(*tool("read_graph"))) == ["alpha"]
        await started.call(*_entity("gamma"))  # it writes its files: they are its own uid's
        assert _names(await started.call(*tool("read_graph"))) == ["alpha", "gamma"]
        assert _names(await first.call(*tool("read_graph"))) == ["alpha", "beta"]  # apart
        assert snapshots.find("memory", ["none"]) is None
        assert snapshots.find("memory", ["one", "none"]) == (1, {"said": 1})  # the longest prefix kept
        assert snapshots.find("memory", ["none", "one"]) == (2, {"said": 1})  # keys[i]: after i + 1 calls
        assert snapshots.find("other", ["one"]) is None
        assert snapshots.stats()["started"] == 1
        kept = snapshots._root
        assert kept is not None and any(kept.iterdir())
    assert not kept.exists()  # deleted with the pool


async def test_snapshots_are_bounded_in_count_and_bytes_least_recently_used_evicted_first(
    tmp_path: Path,
) -> None:
    snapshots = StateSnapshots(count=2, after=1)
    async with InstancePool(_layer_config(), pool=0, base=tmp_path / "base", snapshots=snapshots) as pool:
        instance = await pool.acquire("memory", timeout=60)
        for n, name in enumerate(["a", "b", "c"]):
            await instance.call(*_entity(name * 200))
            assert await snapshots.take(instance, name, {})
            if n == 1:
                assert snapshots.find("memory", ["a"]) is not None  # used: "b" is the least recent now
        assert [snapshots.kept(k) for k in "abc"] == [True, False, True]
        assert snapshots.stats()["evicted"] == 1
        assert snapshots._root is not None and len([p for p in snapshots._root.iterdir() if p.is_dir()]) == 2
        with pytest.raises(SandboxUnavailable, match="no longer kept"):
            await pool.acquire("memory", timeout=60, snapshot="b")
        # Bytes: a new state snapshot pushes the least recently used out when they would pass the bound.
        snapshots.count, snapshots.max_bytes = 10, 1 << 20
        await instance.call(*_entity("x"))
        assert await snapshots.take(instance, "x", {})
        before = snapshots.bytes
        await snapshots.take(instance, "x2", {})  # the same state again: the same size
        size = snapshots.bytes - before
        snapshots.max_bytes = snapshots.bytes + size // 2  # room for one more of this size, not two
        assert await snapshots.take(instance, "x3", {})
        assert snapshots.bytes <= snapshots.max_bytes
        kept = [snapshots.kept(k) for k in ("a", "c", "x", "x2", "x3")]  # least recently used first
        assert kept[0] is False and kept[3:] == [True, True] and kept == sorted(kept)  # from the front
        snapshots.max_bytes = 10  # smaller than any state: not kept, and nothing else is evicted for it
        await instance.call(*_entity("e"))
        assert not await snapshots.take(instance, "e", {})
        assert snapshots.stats()["refused"] == 1 and snapshots.kept("x3")


async def test_an_unconfined_pool_takes_no_snapshots(tmp_path: Path) -> None:
    snapshots = StateSnapshots(after=1)
    config = sandboxes(memory=memory(tmp_path / "pristine"))
    async with InstancePool(config, pool=0, unconfined=True, snapshots=snapshots) as pool:
        instance = await pool.acquire("memory", timeout=60)
        await instance.call(*_entity("alpha"))
        assert not snapshots.enabled("memory")
        assert not await snapshots.take(instance, "one", {})
    with pytest.raises(ConfigError, match="sandbox snapshots"):
        StateSnapshots(count=-1)


async def test_files_too_many_to_copy_while_a_caller_waits_are_skipped_then_and_copied_otherwise(
    tmp_path: Path,
) -> None:
    pristine = tmp_path / "pristine"
    pristine.mkdir()
    for n in range(WAITED_FILES + 1):  # one over the bound, in its state copy
        (pristine / f"file-{n}").write_text("x")
    snapshots = StateSnapshots(after=1)
    config = sandboxes(memory=memory(pristine))
    async with InstancePool(config, pool=0, base=tmp_path / "base", snapshots=snapshots) as pool:
        instance = await pool.acquire("memory", timeout=60)
        await instance.call(*_entity("alpha"))
        assert not await snapshots.take(instance, "waited", {}, waiting=True)  # reclaimed at the cap
        assert snapshots.stats()["skipped"] == 1 and not snapshots.kept("waited")
        assert await snapshots.take(instance, "idle", {})  # given back idle: nobody waits
        assert snapshots.stats()["taken"] == 1 and snapshots.stats()["skipped"] == 1
