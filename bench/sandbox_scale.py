"""Sandboxes at RL scale: replay-sim against the real server started per episode, in one run.

The real ``@modelcontextprotocol/server-memory`` is what a trainer would otherwise start for each
episode. Each episode creates an entity nobody recorded, adds an observation, opens it and reads
the graph (four calls); ``CONCURRENCY`` episodes run at a time. Measured side by side:

1. **direct**: one real server process per episode over stdio (a fresh graph each) — the baseline,
   and the truth every replay-sim answer is checked against (the same episode's direct answers);
2. **pass 1**: ``replay-sim serve --miss sandbox`` (its own process, as a trainer runs it) with
   every option at its default, on episode URLs (each episode created by ``POST /api/episodes``
   and ended by ``DELETE``): every call is a sandbox answer, recorded;
3. **pass 2**: the same episodes again (new episode ids): every call from the cache.

The episodes' MCP clients share one HTTP client, as a trainer's rollouts do (``Client(
streamable_http_client(url, http_client=shared))``): the SDK's ``Client(url)`` makes an HTTP client
per connection, whose TLS context alone costs ~20 ms of the trainer's CPU per episode even for
``http://``. Pass 2 is played once more that way, for reference; and once more with the clients
in :data:`WORKERS` processes of their own (``bench._rollout_worker``), as a trainer's rollout
workers run: in the bench's one process the clients' own CPU is what bounds that pass.

Then **waves** of episodes whose clients only close their MCP sessions (handshake-era sessions on
episode URLs, never ``DELETE /api/episodes``), with every ``serve`` option at its default:
misses, wrong answers, the slowest call. And the answer path: a warm sandbox answer's round trip
against the instance's own latency (what the answer's ``_meta`` reports) and a cache hit's round
trip, medians over one run.

And, with ``hold``, how many episodes the machine holds open **at once** at the default instance
cap (32): all of them write, wait for the last to have written, then make their other calls (an
instance given back meanwhile, or never held, is rebuilt), at each size until one has a miss or a
wrong answer; with the peak of live instances, memory per instance and the replay process's.

Run with ``python -m bench sandbox_scale`` (or ``python -m bench.sandbox_scale [EPISODES ...]``;
``python -m bench.sandbox_scale hold [EPISODES ...]`` for the episodes held at once, 64, 256 and
1,024 by default; ``python -m bench.sandbox_scale path`` for the answer path alone, in both protocol
eras, a few rounds). Any ``--option=value`` is passed on to ``serve`` (``hold 512
--max-concurrent=2048``); every other option stays at its default.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from bench._cpu import Descendants, own_cpu, process_cpu
from bench._peers import free_port
from bench.sandbox_rollouts import MEMORY, REPLAY_SIM, answer, calls, memory_config, record_memory
from replay_sim import MATCH_META_KEY

SIZES = (64,)
HOLD = (64, 256, 1024)
"""Episodes held open at once (each level until one has a miss or a wrong answer)."""
CONCURRENCY = 16
WORKERS = 2
"""Rollout worker processes the trainer's clients run in, for the second pass's last line."""
WAVES, WAVE_SIZE, WAVE_CONCURRENCY = 3, 40, 20
WARM_CALLS = 40
PATH_ROUNDS, PATH_CALLS = 3, 100
"""``path``: rounds per protocol era, and calls of each kind per round."""


def entity(run: str, episode: int) -> str:
    """The entity an episode writes (unique per run and episode, always 11 characters)."""
    return f"{run}-e{episode:05d}"


SERVE_OPTIONS: list[str] = []
"""``serve`` options the bench was given (``--max-concurrent=2048``): every other one at its default."""

MISSED: Counter[str] = Counter()
"""Why calls missed or failed, over the run (printed at the end: neither is ever silent)."""


def status(result: Any) -> str:
    """What an answer's provenance says it is (``sandbox``, ``exact``, ``miss``…)."""
    return str((result.meta or {}).get(MATCH_META_KEY, {}).get("status"))


def tallied(tally: Counter[str], result: Any) -> str:
    """Count an answer's status in ``tally`` (a miss's reason in :data:`MISSED`); the status."""
    said = status(result)
    tally[said] += 1
    if said == "miss":
        text = str(result.content[0].text) if result.content else ""
        MISSED[next((line for line in text.splitlines() if line.startswith("Reason:")), text)[:300]] += 1
    return said


