"""Recorder overhead: per-call latency through ``replay-sim record`` versus directly, same upstream.

Three paths to ``fixtures/echo_server.py`` over stdio, from the same SDK client, calls interleaved:

- ``direct``: client → stdio → echo server;
- ``relay``: through a minimal Python line relay (asyncio, no parsing, no recording) — the least any
  stdio proxy written in Python adds on this machine (two more pipe hops, two more wake-ups);
- ``recorded``: through ``replay-sim record`` (forward, commit to SQLite before answering).

Reports the medians over N calls (after a warm-up), the milliseconds added to ``direct`` and the
recorder's CPU time per call. Target: at most 0.2 ms added per call. The same three paths are then
driven by a raw line client (write a request line, read its answer line; no SDK client, whose
own ~1 ms per call and its jitter dwarf what a proxy adds), calls interleaved likewise.

With ``REPLAY_SIM_BENCH_BEFORE=DIR`` (a checkout of another version, e.g. a ``git worktree`` of
the previous commit) a fourth path, ``before``, runs that checkout's recorder in the same rounds.
With the peers installed (:mod:`bench._peers`), ``mcp-rec`` (``mcp-rec record``, the issue's best
peer recorder: a select loop forwarding chunks and appending JSONL) is one more path in both.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from pydantic import TypeAdapter

from bench._peers import PEER_ENV, peers_bin

ROOT = Path(__file__).resolve().parent.parent
ECHO = ROOT / "fixtures" / "echo_server.py"
CALLS = 600
WARMUP = 50
TARGET_MS = 0.2
RAW_CALLS = 2000
_RAW = TypeAdapter(dict[str, Any])


async def _timed_call(client: Client, i: int) -> float:
    request = types.CallToolRequest(
        params=types.CallToolRequestParams(name="echo", arguments={"text": f"call {i}"})
    )
    started = time.perf_counter()
    await client.session.send_request(request, _RAW)  # type: ignore[arg-type]
    return (time.perf_counter() - started) * 1000


def _cpu_seconds(marker: str) -> float:
    """CPU time so far of the process whose command line holds ``marker`` (Linux /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() not in (entry / "cmdline").read_bytes():
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


async def measure(calls: int = CALLS, peers: Path | None = None) -> dict[str, float]:
    """Median per-call milliseconds of each path, what the recorder adds, and its CPU per call.

    All clients stay open and their calls alternate, so background load hits them alike; with
    ``peers`` (their ``bin`` directory) mcp-rec's recorder is one of them.
    """
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "bench.db")
        echo = [sys.executable, str(ECHO)]
        targets = {
            "direct": StdioServerParameters(command=sys.executable, args=[str(ECHO)]),
            "relay": StdioServerParameters(
                command=sys.executable, args=["-m", "bench.recorder_overhead", "relay", *echo]
            ),
            "recorded": StdioServerParameters(
                command=str(Path(sys.executable).parent / "replay-sim"),
                args=["record", "--db", db, "--name", "echo", "--", *echo],
            ),
        }
        markers = {"recorded": db, "relay": "bench.recorder_overhead\0relay"}  # /proc cmdlines
        if peers is not None:
            markers["mcp-rec"] = str(Path(tmp) / "mcp-rec.jsonl")
            targets["mcp-rec"] = StdioServerParameters(
                command=str(peers / "mcp-rec"),
                args=["record", "-o", markers["mcp-rec"], "--", *echo],
                env={"MCP_REC_NO_NOTICE": "1"},
            )
        before = os.environ.get("REPLAY_SIM_BENCH_BEFORE")
        if before:  # `python -m replay_sim` in that checkout imports its own package
            markers["before"] = str(Path(tmp) / "before.db")
            targets["before"] = StdioServerParameters(
                command=sys.executable,
                args=["-m", "replay_sim", "record", "--db", markers["before"], "--name", "echo", "--", *echo],
                cwd=before,
            )
        times: dict[str, list[float]] = {kind: [] for kind in targets}
        async with AsyncExitStack() as stack:
            clients = {
                kind: await stack.enter_async_context(Client(target, mode="legacy", cache=None))
                for kind, target in targets.items()
            }
            cpu = {kind: 0.0 for kind in markers}
            for i in range(WARMUP + calls):
                if i == WARMUP:
                    cpu = {kind: _cpu_seconds(marker) for kind, marker in markers.items()}
                for kind, client in clients.items():
                    elapsed = await _timed_call(client, i)
                    if i >= WARMUP:
                        times[kind].append(elapsed)
            cpu = {kind: _cpu_seconds(marker) - cpu[kind] for kind, marker in markers.items()}
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    figures = {
        "direct_ms": medians["direct"],
        "relay_ms": medians["relay"],
        "recorded_ms": medians["recorded"],
        "relay_added_ms": medians["relay"] - medians["direct"],
        "added_ms": medians["recorded"] - medians["direct"],
        "ratio": medians["recorded"] / medians["direct"],
        "recorder_cpu_ms": cpu["recorded"] * 1000 / calls,
        "relay_cpu_ms": cpu["relay"] * 1000 / calls,
    }
    if "before" in medians:
        figures["before_added_ms"] = medians["before"] - medians["direct"]
        figures["before_cpu_ms"] = cpu["before"] * 1000 / calls
    if "mcp-rec" in medians:
        figures["mcp_rec_added_ms"] = medians["mcp-rec"] - medians["direct"]
        figures["mcp_rec_cpu_ms"] = cpu["mcp-rec"] * 1000 / calls
    return figures


