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

Run with ``python -m bench.sandbox`` (or ``python -m bench``).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

import replay_sim
from replay_sim import MATCH_META_KEY
from replay_sim.cli.sandboxes import sandbox_pool
from replay_sim.record.config_file import load_config

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


def main() -> None:
    """Print the figures and their ratios to a cache hit."""
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


if __name__ == "__main__":
    main()