async def limited(count: int, concurrency: int, run: Any) -> float:
    """Run ``run(i)`` for ``i < count``, ``concurrency`` at a time; the wall time in seconds."""
    limit = anyio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with limit:
            await run(i)

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(one, i)
    return time.perf_counter() - started


async def direct(size: int, run: str, tmp: Path) -> tuple[float, dict[int, list[str]]]:
    """Each episode on its own real server process over stdio: the wall time and every answer."""
    truth: dict[int, list[str]] = {}

    async def episode(i: int) -> None:
        state = tmp / f"direct-{run}-{i}"
        state.mkdir(parents=True)
        env = {**os.environ, "MEMORY_FILE_PATH": str(state / "memory.jsonl")}
        async with Client(StdioServerParameters(command=str(MEMORY), env=env), mode="legacy") as client:
            truth[i] = [answer(await client.call_tool(t, a)) for t, a in calls(entity(run, i))]

    return await limited(size, CONCURRENCY, episode), truth


class Served:
    """A ``replay-sim serve`` process (every option at its default but the address) and its URL."""

    def __init__(self, url: str, http: httpx2.AsyncClient, pid: int) -> None:
        self.url = url
        self.http = http
        self.pid = pid

    @contextlib.asynccontextmanager
    async def episode(self) -> AsyncIterator[str]:
        """A new episode's MCP URL on server-memory, ended (``DELETE``) at the end."""
        created = (await self.http.post(f"{self.url}/api/episodes", json={})).json()
        try:
            yield f"{self.url}/episodes/{created['id']}/mcp/memory"
        finally:
            await self.http.delete(f"{self.url}/api/episodes/{created['id']}")

    async def stats(self) -> dict[str, Any]:
        return dict((await self.http.get(f"{self.url}/api/stats")).json()["sandbox"])


