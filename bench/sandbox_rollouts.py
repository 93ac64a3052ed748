"""Sandboxes under an RL-shaped load: concurrent episodes writing what nobody recorded, reading it back.

The real ``@modelcontextprotocol/server-memory`` (state in the file ``MEMORY_FILE_PATH`` names:
``isolation = "state"``, a copy of an empty pristine directory per instance) is recorded once
through the real recorder (one ``read_graph`` on the empty graph), then served in this process
with ``--miss sandbox`` over HTTP. 64, then 256, episodes run at once on episode URLs, each making
four calls no recording has — ``create_entities`` of an entity named after the episode,
``add_observations`` to it, ``open_nodes`` and ``read_graph`` — then ending (its instance ends with
it). The cap on live instances (``--max-sandboxes``, ``CAP`` here) is below the episode count, so
episodes queue for an instance (``--sandbox-timeout``, ``WAIT`` here); one that waits longer gets
a miss saying so, counted as such.

Every answer (content and structured content, ``isError``) is checked against what a live run of
the real server gives: one live run of a template episode, whose entity name is swapped for each
episode's (names of one length, so the server's JSON layout is the same) — and, first, that swap
is checked against full live runs of a few episodes. A second pass of the same episodes (new
episode ids) must be answered from the cache alone.

Reported per size: instances started, peak live instances, memory per instance (the pool's
figures, the resident set of each instance's process group), calls/s, p50/p99 per call, answers by
tier, wrong answers and misses; then the second pass.

Run with ``python -m bench sandbox_rollouts`` (or ``python -m bench.sandbox_rollouts``).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

import replay_sim
from bench.load import percentile
from replay_sim import MATCH_META_KEY
from replay_sim.record.config_file import load_config
from replay_sim.record.instances.building import sandbox_pool

ROOT = Path(__file__).resolve().parent.parent
MEMORY = ROOT / "fixtures" / "node_modules" / ".bin" / "mcp-server-memory"
REPLAY_SIM = str(Path(sys.executable).parent / "replay-sim")
SIZES = (64, 256)
CAP = 32
"""Live instances at most (``--max-sandboxes``): 32 x ~70 MB."""
WARM = 4
"""Warm instances kept per server (``--sandbox-pool``)."""
WAIT = 600.0
"""Seconds a call waits for an instance (``--sandbox-timeout``) before it is a miss."""
TEMPLATE = "rXXX-eXXXX"
LIVE_CHECKS = 3


def name(size: int, episode: int) -> str:
    """The entity an episode writes: unique per run and episode, always ``len(TEMPLATE)`` long."""
    return f"r{size:03d}-e{episode:04d}"


def calls(entity: str) -> list[tuple[str, dict[str, Any]]]:
    """One episode's calls: a write nobody recorded, another, and two reads of what it wrote."""
    return [
        ("create_entities", {"entities": [{"name": entity, "entityType": "probe",
                                           "observations": [f"written by {entity}"]}]}),
        ("add_observations", {"observations": [{"entityName": entity, "contents": [f"then {entity}"]}]}),
        ("open_nodes", {"names": [entity]}),
        ("read_graph", {}),
    ]  # fmt: skip


def answer(result: Any) -> str:
    """What is compared: content, structured content and ``isError``, as canonical JSON."""
    dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return json.dumps({k: dumped.get(k) for k in ("content", "structuredContent", "isError")}, sort_keys=True)


def _live(entity: str, state: Path) -> StdioServerParameters:
    state.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MEMORY_FILE_PATH": str(state / "memory.jsonl")}
    return StdioServerParameters(command=str(MEMORY), env=env)


async def live_run(entity: str, state: Path) -> list[str]:
    """The answers a fresh real server gives to one episode's calls."""
    async with Client(_live(entity, state), mode="legacy") as client:
        return [answer(await client.call_tool(tool, arguments)) for tool, arguments in calls(entity)]


async def record_memory(db: Path, state: Path) -> None:
    """One recorded session through the real recorder CLI: ``read_graph`` on the empty graph."""
    params = StdioServerParameters(
        command=REPLAY_SIM,
        args=["record", "--db", str(db), "--name", "memory",
              f"--env=MEMORY_FILE_PATH={state / 'memory.jsonl'}", "--", str(MEMORY)],
        env=dict(os.environ),  # the replay_sim this runs (PYTHONPATH), not only the SDK's safe variables
    )  # fmt: skip
    async with Client(params, mode="legacy") as client:
        await client.call_tool("read_graph", {})


