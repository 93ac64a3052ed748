"""Sandbox episodes through Ray Serve, 1 replica against 2, in one run (issue 28 item 6).

The episodes of :mod:`bench.sandbox_scale` (each creates an entity nobody recorded, adds an
observation, opens it and reads the graph) on the real ``@modelcontextprotocol/server-memory``:
first each on its own real server over stdio (the baseline, and the truth every answer is checked
against), then through ``replay-sim serve --ray --miss sandbox`` on a local Ray (``num_cpus=2``)
with 1 replica, then with 2 — the same episodes (new episode ids), every ``serve`` option at its
default. Each replica builds its own instance pool from the recorder config; an episode's every
call reaches the replica holding its instance (its id is in the URL).

A snapshot is read-only, so the resolver never sees the sandbox answers (they go to the side
store): every call of an episode that wrote is its instance's answer, on each pass.

Reported per replica count: wall time (and its ratio to the direct run and to 1 replica), answers
by tier and wrong ones; per replica: episodes' answers, instances started, peak live instances,
median memory per instance (the resident set of its process group), the replica process's own
resident set (the actor: the replay, its index; the embedding model loads only when a call needs a
similarity lookup, which a sandbox answer does not) and its CPU per answer (from the moment it was
first found, an instance's parent, to the end: starting instances and re-playing included); with
1 replica, also its CPU per answer of an instance already bound (:data:`WARM_CALLS` reads).

On a 2-core machine a second replica has no core of its own: the client, Serve's proxy, both
replicas and every instance share the two, so 2 replicas are not expected to be faster here;
what the run shows is the per-replica figures a sizing rests on (``docs/sandboxes-scale.md``).

Run with ``python -m bench ray_sandbox`` (``python -m bench.ray_sandbox [EPISODES]``).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client

from bench.ray import free_port, wait_ready
from bench.sandbox_rollouts import answer, calls, memory_config, record_memory
from bench.sandbox_scale import CONCURRENCY, direct, entity, limited, status

EPISODES = 64
WARM_CALLS = 100
DIRECT = "dir00"
"""The direct run's id (each run's entity names are one length: see :func:`bench.sandbox_scale.entity`)."""
POLL = 1.0
"""Seconds between two reads of each replica's figures during a run."""
REPLICA_TITLE = b"ray::ServeReplica"
"""How a Serve replica actor's process names itself (its command line)."""


