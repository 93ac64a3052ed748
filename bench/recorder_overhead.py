"""Recorder overhead: per-call latency through ``replay-sim record`` versus directly, same upstream.

Three paths to ``fixtures/echo_server.py`` over stdio, from the same SDK client, calls interleaved:

- ``direct``: client → stdio → echo server;
- ``relay``: through a minimal Python line relay (asyncio, no parsing, no recording) — the least any
  stdio proxy written in Python adds on this machine (two more pipe hops, two more wake-ups);
- ``recorded``: through ``replay-sim record`` (forward, commit to SQLite before answering).

Reports the medians over N calls (after a warm-up), the milliseconds added to ``direct`` and the
recorder's CPU time per call. Target: at most 0.3 ms added per call.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from pydantic import TypeAdapter

ROOT = Path(__file__).resolve().parent.parent
ECHO = ROOT / "fixtures" / "echo_server.py"
CALLS = 600
WARMUP = 50
TARGET_MS = 0.3
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


async def measure(calls: int = CALLS) -> dict[str, float]:
    """Median per-call milliseconds of each path, what the recorder adds, and its CPU per call.

    All three clients stay open and their calls alternate, so background load hits them alike.
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
        times: dict[str, list[float]] = {kind: [] for kind in targets}
        async with (
            Client(targets["direct"], mode="legacy", cache=None) as direct,
            Client(targets["relay"], mode="legacy", cache=None) as relay,
            Client(targets["recorded"], mode="legacy", cache=None) as recorded,
        ):
            clients = {"direct": direct, "relay": relay, "recorded": recorded}
            cpu = 0.0
            for i in range(WARMUP + calls):
                if i == WARMUP:
                    cpu = _cpu_seconds(db)
                for kind, client in clients.items():
                    elapsed = await _timed_call(client, i)
                    if i >= WARMUP:
                        times[kind].append(elapsed)
            cpu = _cpu_seconds(db) - cpu
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    return {
        "direct_ms": medians["direct"],
        "relay_ms": medians["relay"],
        "recorded_ms": medians["recorded"],
        "relay_added_ms": medians["relay"] - medians["direct"],
        "added_ms": medians["recorded"] - medians["direct"],
        "ratio": medians["recorded"] / medians["direct"],
        "recorder_cpu_ms": cpu * 1000 / calls,
    }


def main() -> dict[str, float]:
    """Print the recorder overhead figures."""
    figures = anyio.run(measure)
    print(
        f"   recorder overhead over {CALLS} echo calls (stdio upstream, median): direct "
        f"{figures['direct_ms']:.3f} ms, recorded {figures['recorded_ms']:.3f} ms, added "
        f"{figures['added_ms']:.3f} ms ({figures['ratio']:.2f}x; target: <= {TARGET_MS} ms added); "
        f"a bare Python line relay adds {figures['relay_added_ms']:.3f} ms; recorder CPU "
        f"{figures['recorder_cpu_ms']:.3f} ms per call"
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
