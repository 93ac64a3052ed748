"""Sandboxes: what an answer from an episode's own instance costs against a cache hit.

Reported (each against a baseline measured in the same run, on the counter fixture server, whose
state lives in its process, served with ``--miss sandbox`` over HTTP):

- a cache hit (median round trip of an exact ``tools/call``) — the baseline;
- a **cold** sandbox answer: the first unrecorded call of an episode, which takes an instance (none
  warm: ``--sandbox-pool 0``, so a process start) and re-plays the episode's state-changing calls,
  after a prefix of 0, 8 and 32 recorded writes (re-play cost against prefix length);
- the same with a warm pool (``--sandbox-pool 1``: the instance started before it was asked for);
- a **warm** sandbox answer: later unrecorded calls of a bound episode (median);
- a **second run** of the same episode's calls: how many answers come from the cache then.

And **state snapshots** (:func:`snapshots`: the real server-memory, whose graph is a file in its
instance's copy-on-write layer, with ``--sandbox-pool 0`` and ``1``): the first unrecorded call of
an episode after a prefix of 4, 32 and 256 recorded writes (medians of 3 episodes), re-played on a
fresh instance (``--sandbox-snapshots 0``) against started from a snapshot another episode's
instance left at that state (verified by its probe), with a warm answer, the instance's own latency
and a cache hit as baselines.

Run with ``python -m bench.sandbox [snapshots]`` (or ``python -m bench``).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

import replay_sim
from replay_sim import MATCH_META_KEY
from replay_sim.record.config_file import load_config
from replay_sim.record.instances.building import sandbox_pool

ROOT = Path(__file__).resolve().parent.parent
COUNTER = ROOT / "fixtures" / "counter_server.py"
REPLAY_SIM = str(Path(sys.executable).parent / "replay-sim")
PREFIXES = (0, 8, 32)
WARM_CALLS = 30
HITS = 200


async def _record(db: Path, writes: int) -> None:
    """One recorded session: ``writes`` puts, then a get (through the real recorder CLI)."""
    params = StdioServerParameters(
        command=REPLAY_SIM,
        args=["record", "--db", str(db), "--name", "counter", "--", sys.executable, str(COUNTER)],
        env=dict(os.environ),  # the replay_sim this runs (PYTHONPATH), not only the SDK's safe variables
    )
    async with Client(params, mode="legacy") as client:
        for i in range(writes):
            await client.call_tool("put", {"key": f"k{i}", "value": f"v{i}"})
        await client.call_tool("get", {"key": "k0"})


def _config(path: Path) -> Path:
    path.write_text(
        f'[servers.counter]\ncommand = "{sys.executable}"\nargs = ["{COUNTER}"]\nsandbox = true\n'
    )
    return path


def _status(result: Any) -> str:
    return str((result.meta or {})[MATCH_META_KEY]["status"])


async def _timed(client: Client, tool: str, arguments: dict[str, Any]) -> tuple[float, str]:
    started = time.perf_counter()
    result = await client.call_tool(tool, arguments)
    return (time.perf_counter() - started) * 1000, _status(result)


async def _measure(db: Path, config: Path, tmp: Path, warm: int) -> dict[str, Any]:
    pool = sandbox_pool(load_config(config), pool=warm, max_instances=8)
    figures: dict[str, Any] = {"cold_ms": {}}
    async with replay_sim.serving(db, miss="sandbox", sandboxes=pool, index_dir=tmp / "index") as sim:
        async with Client(sim.episode().url("counter")) as client:  # the baseline: exact hits
            for i in range(max(PREFIXES)):  # to the state the recorded get(k0) was made from
                await client.call_tool("put", {"key": f"k{i}", "value": f"v{i}"})
            hits = [await _timed(client, "get", {"key": "k0"}) for _ in range(HITS)]
            await client.call_tool("get", {"key": "warm-up"})  # loads the model near misses use: not timed
        assert {status for _, status in hits} == {"exact"}, hits[:3]
        figures["hit_ms"] = statistics.median(ms for ms, _ in hits)
        for prefix in PREFIXES:
            if warm:  # let the pool refill: the cold call then finds a started instance
                with anyio.fail_after(60):
                    while sim.replay.policy.stats()["pool"]["counter"]["warm"] < warm:  # type: ignore[attr-defined]
                        await anyio.sleep(0.05)
            async with Client(sim.episode().url("counter")) as client:
                for i in range(prefix):
                    await client.call_tool("put", {"key": f"k{i}", "value": f"v{i}"})
                ms, status = await _timed(client, "put", {"key": "new", "value": "n"})
                assert status == "sandbox", status
                figures["cold_ms"][prefix] = ms
                warm_calls = [await _timed(client, "get", {"key": f"absent{i}"}) for i in range(WARM_CALLS)]
                assert {status for _, status in warm_calls} == {"sandbox"}
                figures.setdefault("warm_ms", []).extend(ms for ms, _ in warm_calls)
        calls = [("put", {"key": "k0", "value": "v0"}), ("put", {"key": "fresh", "value": "f"}),
                 ("get", {"key": "fresh"}), ("get", {"key": "k0"})]  # fmt: skip
        runs = []
        for _ in range(2):
            async with Client(sim.episode().url("counter")) as client:
                runs.append([_status(await client.call_tool(tool, arguments)) for tool, arguments in calls])
        figures["runs"] = runs
    figures["warm_ms"] = statistics.median(figures["warm_ms"])
    return figures


MEMORY = ROOT / "fixtures" / "node_modules" / ".bin" / "mcp-server-memory"
SNAPSHOT_PREFIXES = (4, 32, 256)
REPEATS = 3
"""Episodes measured per prefix length (the median is reported: the machine is shared)."""


def _entity(name: str) -> dict[str, Any]:
    return {"entities": [{"name": name, "entityType": "t", "observations": [f"about {name}"]}]}


async def _record_memory(db: Path, state: Path, writes: int) -> None:
    """One recorded session of server-memory: ``read_graph`` (its canary), then ``writes`` entities."""
    params = StdioServerParameters(
        command=REPLAY_SIM,
        args=["record", "--db", str(db), "--name", "memory", f"--env=MEMORY_FILE_PATH={state}", "--",
              str(MEMORY)],
        env=dict(os.environ),
    )  # fmt: skip
    async with Client(params, mode="legacy") as client:
        await client.call_tool("read_graph", {})
        for i in range(writes):
            await client.call_tool("create_entities", _entity(f"e{i}"))


async def _episode(sim: Any, prefix: int, then: list[str]) -> list[tuple[float, Any]]:
    """An episode: ``prefix`` recorded writes (cache hits), then ``open_nodes`` of each of ``then``."""
    async with Client(sim.episode().url("memory")) as client:
        for i in range(prefix):
            await client.call_tool("create_entities", _entity(f"e{i}"))
        timed = []
        for name in then:
            started = time.perf_counter()
            result = await client.call_tool("open_nodes", {"names": [name]})
            timed.append(((time.perf_counter() - started) * 1000, (result.meta or {})[MATCH_META_KEY]))
    await _written(sim)
    return timed


async def _written(sim: Any) -> None:
    with anyio.fail_after(60):  # its answers are recorded off the answer path
        while sim.replay.policy.log.waiting:
            await anyio.sleep(0.02)


async def _measure_snapshots(db: Path, config: Path, tmp: Path, warm: int, kept: int) -> dict[str, Any]:
    pool = sandbox_pool(load_config(config), pool=warm, max_instances=8, snapshots=kept)
    figures: dict[str, Any] = {"cold": {}}
    async with replay_sim.serving(db, miss="sandbox", sandboxes=pool, index_dir=tmp / "index") as sim:
        async with Client(sim.episode().url("memory")) as client:  # the baseline: exact hits
            hits = [await _timed(client, "read_graph", {}) for _ in range(HITS)]
        figures["hit_ms"] = statistics.median(ms for ms, _ in hits)
        for prefix in SNAPSHOT_PREFIXES:
            if kept:  # another episode's instance reaches that state first (and is snapshotted)
                await _episode(sim, prefix, [f"seed-{prefix}"])
            colds = []
            for n in range(REPEATS):
                if warm:  # the pool refilled: a started instance is at hand
                    with anyio.fail_after(60):
                        while sim.replay.policy.stats()["pool"]["memory"]["warm"] < warm:  # type: ignore[attr-defined]
                            await anyio.sleep(0.05)
                then = [f"cold-{prefix}-{n}", *(f"warm-{n}-{i}" for i in range(WARM_CALLS // REPEATS))]
                (cold_ms, cold), *rest = await _episode(sim, prefix, then)
                assert cold["status"] == "sandbox", cold
                colds.append((cold_ms, cold["sandbox"]["replayed"]))
                figures.setdefault("warm_ms", []).extend(ms for ms, _ in rest)
                figures.setdefault("own_ms", []).extend(meta["sandbox"]["latency_ms"] for _, meta in rest)
            figures["cold"][prefix] = (statistics.median(ms for ms, _ in colds), max(r for _, r in colds))
        figures["stats"] = sim.replay.policy.stats()["snapshots"]  # type: ignore[attr-defined]
    figures["warm_ms"] = statistics.median(figures["warm_ms"])
    figures["own_ms"] = statistics.median(figures["own_ms"])
    return figures


def snapshots() -> None:
    """Print cold answers re-played and started from state snapshots, by prefix length, with ratios."""
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        db = tmp / "replay.db"
        anyio.run(_record_memory, db, tmp / "recorded.jsonl", max(SNAPSHOT_PREFIXES))
        config = tmp / "record.toml"
        graph = f"{os.environ.get('HOME', '/root')}/replay-sim-bench-{uuid.uuid4().hex}.jsonl"  # in its layer
        config.write_text(f'[servers.memory]\ncommand = "{MEMORY}"\n'
                          f'env = {{ MEMORY_FILE_PATH = "{graph}" }}\nsandbox = true\n')  # fmt: skip
        for warm in (0, 1):
            runs = {}
            for kept in (0, 64):
                fresh = Path(shutil.copy(db, tmp / f"memory-{warm}-{kept}.db"))
                runs[kept] = anyio.run(_measure_snapshots, fresh, config, tmp, warm, kept)
            hit = runs[0]["hit_ms"]
            print(f"server-memory, --sandbox-pool {warm}: cache hit {hit:.2f} ms (baseline)")
            for prefix in SNAPSHOT_PREFIXES:
                (plain, replayed), (started, restored) = runs[0]["cold"][prefix], runs[64]["cold"][prefix]
                print(
                    f"  first unrecorded call after {prefix:>2} recorded writes: re-played ({replayed}) "
                    f"{plain:.0f} ms ({plain / hit:.0f}x hit); snapshots on ({restored} re-played) "
                    f"{started:.0f} ms ({started / hit:.0f}x hit, {started / plain:.2f}x re-played)"
                )
            for kept, figures in runs.items():
                warm_ms, own_ms = figures["warm_ms"], figures["own_ms"]
                print(
                    f"  snapshots {kept}: warm answer {warm_ms:.1f} ms ({warm_ms / hit:.1f}x hit), "
                    f"the instance's own latency {own_ms:.2f} ms; {figures['stats']}"
                )


def main() -> None:
    """Print the figures and their ratios to a cache hit."""
    if "snapshots" in sys.argv[1:]:
        snapshots()
        return
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        db = tmp / "replay.db"
        anyio.run(_record, db, max(PREFIXES))
        config = _config(tmp / "record.toml")
        for warm in (0, 1):
            fresh = Path(shutil.copy(db, tmp / f"run-{warm}.db"))  # nothing the other run recorded
            figures = anyio.run(_measure, fresh, config, tmp, warm)
            hit = figures["hit_ms"]
            print(f"--sandbox-pool {warm}: cache hit {hit:.2f} ms (baseline)")
            for prefix, ms in figures["cold_ms"].items():
                print(
                    f"  cold sandbox answer after {prefix:>2} recorded writes: {ms:.1f} ms ({ms / hit:.0f}x)"
                )
            warm_ms = figures["warm_ms"]
            print(f"  warm sandbox answer (bound instance): {warm_ms:.2f} ms ({warm_ms / hit:.1f}x)")
            first, second = figures["runs"]
            print(f"  same calls, first run: {first}; second run: {second}")
    snapshots()


if __name__ == "__main__":
    main()