def raw_measure(calls: int = RAW_CALLS, peers: Path | None = None) -> dict[str, float]:
    """Median per-call milliseconds of each path driven by a raw line client, calls interleaved
    (mcp-rec's recorder among them with ``peers``, their ``bin`` directory)."""
    with tempfile.TemporaryDirectory() as tmp:
        echo = [sys.executable, str(ECHO)]
        commands = {
            "direct": echo,
            "relay": [sys.executable, "-m", "bench.recorder_overhead", "relay", *echo],
            "recorded": [
                str(Path(sys.executable).parent / "replay-sim"),
                *("record", "--db", str(Path(tmp) / "raw.db"), "--name", "echo", "--", *echo),
            ],
        }
        if peers is not None:
            session = str(Path(tmp) / "raw-mcp-rec.jsonl")
            commands["mcp-rec"] = [str(peers / "mcp-rec"), "record", "-o", session, "--", *echo]
        cwd: dict[str, str] = {}
        before = os.environ.get("REPLAY_SIM_BENCH_BEFORE")
        if before:  # `python -m replay_sim` in that checkout imports its own package
            commands["before"] = [sys.executable, "-m", "replay_sim", *commands["recorded"][1:]]
            commands["before"][5] = str(Path(tmp) / "raw-before.db")
            cwd["before"] = before
        processes = {
            kind: subprocess.Popen(
                command,
                cwd=cwd.get(kind),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                bufsize=0,
                env=PEER_ENV,
            )
            for kind, command in commands.items()
        }
        times: dict[str, list[float]] = {kind: [] for kind in commands}
        try:
            init = {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "b", "version": "0"},
            }
            for process in processes.values():
                assert process.stdin is not None and process.stdout is not None
                process.stdin.write(
                    json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}).encode()
                    + b"\n"
                )
                process.stdout.readline()
                process.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
            for i in range(1, WARMUP + calls + 1):
                params = {"name": "echo", "arguments": {"text": f"call {i}"}}
                line = json.dumps(
                    {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params}
                ).encode()
                for kind, process in processes.items():
                    assert process.stdin is not None and process.stdout is not None
                    started = time.perf_counter()
                    process.stdin.write(line + b"\n")
                    answer = process.stdout.readline()
                    if i > WARMUP:
                        times[kind].append((time.perf_counter() - started) * 1000)
                    assert f"call {i}".encode() in answer, answer
        finally:
            for process in processes.values():
                assert process.stdin is not None
                process.stdin.close()
                process.wait(timeout=60)
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    figures = {
        "raw_direct_ms": medians["direct"],
        "raw_relay_added_ms": medians["relay"] - medians["direct"],
        "raw_added_ms": medians["recorded"] - medians["direct"],
        "raw_added_mean_ms": statistics.mean(times["recorded"]) - statistics.mean(times["direct"]),
    }
    if "before" in medians:
        figures["raw_before_added_ms"] = medians["before"] - medians["direct"]
        figures["raw_before_added_mean_ms"] = statistics.mean(times["before"]) - statistics.mean(
            times["direct"]
        )
    if "mcp-rec" in medians:
        figures["raw_mcp_rec_added_ms"] = medians["mcp-rec"] - medians["direct"]
        figures["raw_mcp_rec_added_mean_ms"] = statistics.mean(times["mcp-rec"]) - statistics.mean(
            times["direct"]
        )
    return figures


