"""Ray Serve scale-out vs the single-process server, over one frozen snapshot, in one run.

The snapshot is frozen from the demo's memory-server recordings. The single-process server is
``replay-sim serve --snapshot`` in a subprocess; the Ray deployment is :mod:`replay_sim.scale`
(Serve proxy -> gateway -> replica) on a local Ray started here with ``num_cpus=2``. This process
is the client; every request is a 2026-era ``tools/call`` of ``read_graph`` (an exact hit) carrying
an ``X-Replay-Episode`` header. Reported:

- exact-hit round trip (median of sequential calls of one episode): Ray (1 replica) / single —
  the cost of the two extra hops (proxy -> gateway -> replica);
- throughput at 256 concurrent episodes (calls/s): single, Ray with 1 replica, Ray with 2 replicas.

The machine is shared (other jobs come and go), so Ray and single-server measurements alternate,
three rounds each, best kept, and each Ray figure is set against the single server measured in the
same minutes.

What two cores can show: the hop cost, and that affinity routing adds no stall under load. What
they cannot: the client, the proxy, the gateway and both replicas share the same two cores, so a
second replica has no core of its own and 2-vs-1 replica throughput stays near 1x here; on a
cluster each replica brings its own cores (the docs' "Running for real", "Scaling out", do the arithmetic).

Run with ``python -m bench ray`` (or ``python -m bench.ray``; not ``python bench/ray.py``, whose
folder would shadow the ``ray`` package).
"""

from __future__ import annotations

import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2

DEMO = Path(__file__).parents[1] / "replay_sim" / "cli" / "demo_data" / "memory.jsonl"
HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": "2026-07-28",
    "Mcp-Method": "tools/call",
    "Mcp-Name": "read_graph",
}
BODY = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {},
        },
        "name": "read_graph",
        "arguments": {},
    },
}
ROUND_TRIPS = 300
WARMUP = 30
EPISODES = 256
CALLS = 8


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_snapshot(folder: Path) -> Path:
    from replay_sim import Store, freeze
    from replay_sim.store.interchange import import_jsonl

    store = Store(folder / "memory.db")
    import_jsonl(store, DEMO)
    store.close()
    return freeze(folder / "memory.db", folder / "snapshot").path


def wait_ready(base: str, deadline_s: float = 300) -> None:
    deadline = time.monotonic() + deadline_s
    answer = "no answer"
    while True:
        with contextlib.suppress(httpx2.TransportError):
            response = httpx2.get(f"{base}/api/ready", timeout=5)
            if response.status_code == 200:
                return
            answer = f"{response.status_code} {response.text[:200]}"
        if time.monotonic() > deadline:
            raise RuntimeError(f"{base} did not become ready: {answer}")
        time.sleep(0.2)


@contextlib.contextmanager
def single(snapshot: Path) -> Iterator[str]:
    """``replay-sim serve --snapshot`` in a subprocess; yields its base URL."""
    port = free_port()
    replay_sim = str(Path(sys.executable).parent / "replay-sim")
    command = [replay_sim, "serve", "--snapshot", str(snapshot), "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


async def round_trip(base: str, *_: str) -> float:
    """Median seconds of one sequential exact-hit call of one episode."""
    headers = HEADERS | {"X-Replay-Episode": "round-trip"}
    async with httpx2.AsyncClient(base_url=base, timeout=60) as http:
        times = []
        for i in range(WARMUP + ROUND_TRIPS):
            started = time.perf_counter()
            response = await http.post("/mcp/memory", json=BODY, headers=headers)
            if i >= WARMUP:
                times.append(time.perf_counter() - started)
            assert response.status_code == 200 and b'"exact"' in response.content, response.text
    return statistics.median(times)


async def throughput(base: str, tag: str) -> float:
    """Calls per second of :data:`EPISODES` concurrent episodes making :data:`CALLS` calls each."""
    limits = httpx2.Limits(max_connections=EPISODES, max_keepalive_connections=EPISODES)
    async with httpx2.AsyncClient(base_url=base, timeout=120, limits=limits) as http:

        async def episode(i: int) -> None:
            headers = HEADERS | {"X-Replay-Episode": f"{tag}-{i}"}
            for _ in range(CALLS):
                response = await http.post("/mcp/memory", json=BODY, headers=headers)
                assert response.status_code == 200, response.text

        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for i in range(EPISODES):
                group.start_soon(episode, i)
        return EPISODES * CALLS / (time.perf_counter() - started)


ROUNDS = 3
"""Measurements alternate single / Ray this many times; the best of each is kept (the machine is shared)."""


def best(measure: Any, base: str, tag: str, *, lower: bool) -> float:
    figures = [anyio.run(measure, base, *([f"{tag}-{i}"] if tag else [])) for i in range(ROUNDS)]
    return min(figures) if lower else max(figures)


def main() -> dict[str, Any]:
    """Run the benchmark and print the figures and ratios.

    Phase 1 deploys one replica: round trip and throughput, alternating with the single server.
    Phase 2 redeploys with two replicas: throughput, again alternating with the single server, so
    each Ray figure is compared with the single server measured in the same minutes.
    """
    import ray
    from ray import serve

    from replay_sim.scale.deploy import APP_NAME, ScaleSettings, build_app

    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, single(make_snapshot(Path(tmp))) as alone:
        snapshot = Path(tmp) / "snapshot"
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        try:
            port = free_port()
            scaled = f"http://127.0.0.1:{port}"
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            for replicas in (1, 2):
                settings = ScaleSettings(str(snapshot), replicas=replicas, replica_cpus=0.5, port=port)
                serve.run(build_app(settings), name=APP_NAME)
                wait_ready(scaled)
                anyio.run(throughput, scaled, f"warm-{replicas}")
                figures: dict[str, float] = {}
                if replicas == 1:
                    anyio.run(throughput, alone, "warm")
                    figures["single_round_trip_ms"] = best(round_trip, alone, "", lower=True) * 1000
                    figures["ray_round_trip_ms"] = best(round_trip, scaled, "", lower=True) * 1000
                figures["single_throughput"] = best(throughput, alone, f"s{replicas}", lower=False)
                figures["ray_throughput"] = best(throughput, scaled, f"r{replicas}", lower=False)
                report[f"{replicas}_replica{'s' if replicas > 1 else ''}"] = figures
        finally:
            with contextlib.suppress(Exception):
                serve.shutdown()
            ray.shutdown()
    one, two = report["1_replica"], report["2_replicas"]
    report["round_trip_ratio_ray_vs_single"] = one["ray_round_trip_ms"] / one["single_round_trip_ms"]
    report["throughput_ratio_ray1_vs_single"] = one["ray_throughput"] / one["single_throughput"]
    report["throughput_ratio_ray2_vs_single"] = two["ray_throughput"] / two["single_throughput"]
    report["throughput_ratio_ray2_vs_ray1"] = (
        report["throughput_ratio_ray2_vs_single"] / report["throughput_ratio_ray1_vs_single"]
    )
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    from replay_sim.resolve.runtime import configure_runtime

    configure_runtime()
    main()
