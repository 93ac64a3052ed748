"""Recorder overhead: per-call latency through ``replay-sim record`` versus directly, same upstream.

Both paths talk to ``fixtures/echo_server.py`` over stdio from the same SDK client; the recorded
path goes client → stdio → recorder process (forward, commit to SQLite) → stdio → echo server.
Reports the median over N calls (after a warm-up), the added milliseconds and the ratio.
Target: at most 1 ms added per call.
"""

from __future__ import annotations

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
_RAW = TypeAdapter(dict[str, Any])


async def _timed_call(client: Client, i: int) -> float:
    request = types.CallToolRequest(
        params=types.CallToolRequestParams(name="echo", arguments={"text": f"call {i}"})
    )
    started = time.perf_counter()
    await client.session.send_request(request, _RAW)  # type: ignore[arg-type]
    return (time.perf_counter() - started) * 1000


async def measure(calls: int = CALLS) -> dict[str, float]:
    """Median per-call milliseconds directly and through the recorder, their difference and ratio.

    Both clients stay open and their calls alternate, so background load hits both alike.
    """
    direct_target = StdioServerParameters(command=sys.executable, args=[str(ECHO)])
    direct: list[float] = []
    recorded: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        replay_sim = str(Path(sys.executable).parent / "replay-sim")
        recorded_target = StdioServerParameters(
            command=replay_sim,
            args=[
                "record",
                "--db",
                str(Path(tmp) / "bench.db"),
                "--name",
                "echo",
                "--",
                sys.executable,
                str(ECHO),
            ],
        )
        async with (
            Client(direct_target, mode="legacy", cache=None) as direct_client,
            Client(recorded_target, mode="legacy", cache=None) as recorded_client,
        ):
            for i in range(WARMUP + calls):
                d = await _timed_call(direct_client, i)
                r = await _timed_call(recorded_client, i)
                if i >= WARMUP:
                    direct.append(d)
                    recorded.append(r)
    d_ms, r_ms = statistics.median(direct), statistics.median(recorded)
    return {"direct_ms": d_ms, "recorded_ms": r_ms, "added_ms": r_ms - d_ms, "ratio": r_ms / d_ms}


def main() -> None:
    """Print the recorder overhead figures."""
    figures = anyio.run(measure)
    print(
        f"   recorder overhead over {CALLS} echo calls (stdio upstream, median): "
        f"direct {figures['direct_ms']:.3f} ms, recorded {figures['recorded_ms']:.3f} ms, "
        f"added {figures['added_ms']:.3f} ms, ratio {figures['ratio']:.2f}x (target: <= 1 ms added)"
    )


if __name__ == "__main__":
    main()