@contextlib.asynccontextmanager
async def served(db: Path, config: Path, tmp: Path) -> AsyncIterator[Served]:
    """``replay-sim serve --miss sandbox`` in its own process, until the block ends (SIGTERM); any
    ``--option=value`` given to the bench is passed on (:data:`SERVE_OPTIONS`)."""
    port = free_port()
    command = [REPLAY_SIM, "serve", "--db", str(db), "--miss", "sandbox", "--config", str(config),
               "--port", str(port), "--index-dir", str(tmp / "index"), *SERVE_OPTIONS]  # fmt: skip
    log = (tmp / f"serve-{port}.log").open("w")
    process = subprocess.Popen(command, stdout=log, stderr=log, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            with anyio.fail_after(300):
                while True:
                    with contextlib.suppress(httpx2.HTTPError):
                        if (await http.get(f"{url}/api/ready")).status_code == 200:
                            break
                    await anyio.sleep(0.2)
            yield Served(url, http, process.pid)
    finally:
        died = process.poll()
        process.terminate()
        await anyio.to_thread.run_sync(process.wait)
        log.close()
        if died is not None:  # the replay ended on its own: say how, before its log goes with `tmp`
            tail = (tmp / f"serve-{port}.log").read_text(errors="replace")[-4000:]
            print(f"replay-sim serve exited by itself ({died}); the end of its log:\n{tail}", file=sys.stderr)


async def replayed(
    sim: Served,
    episodes: Sequence[int],
    run: str,
    truth: dict[int, list[str]],
    tally: Counter[str],
    slowest: list[float],
    shared: httpx2.AsyncClient | None,
    concurrency: int = CONCURRENCY,
) -> float:
    """Each episode on an episode URL of the replay (created, then ended): the wall time. Its MCP
    client rides on ``shared`` (None: the SDK's own HTTP client per episode)."""

    async def episode(k: int) -> None:
        i = episodes[k]
        async with sim.episode() as url:
            transport = url if shared is None else streamable_http_client(url, http_client=shared)
            async with Client(transport) as client:
                for (tool, arguments), want in zip(calls(entity(run, i)), truth[i], strict=True):
                    started = time.perf_counter()
                    try:
                        result = await client.call_tool(tool, arguments)
                    except MCPError as exc:  # counted and said at the end, with its message
                        tally["error"] += 1
                        MISSED[f"JSON-RPC error {exc.code}: {exc.message}"[:300]] += 1
                        return
                    slowest.append(time.perf_counter() - started)
                    said = tallied(tally, result)
                    tally["wrong"] += answer(result) != want and said != "miss"

    return await limited(len(episodes), concurrency, episode)


async def in_workers(
    sim: Served, size: int, run: str, truth: dict[int, list[str]], tally: Counter[str], slowest: list[float]
) -> tuple[float, float]:
    """The episodes played by :data:`WORKERS` rollout worker processes (``bench._rollout_worker``),
    :data:`CONCURRENCY` at a time in all, started together once each is ready: the wall time and
    the workers' CPU seconds."""
    command = [sys.executable, "-m", "bench._rollout_worker", sim.url, run, str(CONCURRENCY // WORKERS)]
    here = Path(__file__).resolve().parent.parent
    workers = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=here)
               for _ in range(WORKERS)]  # fmt: skip
    for n, worker in enumerate(workers):
        share = list(range(n, size, WORKERS))
        _say(worker, json.dumps({"episodes": share, "truth": {i: truth[i] for i in share}}))
        assert _heard(worker) == "ready"
    started = time.perf_counter()
    for worker in workers:
        _say(worker, "go")
    said = [json.loads(await anyio.to_thread.run_sync(_heard, w)) for w in workers]
    wall = time.perf_counter() - started
    for worker in workers:
        await anyio.to_thread.run_sync(worker.communicate)  # its input closed: it exits
    for one in said:
        tally.update(one["tally"])
        MISSED.update(one["missed"])
        slowest.append(one["slowest"])
    return wall, sum(one["cpu"] for one in said)


def _say(worker: subprocess.Popen[str], line: str) -> None:
    assert worker.stdin is not None
    worker.stdin.write(line + "\n")
    worker.stdin.flush()


def _heard(worker: subprocess.Popen[str]) -> str:
    assert worker.stdout is not None
    return worker.stdout.readline().strip()


async def waves(sim: Served, template: list[str]) -> dict[str, Any]:
    """Episodes whose clients only close their MCP sessions: misses, wrong answers, slowest call."""
    tally: Counter[str] = Counter()
    slowest: list[float] = []
    for wave in range(WAVES):

        async def episode(i: int, wave: int = wave) -> None:
            name = entity(f"w{wave:04d}", i)
            url = f"{sim.url}/episodes/wave{wave}-{i}/mcp/memory"  # never ended: only its session closes
            async with Client(url, mode="legacy") as client:
                for (tool, arguments), want in zip(calls(name), template, strict=True):
                    started = time.perf_counter()
                    result = await client.call_tool(tool, arguments)
                    slowest.append(time.perf_counter() - started)
                    expected = want.replace(entity("tmpl", 0), name)
                    said = tallied(tally, result)
                    tally["wrong"] += answer(result) != expected and said != "miss"

        await limited(WAVE_SIZE, WAVE_CONCURRENCY, episode)
    return {"tally": dict(tally), "slowest_s": max(slowest, default=0.0), "calls": len(slowest)}


async def hold(sim: Served, size: int, template: list[str]) -> dict[str, Any]:
    """``size`` episodes open at once at the default cap: each writes, all wait for the last to have
    written, then each makes its other calls (its instance given back meanwhile, or never held, is
    rebuilt). Answers, the slowest call, peak live instances, memory per instance and of the replay."""
    tally: Counter[str] = Counter()
    slowest: list[float] = []
    written = {"count": 0}
    everyone = anyio.Event()
    peak = {"live": 0, "replay": 0}
    memory: list[int] = []

    def arrive() -> None:
        written["count"] += 1
        if written["count"] == size:
            everyone.set()

    async def episode(i: int) -> None:
        name = entity(f"h{size:04d}", i)
        missed = arrived = False
        try:
            async with Client(f"{sim.url}/episodes/hold{size}-{i}/mcp/memory", mode="legacy") as client:
                for step, ((tool, arguments), want) in enumerate(zip(calls(name), template, strict=True)):
                    if step == 1:
                        arrived = True
                        arrive()
                        await everyone.wait()
                    if missed:
                        continue  # its later calls would be read after a write it did not make
                    started = time.perf_counter()
                    result = await client.call_tool(tool, arguments)
                    slowest.append(time.perf_counter() - started)
                    missed = tallied(tally, result) == "miss"
                    tally["wrong"] += answer(result) != want.replace(entity("tmpl", 0), name) and not missed
        except* MCPError as refused:  # e.g. the replay's admission limit: counted and said, never a hang
            tally["refused"] += 1
            MISSED[f"refused: {refused.exceptions[0]}"[:300]] += 1
        finally:
            if not arrived:
                arrive()  # the others do not wait for a write it will not make

    async def watch(done: anyio.Event) -> None:
        while not done.is_set():
            with contextlib.suppress(httpx2.HTTPError):
                pool = (await sim.stats())["pool"]["memory"]
                peak["live"] = max(peak["live"], pool["live"])
                memory.extend(m for m in pool["memory_bytes"].values() if m)
                peak["replay"] = max(peak["replay"], resident(sim.pid))
            with anyio.move_on_after(1.0):
                await done.wait()

    before = await sim.stats()
    done = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(watch, done)
        wall = await limited(size, size, episode)
        done.set()
    after = await sim.stats()
    return {"tally": dict(tally), "slowest_s": max(slowest, default=0.0), "wall_s": wall,
            "peak_live": peak["live"],
            "instance_mb": statistics.median(memory) / 2**20 if memory else None,
            "replay_mb": peak["replay"] / 2**20,
            "rebuilt": after.get("rebuilt", 0) - before.get("rebuilt", 0),
            "started": after["pool"]["memory"]["started"] - before["pool"]["memory"]["started"]}  # fmt: skip


async def held_at_once(
    sizes: tuple[int, ...], db: Path, config: Path, tmp: Path, template: list[str]
) -> None:
    """Each size in turn, on a fresh server, until one has a miss or a wrong answer."""
    for size in sizes:
        async with served(db, config, tmp) as sim:  # every option at its default: the cap is 32
            held = await hold(sim, size, template)
        print(f"held at once, the default cap (32){''.join(' ' + o for o in SERVE_OPTIONS)}: {size} "
              f"episodes: answers {held['tally']}, slowest call "
              f"{held['slowest_s']:.2f} s, {held['wall_s']:.1f} s; instances started {held['started']} "
              f"(rebuilt {held['rebuilt']}), peak live {held['peak_live']}, "
              f"{held['instance_mb'] and round(held['instance_mb'])} MB per instance, "
              f"the replay process {held['replay_mb']:.0f} MB", flush=True)  # fmt: skip
        if held["tally"].get("miss") or held["tally"].get("wrong") or held["tally"].get("refused"):
            break  # the most this machine holds at the cap is below this size


def resident(pid: int) -> int:
    """Resident bytes of one process (0 when it is gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def answer_path(
    sim: Served, mode: str = "auto", run: str = "path", count: int = WARM_CALLS
) -> dict[str, float]:
    """Medians, interleaved call by call: a warm sandbox answer's round trip and the instance's own
    latency, the same through the SDK's request path (a progress token in ``_meta`` sends it there),
    and a cache hit's round trip.

    ``mode`` is the MCP client's (``auto``: the 2026 era; ``legacy``: a handshake-era session);
    ``run`` names the entities written (new ones per measurement, so nothing is recorded yet).
    """
    times: dict[str, list[float]] = {k: [] for k in ("warm", "warm_own", "sdk", "sdk_own", "hit")}
    async with sim.episode() as url, Client(url, mode=mode) as client:  # type: ignore[arg-type]
        await client.call_tool(*calls(entity(run, 0))[0])  # what the hits are answered from
        for n in range(count):
            await client.call_tool("open_nodes", {"names": [f"absent-{n}"]})
    await anyio.sleep(0.2)  # the answers are recorded off the answer path: a batch every 50 ms

    async def timed(client: Client, names: list[str], meta: dict[str, Any] | None = None) -> Any:
        started = time.perf_counter()
        result = await client.call_tool("open_nodes", {"names": names}, meta=meta)  # type: ignore[arg-type]
        return result, (time.perf_counter() - started) * 1000

    async with (
        sim.episode() as warm_url, Client(warm_url, mode=mode) as warm,  # type: ignore[arg-type]
        sim.episode() as hit_url, Client(hit_url, mode=mode) as hits,  # type: ignore[arg-type]
    ):  # fmt: skip
        await warm.call_tool(*calls(entity(run, 1))[0])  # binds (and re-plays nothing)
        await hits.call_tool(*calls(entity(run, 0))[0])  # the recorded state: a hit
        for n in range(count):
            for key, names, meta in (("warm", [f"absent-{n}"], None),
                                     ("sdk", [f"absent-sdk-{n}"], {"progressToken": f"p{n}"})):  # fmt: skip
                result, took = await timed(warm, names, meta)
                assert status(result) == "sandbox", status(result)
                times[key].append(took)
                own = (result.meta or {})[MATCH_META_KEY]["sandbox"]["latency_ms"]
                times[f"{key}_own"].append(float(own))
            result, took = await timed(hits, [f"absent-{n}"])
            assert status(result) == "exact", status(result)
            times["hit"].append(took)
    medians = {f"{k}_ms": statistics.median(v) for k, v in times.items()}
    return {**medians, "own_ms": medians["warm_own_ms"]}


async def run(sizes: tuple[int, ...], tmp: Path, holding: bool) -> None:
    db = tmp / "replay.db"
    await record_memory(db, tmp / "record-state")
    config = memory_config(tmp / "record.toml", tmp / "pristine")
    _, template = await direct(1, "tmpl", tmp)
    if holding:
        await held_at_once(sizes, db, config, tmp, template[0])
        return
    for size in sizes:
        run_id = f"r{size:04d}"
        before = own_cpu()
        direct_s, truth = await direct(size, run_id, tmp)
        after = own_cpu()
        direct_cpu = (after[0] - before[0], after[1] - before[1])  # the trainer's client, the servers
        async with served(db, config, tmp) as sim, httpx2.AsyncClient(timeout=120) as shared:  # defaults
            passes = []
            for clients in ("shared", "shared", "each", "workers"):  # pass 1, then pass 2 three ways
                tally: Counter[str] = Counter()
                slowest: list[float] = []
                instances, began, replay_began = Descendants(sim.pid), own_cpu()[0], process_cpu(sim.pid)
                if clients == "workers":
                    wall, workers_cpu = await in_workers(sim, size, run_id, truth, tally, slowest)
                else:
                    http = shared if clients == "shared" else None
                    wall = await replayed(sim, range(size), run_id, truth, tally, slowest, http)
                    workers_cpu = 0.0
                client_cpu = own_cpu()[0] - began + workers_cpu  # the bench's own, and its workers'
                cpu = (client_cpu, process_cpu(sim.pid) - replay_began, instances.stop())
                passes.append((wall, dict(tally), max(slowest), cpu))
            stats = await sim.stats()
        print(f"{size} episodes x 4 calls, {CONCURRENCY} at a time:")
        client_ms, server_ms = (seconds / size * 1000 for seconds in direct_cpu)
        print(f"  the real server, one process per episode (stdio): {direct_s:.1f} s (1x); CPU per episode: "
              f"client {client_ms:.0f} ms, server {server_ms:.0f} ms")  # fmt: skip
        labels = ("pass 1", "pass 2", "pass 2, an HTTP client per episode",
                  f"pass 2, the trainer's clients in {WORKERS} processes")  # fmt: skip
        for label, (wall, answers, slow, cpu) in zip(labels, passes, strict=True):
            client_ms, replay_ms, instances_ms = (seconds / size * 1000 for seconds in cpu)
            print(f"  replay-sim {label}: {wall:.1f} s ({wall / direct_s:.2f}x); answers {answers}; "
                  f"slowest call {slow:.2f} s; CPU per episode: client {client_ms:.0f} ms, "
                  f"replay-sim {replay_ms:.0f} ms, its instances {instances_ms:.0f} ms")  # fmt: skip
        pool_stats = stats["pool"]["memory"]
        print(f"  instances started {pool_stats['started']}, reclaimed {stats.get('reclaimed', 0)}, "
              f"released {stats.get('released', 0)}, rebuilt {stats.get('rebuilt', 0)}",
              flush=True)  # fmt: skip
    async with served(db, config, tmp) as sim:
        figures = await waves(sim, template[0])
        path = await answer_path(sim)
    print(f"waves: {WAVES} x {WAVE_SIZE} episodes ({WAVE_CONCURRENCY} at a time) only closing their MCP "
          f"sessions, defaults: {figures['calls']} calls, answers {figures['tally']}, "
          f"slowest call {figures['slowest_s']:.2f} s")  # fmt: skip
    print(f"answer path (medians of {WARM_CALLS}): warm sandbox answer {path['warm_ms']:.2f} ms round trip, "
          f"the instance's own latency {path['own_ms']:.2f} ms, a cache hit {path['hit_ms']:.2f} ms "
          f"round trip; sandbox - hit - own = "
          f"{path['warm_ms'] - path['hit_ms'] - path['own_ms']:.2f} ms")  # fmt: skip


async def paths(tmp: Path) -> None:
    """Only the answer path, in both protocol eras, on one ``replay-sim serve`` (no episode table)."""
    db = tmp / "replay.db"
    await record_memory(db, tmp / "record-state")
    config = memory_config(tmp / "record.toml", tmp / "pristine")
    async with served(db, config, tmp) as sim:
        for round_ in range(PATH_ROUNDS):
            for mode in ("auto", "legacy"):
                era = "2026-era" if mode == "auto" else "handshake-era"
                path = await answer_path(sim, mode, f"p{round_}{mode[0]}", PATH_CALLS)
                print(f"answer path, {era} client, round {round_ + 1} (medians of {PATH_CALLS}, "
                      f"interleaved): warm sandbox answer {path['warm_ms']:.2f} ms round trip (the "
                      f"instance {path['own_ms']:.2f} ms); through the SDK's request path "
                      f"{path['sdk_ms']:.2f} ms (the instance {path['sdk_own_ms']:.2f} ms); a cache hit "
                      f"{path['hit_ms']:.2f} ms; sandbox - hit - own = "
                      f"{path['warm_ms'] - path['hit_ms'] - path['own_ms']:.2f} ms (SDK path: "
                      f"{path['sdk_ms'] - path['hit_ms'] - path['sdk_own_ms']:.2f} ms)",
                      flush=True)  # fmt: skip
    await stdio_path(db, config, tmp)


async def stdio_path(db: Path, config: Path, tmp: Path) -> None:
    """The answer path over stdio (the SDK's request path: its door has no fast path for a sandbox
    answer): ``replay-sim serve --stdio`` per client, the index the HTTP rounds built, interleaved
    per round as :func:`answer_path`, twice as many rounds (the first may overlap each replay's own
    start: its pool starting instances)."""
    args = ["serve", "--stdio", "--server", "memory", "--db", str(db), "--miss", "sandbox",
            "--config", str(config), "--index-dir", str(tmp / "index"), *SERVE_OPTIONS]  # fmt: skip
    door = StdioServerParameters(command=REPLAY_SIM, args=args, env=dict(os.environ))
    async with Client(door, mode="legacy") as warm, Client(door, mode="legacy") as hits:
        await warm.call_tool(*calls(entity("stdio", 1))[0])  # binds (and re-plays nothing)
        await hits.call_tool(*calls(entity("p0a", 0))[0])  # the state the first HTTP round recorded: hits
        for round_ in range(2 * PATH_ROUNDS):
            times: dict[str, list[float]] = {"warm": [], "own": [], "hit": []}
            for n in range(PATH_CALLS):
                for key, client, names in (
                    ("warm", warm, [f"absent-s{round_}-{n}"]),
                    ("hit", hits, [f"absent-{n}"]),
                ):
                    started = time.perf_counter()
                    result = await client.call_tool("open_nodes", {"names": names})
                    times[key].append((time.perf_counter() - started) * 1000)
                    assert status(result) == ("sandbox" if key == "warm" else "exact"), status(result)
                    if key == "warm":
                        times["own"].append(
                            float((result.meta or {})[MATCH_META_KEY]["sandbox"]["latency_ms"])
                        )
            m = {k: statistics.median(v) for k, v in times.items()}
            print(f"answer path over stdio, round {round_ + 1} (medians of {PATH_CALLS}, interleaved): warm "
                  f"sandbox answer {m['warm']:.2f} ms round trip (the instance {m['own']:.2f} ms); a cache "
                  f"hit {m['hit']:.2f} ms; sandbox - hit - own = {m['warm'] - m['hit'] - m['own']:.2f} ms",
                  flush=True)  # fmt: skip


def main() -> None:
    """Print the table, the waves and the answer path (with ``hold``: only the episodes held at once;
    with ``path``: only the answer path)."""
    SERVE_OPTIONS.extend(a for a in sys.argv[1:] if a.startswith("--"))
    if "path" in sys.argv[1:]:
        print(f"load before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores", flush=True)
        with tempfile.TemporaryDirectory() as folder:
            anyio.run(paths, Path(folder))
        print(f"load after: {os.getloadavg()[0]:.2f} (1 min)")
        return
    holding = "hold" in sys.argv[1:]
    sizes = tuple(int(a) for a in sys.argv[1:] if a.isdigit()) or (HOLD if holding else SIZES)
    print(f"load before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        anyio.run(run, sizes, Path(folder), holding)
    for reason, count in MISSED.most_common(5):
        print(f"missed or failed {count}x: {reason}")
    print(f"load after: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
