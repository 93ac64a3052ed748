"""Sandboxes at the cap: what a state snapshot of a reclaimed instance costs, and what it saves.

With ``--max-sandboxes 1`` and the real server-memory (its graph a file in its instance's layer),
each round: episode A makes one recorded write (a cache hit) then ``writes`` unrecorded ones (its
own instance), episode B's unrecorded call takes the one place (A's instance is reclaimed), then
A's next call takes it back (B's is reclaimed) and rebuilds A's state. Reported per setting, with
state snapshots off (``--sandbox-snapshots 0``) and on: B's call (the caller waiting while A's
instance is snapshotted and ended, then a process start), A's rebuild, and the snapshot at reclaim
itself (the probe and the copy, timed around the policy's ``keep``). Medians of ``ROUNDS`` rounds.

Run with ``python -m bench.sandbox_reclaim`` (or ``python -m bench``).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

import replay_sim
from bench.sandbox import MEMORY, _entity, _record_memory
from replay_sim.record.config_file import load_config
from replay_sim.record.instances.building import sandbox_pool

WRITES = (4, 64)
ROUNDS = 6


async def _measure(db: Path, config: Path, tmp: Path, writes: int, kept: int) -> dict[str, Any]:
    pool = sandbox_pool(load_config(config), pool=0, max_instances=1, snapshots=kept)
    keeps: list[float] = []
    waits: list[float] = []
    rebuilds: list[float] = []
    served = {"sandboxes": pool, "index_dir": tmp / f"index-{writes}-{kept}", "sandbox_idle": None}
    async with replay_sim.serving(db, miss="sandbox", **served) as sim:
        keeper: Any = sim.replay.policy.keeper  # type: ignore[attr-defined]
        keep = keeper.keep

        async def timed(instance: Any, made: list[Any], reclaimed: bool) -> None:
            started = time.perf_counter()
            await keep(instance, made, reclaimed)
            if reclaimed and len(made) > 1:  # A's instance (B's made one call: nothing to keep)
                keeps.append((time.perf_counter() - started) * 1000)

        keeper.keep = timed
        for n in range(ROUNDS):
            async with (
                Client(sim.episode(f"a{n}").url("memory")) as a,
                Client(sim.episode(f"b{n}").url("memory")) as b,
            ):
                await a.call_tool("create_entities", _entity("e0"))  # recorded: a cache hit
                for i in range(writes):
                    await a.call_tool("create_entities", _entity(f"a{n}-{i}"))
                started = time.perf_counter()
                await b.call_tool("create_entities", _entity(f"b{n}"))  # reclaims A's instance
                waits.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                await a.call_tool("open_nodes", {"names": ["e0"]})  # reclaims B's: A rebuilt
                rebuilds.append((time.perf_counter() - started) * 1000)
        stats = sim.replay.policy.stats()["snapshots"]  # type: ignore[attr-defined]
    return {"keeps": keeps, "waits": waits, "rebuilds": rebuilds, "stats": stats}


def main() -> None:
    """Print B's wait, A's rebuild and the snapshot at reclaim, snapshots off and on."""
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        db = tmp / "replay.db"
        anyio.run(_record_memory, db, tmp / "recorded.jsonl", 1)
        config = tmp / "record.toml"
        graph = f"{os.environ.get('HOME', '/root')}/replay-sim-bench-{uuid.uuid4().hex}.jsonl"  # in its layer
        config.write_text(f'[servers.memory]\ncommand = "{MEMORY}"\n'
                          f'env = {{ MEMORY_FILE_PATH = "{graph}" }}\nsandbox = true\n')  # fmt: skip
        for writes in WRITES:
            for kept in (0, 64):
                fresh = Path(shutil.copy(db, tmp / f"memory-{writes}-{kept}.db"))  # none of another run's
                figures = anyio.run(_measure, fresh, config, tmp, writes, kept)
                wait, rebuild = statistics.median(figures["waits"]), statistics.median(figures["rebuilds"])
                keeps = figures["keeps"]
                snapshot = f"{statistics.median(keeps):.0f} ms (max {max(keeps):.0f})" if kept else "off"
                stats = figures["stats"]
                print(
                    f"--max-sandboxes 1, {writes:>2} writes, snapshots {kept:>2}: B's call {wait:.0f} ms, "
                    f"A's rebuild {rebuild:.0f} ms, snapshot at reclaim {snapshot}; taken {stats['taken']} "
                    f"(at reclaim {stats['reclaimed']}), started {stats['started']}, "
                    f"bytes {(stats['store'] or {}).get('bytes')}"
                )


if __name__ == "__main__":
    main()
