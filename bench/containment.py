"""The cost of containment: a sandbox instance's start and first call, confined and unconfined, same run.

For the echo fixture server (Python) and server-memory (node), it acquires a fresh instance from a
pool with no warm instances (a cold start: launch, namespaces, overlay, cgroups, ``initialize``),
makes one call (a warm answer), and closes it; rounds alternate confined and unconfined so the
machine's load falls on both alike. It prints medians and the ratios confined / unconfined.

    python -m bench.containment [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from replay_sim.record.config_file import parse_config
from replay_sim.record.instances import InstancePool

ROOT = Path(__file__).resolve().parent.parent
SERVERS: dict[str, tuple[dict[str, Any], tuple[str, dict[str, Any]]]] = {
    "echo": (
        {"command": sys.executable, "args": [str(ROOT / "fixtures" / "echo_server.py")]},
        ("echo", {"text": "hello"}),
    ),
    "memory": (
        {"command": str(ROOT / "fixtures" / "node_modules" / ".bin" / "mcp-server-memory"),
         "env": {"MEMORY_FILE_PATH": "{state}/memory.jsonl"}},
        ("read_graph", {}),
    ),
}  # fmt: skip


async def _round(server: str, unconfined: bool, state: Path) -> tuple[float, float]:
    """Seconds to acquire a cold instance, and for one call to it."""
    entry, (tool, arguments) = SERVERS[server]
    extra = {"state": str(state)} if "env" in entry else {}
    config = parse_config({"servers": {server: {**entry, **extra, "sandbox": True}}})
    async with InstancePool(config, pool=0, unconfined=unconfined) as pool:
        began = time.perf_counter()
        instance = await pool.acquire(server, timeout=60)
        started = time.perf_counter()
        answer = await instance.call("tools/call", {"name": tool, "arguments": arguments})
        called = time.perf_counter()
        assert answer["error"] is None, answer
        await instance.close()
    return started - began, called - started


async def _measure(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        state.mkdir()
        print(f"{'server':8} {'':10} {'cold start ms':>14} {'call ms':>9}")
        for server in SERVERS:
            times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            for _ in range(rounds):
                for unconfined in (False, True):
                    times[unconfined].append(await _round(server, unconfined, state))
            medians = {
                u: (statistics.median(t[0] for t in v) * 1000, statistics.median(t[1] for t in v) * 1000)
                for u, v in times.items()
            }
            for unconfined, label in ((True, "unconfined"), (False, "confined")):
                start, call = medians[unconfined]
                print(f"{server:8} {label:10} {start:14.1f} {call:9.2f}")
            ratio_start = medians[False][0] / medians[True][0]
            ratio_call = medians[False][1] / medians[True][1]
            print(f"{server:8} {'ratio':10} {ratio_start:13.2f}x {ratio_call:8.2f}x")


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    anyio.run(_measure, parser.parse_args().rounds)


if __name__ == "__main__":
    main()