def memory_config(path: Path, pristine: Path) -> Path:
    """A recorder config declaring server-memory a sandbox whose pristine state is ``pristine`` (made)."""
    pristine.mkdir()
    path.write_text(
        f'[servers.memory]\ncommand = "{MEMORY}"\nenv = {{ MEMORY_FILE_PATH = "{{state}}/memory.jsonl" }}\n'
        f'sandbox = true\nstate = "{pristine}"\n'
    )
    return path


async def _episode(
    sim: Any, entity: str, expected: list[str], tally: Counter[str], latencies: list[float]
) -> None:
    async with sim.episode() as episode, Client(episode.url("memory")) as client:
        for (tool, arguments), want in zip(calls(entity), expected, strict=True):
            started = time.perf_counter()
            result = await client.call_tool(tool, arguments)
            latencies.append((time.perf_counter() - started) * 1000)
            status = str((result.meta or {})[MATCH_META_KEY]["status"])
            if status == "miss":
                tally["miss"] += 1
                return  # its later calls would be read after a write it did not make
            tally[status] += 1
            if answer(result) != want:
                tally["wrong"] += 1


async def _pass(sim: Any, pool: Any, size: int, truth: dict[str, list[str]]) -> dict[str, Any]:
    tally: Counter[str] = Counter()
    latencies: list[float] = []
    peak = {"live": 0}
    memory: list[int] = []
    done = anyio.Event()

    async def watch() -> None:
        while not done.is_set():
            stats = pool.stats()["memory"]
            peak["live"] = max(peak["live"], stats["live"])
            memory.extend(m for m in stats["memory_bytes"].values() if m)
            with anyio.move_on_after(0.25):
                await done.wait()

    before = pool.stats()["memory"]["started"]
    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        async with anyio.create_task_group() as episodes:
            for i in range(size):
                entity = name(size, i)
                episodes.start_soon(_episode, sim, entity, truth[entity], tally, latencies)
        done.set()
    wall = time.perf_counter() - started
    return {
        "tally": {"sandbox": 0, "exact": 0, "wrong": 0, "miss": 0, **tally},
        "instances": pool.stats()["memory"]["started"] - before,
        "peak_live": peak["live"],
        "memory_mb": statistics.median(memory) / 2**20 if memory else None,
        "calls_per_s": len(latencies) / wall,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "wall_s": wall,
    }


async def _measure(
    db: Path, config: Path, tmp: Path, size: int, truth: dict[str, list[str]]
) -> list[dict[str, Any]]:
    pool = sandbox_pool(load_config(config), pool=WARM, max_instances=CAP)
    async with replay_sim.serving(
        db, miss="sandbox", sandboxes=pool, sandbox_timeout=WAIT, max_episodes=2 * size,
        index_dir=tmp / f"index-{size}",
    ) as sim:  # fmt: skip
        return [await _pass(sim, pool, size, truth) for _ in range(2)]


def _truth(tmp: Path) -> dict[str, list[str]]:
    """Every episode's expected answers: the template's live answers, its name swapped, checked live."""
    template = anyio.run(live_run, TEMPLATE, tmp / "live-template")
    truth = {
        name(size, i): [a.replace(TEMPLATE, name(size, i)) for a in template]
        for size in SIZES
        for i in range(size)
    }
    for k, entity in enumerate([name(SIZES[0], 0), name(SIZES[-1], SIZES[-1] - 1)][:LIVE_CHECKS]):
        assert anyio.run(live_run, entity, tmp / f"live-{k}") == truth[entity], entity
    return truth


def main() -> None:
    """Print each size's figures, first pass (instances answer) then second (the cache answers)."""
    print(f"load before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        truth = _truth(tmp)
        db = tmp / "replay.db"
        anyio.run(record_memory, db, tmp / "record-state")
        config = memory_config(tmp / "record.toml", tmp / "pristine")
        for size in SIZES:
            fresh = Path(shutil.copy(db, tmp / f"run-{size}.db"))
            for label, figures in zip(
                ("first", "second"), anyio.run(_measure, fresh, config, tmp, size, truth), strict=True
            ):
                memory = figures["memory_mb"]
                print(
                    f"{size} episodes x 4 calls, {label} pass: answers {figures['tally']}; "
                    f"instances started {figures['instances']}, peak live {figures['peak_live']} "
                    f"(cap {CAP}), memory per instance {memory and f'{memory:.0f} MB'}; "
                    f"{figures['calls_per_s']:.1f} calls/s, p50 {figures['p50']:.0f} ms, "
                    f"p99 {figures['p99']:.0f} ms ({figures['wall_s']:.0f} s)",
                    flush=True,
                )
    print(f"load after: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
