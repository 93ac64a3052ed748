"""RL-shaped load on 127.0.0.1: concurrent rollouts on episode URLs, idle across the keep-alive band.

``replay-sim serve`` (the real CLI, its defaults) serves a store while another process writes to
it (``replay-sim import`` of fresh calls, in a loop). Each rollout is one episode at
``/episodes/<id>/mcp/demo``, speaking raw streamable HTTP (handshake era) through one shared httpx
client — httpx's keep-alive expiry is 5 s, as in the MCP SDK — and pauses 0-8 s between calls (a
model generating), so pooled connections sit idle across the keep-alive band. Every answer is
checked against the recording: the stateful ``counter`` → ``increment`` → ``counter`` sequence must
read ``0`` then ``1`` in each episode (its history is the episode's), the ``echo`` calls their own
recorded text. Reported per size: transport errors, wrong answers, p50/p99 per call and the
server's CPU per call (``/proc/<pid>/stat``), against an exact-hit baseline measured in the same
run on the same server (no pauses, no writer).

``python -m bench rollouts`` runs 64, 256 and 1,024 rollouts of 8 calls (10,752 calls);
``ROLLOUTS_QUICK=1`` runs 64 and 256 (2,560 calls).
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2

from bench.load import ACCEPT, PROTOCOL, initialize, payload, percentile

SIZES = (64, 256, 1024)
QUICK_SIZES = (64, 256)
CALLS = 8
"""Calls per rollout: echo calls, then counter, increment, counter."""
PAUSE = (0.0, 8.0)
"""Seconds a rollout pauses before each call after its first (uniform)."""
RECORDED = 200
BIN = Path(sys.executable).parent


def answer(i: int) -> str:
    """The recorded text of the ``i``-th echo call."""
    return f"echo {i}: " + "y" * (i % 11)


def make_store(db: Path) -> None:
    """One server ``demo``: ``RECORDED`` echo calls; counter (0), increment, counter (1) in one session."""
    from replay_sim.store import ServerRecord, Store

    store = Store(db)
    store.put_server(ServerRecord("demo", {"name": "demo", "version": "1"}, {"tools": {}}, PROTOCOL))
    empty = {"type": "object", "properties": {}}
    tools = [
        {
            "name": "echo",
            "annotations": {"readOnlyHint": True},
            "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}},
        },
        {"name": "counter", "annotations": {"readOnlyHint": True}, "inputSchema": empty},
        {"name": "increment", "inputSchema": empty},
    ]
    store.put_listing("demo", "tools/list", {"tools": tools})
    session = store.start_session("demo", "s-state")
    for name, text in (("counter", "0"), ("increment", "ok"), ("counter", "1")):
        result = {"content": [{"type": "text", "text": text}], "isError": False}
        store.record_call(
            "demo", "tools/call", {"name": name, "arguments": {}}, result=result, session=session
        )
    session = store.start_session("demo", "s-echo")
    for i in range(RECORDED):
        result = {"content": [{"type": "text", "text": answer(i)}], "isError": False}
        params = {"name": "echo", "arguments": {"message": f"m{i}"}}
        store.record_call("demo", "tools/call", params, result=result, session=session)
    store.close()


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def served(db: Path, *options: str) -> Iterator[tuple[str, int]]:
    """``replay-sim serve`` on a free port, waited for by its ``listening on`` line."""
    command = [
        str(BIN / "replay-sim"),
        "serve",
        "--db",
        str(db),
        "--port",
        "0",
        "--index-dir",
        str(db.parent),
    ]
    command += options
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # printed once ready; empty if it exited
        if not line.startswith("listening on "):
            raise RuntimeError(f"replay-sim serve did not start (exit {process.wait()})")
        yield line.removeprefix("listening on ").strip(), process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


@contextmanager
def writing(db: Path, tmp: Path) -> Iterator[list[int]]:
    """Another process writing to the store meanwhile: ``replay-sim import`` of fresh calls, in a loop.

    Yields once the first import has been committed; on exit the writer is stopped (killed, an
    import under way included: SQLite keeps the store whole) and the list holds the imports made.
    """
    script = f"""
