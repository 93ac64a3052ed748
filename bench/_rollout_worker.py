"""One rollout worker of the trainer, as a process of its own: a share of a pass's episodes.

A trainer's rollouts run in many processes (Ray actors, one per environment worker), not in one
Python process whose MCP clients share a core. :func:`~bench.sandbox_scale.in_workers` starts
these workers, hands each its episodes and the truth to check them against, and starts them all at
once; each plays its episodes as :func:`~bench.sandbox_scale.replayed` does and says how it went.

    python -m bench._rollout_worker URL RUN CONCURRENCY

Reads one JSON line (``{"episodes": [...], "truth": {...}}``), prints ``ready``, waits for a line
(go), plays, and prints one JSON line: the answers' tally, why calls missed, the slowest call and
its own CPU seconds.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import anyio
import httpx2

from bench._cpu import own_cpu
from bench.sandbox_scale import MISSED, Served, replayed


async def play(url: str, run: str, concurrency: int) -> None:
    order = json.loads(sys.stdin.readline())
    truth = {int(i): answers for i, answers in order["truth"].items()}
    tally: Counter[str] = Counter()
    slowest: list[float] = []
    async with httpx2.AsyncClient(timeout=120) as http, httpx2.AsyncClient(timeout=120) as shared:
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        began = own_cpu()[0]
        sim = Served(url, http, 0)
        await replayed(sim, order["episodes"], run, truth, tally, slowest, shared, concurrency)
        cpu = own_cpu()[0] - began
    said = {"tally": dict(tally), "missed": dict(MISSED), "slowest": max(slowest, default=0.0), "cpu": cpu}
    print(json.dumps(said), flush=True)


if __name__ == "__main__":
    anyio.run(play, sys.argv[1], sys.argv[2], int(sys.argv[3]))