def rss(pid: int) -> int | None:
    """Resident bytes of one process, or None when it is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds one process has used, or None when it is gone."""
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        fields = stat[stat.rfind(b")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return None


def replica_process(instance_pid: int) -> int | None:
    """The Serve replica process an instance was started by (its nearest such ancestor), or None."""
    pid = instance_pid
    for _ in range(16):
        try:
            status_text = Path(f"/proc/{pid}/status").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        if cmdline.startswith(REPLICA_TITLE):
            return pid
        pid = int(next(line.split()[1] for line in status_text.splitlines() if line.startswith("PPid:")))
        if pid <= 1:
            return None
    return None


class Watch:
    """Each replica's sandbox figures, read every :data:`POLL` seconds while episodes run."""

    def __init__(self, http: httpx2.AsyncClient) -> None:
        self.http = http
        self.peak: Counter[str] = Counter()
        self.memory: dict[str, list[int]] = {}
        self.process: dict[str, int] = {}
        self.cpu: dict[str, tuple[float, float]] = {}
        """Per replica: its process's CPU seconds when first found, and when last read."""
        self.last: dict[str, dict[str, Any]] = {}

    async def read(self) -> None:
        replicas = (await self.http.get("/scale/replicas")).json()["replicas"]
        for replica in replicas:
            got = await self.http.get("/api/stats", headers={"X-Replay-Replica": replica})
            figures = got.json()["sandbox"]
            pool = figures["pool"]["memory"]
            self.last[replica] = figures
            self.peak[replica] = max(self.peak[replica], pool["live"])
            self.memory.setdefault(replica, []).extend(m for m in pool["memory_bytes"].values() if m)
            for pid in pool["pids"].values():
                found = replica_process(pid)
                if found is not None:
                    self.process[replica] = found
            used = cpu_seconds(self.process[replica]) if replica in self.process else None
            if used is not None:
                self.cpu[replica] = (self.cpu.get(replica, (used, used))[0], used)

    async def run(self, done: anyio.Event) -> None:
        while not done.is_set():
            with contextlib.suppress(httpx2.HTTPError):
                await self.read()
            with anyio.move_on_after(POLL):
                await done.wait()


async def scaled(base: str, tag: str, truth: dict[int, list[str]]) -> dict[str, Any]:
    """The episodes on episode URLs of the deployment: wall time, answers, per-replica figures."""
    tally: Counter[str] = Counter()
    slowest: list[float] = []

    async def episode(i: int) -> None:
        async with Client(f"{base}/episodes/{tag}-{i}/mcp/memory", mode="legacy") as client:
            for (tool, arguments), want in zip(calls(entity(tag, i)), truth[i], strict=True):
                started = time.perf_counter()
                result = await client.call_tool(tool, arguments)
                slowest.append(time.perf_counter() - started)
                tally[status(result)] += 1
                tally["wrong"] += answer(result) != want.replace(entity(DIRECT, i), entity(tag, i))

    limits = httpx2.Limits(max_connections=32)
    async with httpx2.AsyncClient(base_url=base, timeout=120, limits=limits) as http:
        watch = Watch(http)
        done = anyio.Event()
        async with anyio.create_task_group() as group:
            group.start_soon(watch.run, done)
            wall = await limited(len(truth), CONCURRENCY, episode)
            done.set()
        await watch.read()  # the counters at the end
        warm = await warm_answers(base, tag, watch) if len(watch.process) == 1 else None
    replicas = {}
    for replica, figures in watch.last.items():
        pool = figures["pool"]["memory"]
        memory = watch.memory.get(replica)
        process = watch.process.get(replica)
        first, last = watch.cpu.get(replica, (0.0, 0.0))
        replicas[replica] = {
            "answers": figures["answers"],
            "instances_started": pool["started"],
            "peak_live": watch.peak[replica],
            "instance_mb": statistics.median(memory) / 2**20 if memory else None,
            "replica_rss_mb": (rss(process) or 0) / 2**20 if process else None,
            "replica_cpu_ms_per_answer": (last - first) * 1000 / figures["answers"]
            if figures["answers"]
            else None,
        }
    return {"wall_s": wall, "tally": dict(tally), "slowest_s": max(slowest), "replicas": replicas,
            "warm_cpu_ms": warm}  # fmt: skip


async def warm_answers(base: str, tag: str, watch: Watch) -> float | None:
    """The replica's CPU per sandbox answer of an instance already bound (no start, no re-play), in ms:
    one episode's :data:`WARM_CALLS` reads after its write, on a one-replica deployment."""
    (process,) = watch.process.values()
    async with Client(f"{base}/episodes/{tag}-warm/mcp/memory", mode="legacy") as client:
        await client.call_tool(*calls(entity(tag, 99_999))[0])  # binds an instance
        before = cpu_seconds(process)
        for n in range(WARM_CALLS):
            result = await client.call_tool("open_nodes", {"names": [f"absent-{n}"]})
            assert status(result) == "sandbox", status(result)
        after = cpu_seconds(process)
    return None if before is None or after is None else (after - before) * 1000 / WARM_CALLS


def deploy_and_run(snapshot: Path, config: Path, truth: dict[int, list[str]]) -> dict[int, dict[str, Any]]:
    """1 replica, then 2, on one local Ray; the figures of each."""
    import ray
    from ray import serve

    from replay_sim.scale.deploy import APP_NAME, ScaleSettings, build_app

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    runs: dict[int, dict[str, Any]] = {}
    try:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for replicas in (1, 2):
            settings = ScaleSettings(
                str(snapshot), replicas=replicas, replica_cpus=0.5, port=port, miss="sandbox",
                config=str(config),
            )  # fmt: skip
            serve.run(build_app(settings), name=APP_NAME)
            wait_ready(base)
            runs[replicas] = anyio.run(scaled, base, f"ray{replicas:02d}", truth)
            serve.delete(APP_NAME)  # its replicas end, and their instances with them
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
    return runs


def main() -> dict[str, Any]:
    """Print the direct run, then 1 and 2 replicas: wall time, ratios, per-replica figures."""
    from replay_sim import freeze

    size = next((int(a) for a in sys.argv[1:] if a.isdigit()), EPISODES)
    print(f"load before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        db = tmp / "replay.db"
        anyio.run(record_memory, db, tmp / "record-state")
        config = memory_config(tmp / "record.toml", tmp / "pristine")
        snapshot = freeze(db, tmp / "snapshot").path
        direct_s, truth = anyio.run(direct, size, DIRECT, tmp)
        runs = deploy_and_run(snapshot, config, truth)
    print(f"{size} episodes x 4 calls, {CONCURRENCY} at a time, through Ray Serve (num_cpus=2):")
    print(f"  the real server, one process per episode (stdio): {direct_s:.1f} s (1x)")
    for replicas, figures in runs.items():
        wall = figures["wall_s"]
        print(f"  {replicas} replica{'s' if replicas > 1 else ''}: {wall:.1f} s ({wall / direct_s:.2f}x the "
              f"direct run, {wall / runs[1]['wall_s']:.2f}x 1 replica); answers {figures['tally']}; "
              f"slowest call {figures['slowest_s']:.2f} s")  # fmt: skip
        if figures["warm_cpu_ms"] is not None:
            print(f"    the replica's CPU per answer of a bound instance: {figures['warm_cpu_ms']:.1f} ms "
                  f"({WARM_CALLS} reads of one episode, averaged)")  # fmt: skip
        for replica, each in figures["replicas"].items():
            memory = each["instance_mb"]
            process = each["replica_rss_mb"]
            cpu = each["replica_cpu_ms_per_answer"] if each["answers"] else None
            print(f"    replica {replica}: {each['answers']} answers, {each['instances_started']} "
                  f"instances started, peak live {each['peak_live']}, "
                  f"{memory and f'{memory:.0f}'} MB per instance, "
                  f"replica process {process and f'{process:.0f}'} MB, "
                  f"its CPU {cpu and f'{cpu:.1f}'} ms per answer")  # fmt: skip
    print(f"load after: {os.getloadavg()[0]:.2f} (1 min)", flush=True)
    return {"direct_s": direct_s, "runs": runs}


if __name__ == "__main__":
    from replay_sim.resolve.runtime import configure_runtime

    configure_runtime()
    main()