import json, pathlib, subprocess
tmp, n = pathlib.Path({str(tmp)!r}), 0
while True:
    lines = [json.dumps({{"type": "call", "server": "demo", "method": "tools/call",
        "params": {{"name": "echo", "arguments": {{"message": f"w{{n}}-{{j}}"}}}},
        "result": {{"content": [{{"type": "text", "text": "written"}}], "isError": False}},
        "error": None, "session": f"w-{{n}}", "seq": j + 1}}) for j in range(50)]
    (tmp / "w.jsonl").write_text("\\n".join(lines) + "\\n")
    subprocess.run([{str(BIN / "replay-sim")!r}, "import", str(tmp / "w.jsonl"), "--db", {str(db)!r}],
                   check=True, capture_output=True)
    n += 1
    print(n, flush=True)
"""
    writer = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert writer.stdout is not None
    if not writer.stdout.readline():
        raise RuntimeError(f"the writer failed (exit {writer.wait()})")
    imports: list[int] = []
    try:
        yield imports
    finally:
        os.killpg(writer.pid, signal.SIGKILL)  # the loop and the import under way
        out, _ = writer.communicate(timeout=60)
        imports.append(1 + len(out.split()))


@dataclass
class Tally:
    """What the rollouts saw."""

    calls: int = 0
    transport_errors: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    call_ms: list[float] = field(default_factory=list)
    open_ms: list[float] = field(default_factory=list)
    """Each rollout's ``initialize`` round trip (waiting its turn while many start at once)."""


def _request(i: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params}


def plan(n: int, calls: int) -> list[tuple[str, dict[str, Any], str]]:
    """Rollout ``n``'s calls and the recorded answer of each: echoes, then the stateful three."""
    state = [("counter", {}, "0"), ("increment", {}, "ok"), ("counter", {}, "1")]
    echoes = [
        ("echo", {"message": f"m{i}"}, answer(i)) for i in ((n * 7 + c) % RECORDED for c in range(calls))
    ]
    return (echoes[: max(0, calls - len(state))] + state)[:calls]


async def rollout(
    http: httpx2.AsyncClient, base: str, n: int, calls: int, pause: tuple[float, float], tally: Tally
) -> None:
    """One episode: initialize, ``calls`` checked calls with pauses between, close."""
    url = f"{base}/episodes/rollout-{n}-{random.getrandbits(32):08x}/mcp/demo"
    rng = random.Random(n)
    try:
        started = time.perf_counter()
        response = await http.post(url, json=initialize("rl"), headers=ACCEPT)
        tally.open_ms.append((time.perf_counter() - started) * 1000)
        headers = ACCEPT | {
            "Mcp-Session-Id": response.headers["mcp-session-id"],
            "MCP-Protocol-Version": PROTOCOL,
        }
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        for c, (name, arguments, expected) in enumerate(plan(n, calls)):
            if c:
                await anyio.sleep(rng.uniform(*pause))  # the model generating its next call
            started = time.perf_counter()
            result = payload(await http.post(url, json=_request(c + 1, name, arguments), headers=headers))
            tally.call_ms.append((time.perf_counter() - started) * 1000)
            tally.calls += 1
            got = result.get("result", {})
            status = got.get("_meta", {}).get("replay-sim/match", {}).get("status")
            if got.get("content") != [{"type": "text", "text": expected}] or status != "exact":
                tally.wrong.append(f"rollout {n} call {c} {name}: {json.dumps(result)[:200]}")
        await http.delete(url, headers=headers)
    except (httpx2.TransportError, httpx2.HTTPStatusError, KeyError) as exc:
        tally.transport_errors.append(f"rollout {n}: {type(exc).__name__}: {exc}")