def main() -> dict[str, float]:
    """Print the recorder overhead figures."""
    peers = peers_bin()
    figures = anyio.run(measure, CALLS, peers)
    print(
        f"   recorder overhead over {CALLS} echo calls (stdio upstream, median): direct "
        f"{figures['direct_ms']:.3f} ms, recorded {figures['recorded_ms']:.3f} ms, added "
        f"{figures['added_ms']:.3f} ms ({figures['ratio']:.2f}x; target: <= {TARGET_MS} ms added); "
        f"a bare Python line relay adds {figures['relay_added_ms']:.3f} ms "
        f"(CPU {figures['relay_cpu_ms']:.3f} ms per call); recorder CPU "
        f"{figures['recorder_cpu_ms']:.3f} ms per call"
    )
    raw = raw_measure(RAW_CALLS, peers)
    figures.update(raw)
    print(
        f"   the same over {RAW_CALLS} calls from a raw line client: direct {raw['raw_direct_ms']:.3f} ms, "
        f"recorded adds {raw['raw_added_ms']:.3f} ms (mean {raw['raw_added_mean_ms']:.3f} ms), "
        f"a bare Python line relay {raw['raw_relay_added_ms']:.3f} ms"
        + (
            f"; the recorder in REPLAY_SIM_BENCH_BEFORE adds {raw['raw_before_added_ms']:.3f} ms "
            f"(mean {raw['raw_before_added_mean_ms']:.3f} ms)"
            if "raw_before_added_ms" in raw
            else ""
        )
    )
    if "mcp_rec_added_ms" in figures:
        print(
            f"   mcp-rec's recorder, same rounds: SDK client added {figures['mcp_rec_added_ms']:.3f} ms "
            f"(replay-sim {figures['added_ms'] - figures['mcp_rec_added_ms']:+.3f} ms), CPU "
            f"{figures['mcp_rec_cpu_ms']:.3f} ms per call; raw client added "
            f"{figures['raw_mcp_rec_added_ms']:.3f} ms (mean {figures['raw_mcp_rec_added_mean_ms']:.3f} ms; "
            f"replay-sim {figures['raw_added_ms'] - figures['raw_mcp_rec_added_ms']:+.3f} ms)"
        )
    if "before_added_ms" in figures:
        print(
            "   the recorder in REPLAY_SIM_BENCH_BEFORE, same rounds: added "
            f"{figures['before_added_ms']:.3f} ms, CPU {figures['before_cpu_ms']:.3f} ms per call"
        )
    return figures


async def _relay(command: list[str]) -> None:
    """The floor: copy lines between this process's stdio and a child's, nothing else."""
    child = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert child.stdin is not None and child.stdout is not None
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, sys.stdout)
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    child_in, child_out = child.stdin, child.stdout

    async def up() -> None:
        while line := await reader.readline():
            child_in.write(line)
        child_in.close()

    async def down() -> None:
        while line := await child_out.readline():
            writer.write(line)

    await asyncio.gather(up(), down())


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "relay":
        asyncio.run(_relay(sys.argv[2:]))
    else:
        main()