async def rollouts(base: str, size: int, calls: int, pause: tuple[float, float]) -> Tally:
    """``size`` concurrent rollouts through one client (a trainer's), every answer checked."""
    tally = Tally()
    limits = httpx2.Limits(max_connections=size, max_keepalive_connections=size)  # expiry: httpx's 5 s
    async with httpx2.AsyncClient(timeout=120, limits=limits) as http, anyio.create_task_group() as tg:
        for n in range(size):
            tg.start_soon(rollout, http, base, n, calls, pause, tally)
    return tally


def measure(base: str, pid: int, size: int, calls: int, pause: tuple[float, float]) -> dict[str, Any]:
    """One run of ``size`` rollouts: its tally, latency percentiles and the server's CPU per call."""
    cpu = cpu_seconds(pid)
    started = time.perf_counter()
    tally = anyio.run(rollouts, base, size, calls, pause)
    elapsed = time.perf_counter() - started
    calls_made = max(tally.calls, 1)
    return {
        "rollouts": size,
        "calls": tally.calls,
        "transport_errors": tally.transport_errors,
        "wrong": tally.wrong,
        "p50_ms": statistics.median(tally.call_ms) if tally.call_ms else float("nan"),
        "p99_ms": percentile(tally.call_ms, 99) if tally.call_ms else float("nan"),
        "open_p99_ms": percentile(tally.open_ms, 99) if tally.open_ms else float("nan"),
        "server_cpu_us_per_call": (cpu_seconds(pid) - cpu) / calls_made * 1e6,
        "seconds": elapsed,
    }


def run(
    sizes: tuple[int, ...],
    calls: int = CALLS,
    pause: tuple[float, float] = PAUSE,
    *serve_options: str,
) -> list[dict[str, Any]]:
    """The whole bench: a baseline, then each size with the writer running; the figures of each.

    Args:
        sizes: Concurrent rollouts of each run.
        calls: Calls per rollout.
        pause: Seconds between a rollout's calls (uniform between the two).
        serve_options: More ``replay-sim serve`` options.
    """
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "rollouts.db"
        make_store(db)
        with served(db, *serve_options) as (base, pid):
            results = [
                {"label": "baseline (64, no pauses, no writer)", **measure(base, pid, 64, calls, (0, 0))}
            ]
            with writing(db, Path(tmp)) as imports:
                for size in sizes:
                    results.append({"label": f"{size} rollouts", **measure(base, pid, size, calls, pause)})
            results[-1]["imports"] = imports[0]
    return results


def main() -> list[dict[str, Any]]:
    """Run at full size (or quick: ``ROLLOUTS_QUICK=1``) and print the figures."""
    sizes = QUICK_SIZES if os.environ.get("ROLLOUTS_QUICK") else SIZES
    results = run(sizes)
    base = results[0]
    for r in results:
        print(
            f"   {r['label']}: {r['calls']} calls in {r['seconds']:.1f}s, "
            f"{len(r['transport_errors'])} transport errors, {len(r['wrong'])} wrong answers; "
            f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms "
            f"({r['p50_ms'] / base['p50_ms']:.2f}x / {r['p99_ms'] / base['p99_ms']:.2f}x baseline); "
            f"initialize p99 {r['open_p99_ms']:.0f} ms; "
            f"server CPU {r['server_cpu_us_per_call']:.0f} us/call "
            f"({r['server_cpu_us_per_call'] / base['server_cpu_us_per_call']:.2f}x)",
            flush=True,
        )
        for problem in (r["transport_errors"] + r["wrong"])[:5]:
            print(f"     {problem}", flush=True)
    total = sum(r["calls"] for r in results[1:])
    print(
        f"   {total} calls under load; the writer imported {results[-1].get('imports')} batches", flush=True
    )
    return results


if __name__ == "__main__":
    main()
