"""The sandbox answer log: answers recorded off the answer path, in batches, all of them by the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from replay_sim.replay.policies.recording import AnswerLog, pending_recording
from replay_sim.store import Origin, Store
from replay_sim.store.records import utc_now

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def row(n: int, session: str = "sandbox-s") -> dict[str, Any]:
    return {
        "server": "counter", "method": "tools/call", "params": {"name": "get", "arguments": {"key": f"k{n}"}},
        "result": {"content": [{"type": "text", "text": str(n)}]}, "error": None, "latency_ms": 1.0,
        "origin": Origin.SANDBOX, "notifications": None, "recorded_at": utc_now(), "session": session,
    }  # fmt: skip


async def test_every_queued_answer_is_written_when_the_log_ends_even_before_its_batch_is_due(
    tmp_path: Path,
) -> None:
    with Store(tmp_path / "r.db") as store:
        async with AnswerLog(lambda: store, flush_every=3600) as log:
            log.start_session("counter", "sandbox-s")
            await log.add([row(n) for n in range(3)])
            assert log.waiting == 3 and store.recordings() == []  # not on the answer path
        kept = store.recordings(session="sandbox-s")
        assert [r.arguments for r in kept] == [{"key": f"k{n}"} for n in range(3)]
        assert [r.seq for r in kept] == [1, 2, 3] and log.written == 3 and log.batches == 1


async def test_a_full_batch_is_written_at_once_and_the_served_recording_is_the_written_one(
    tmp_path: Path,
) -> None:
    with Store(tmp_path / "r.db") as store:
        async with AnswerLog(lambda: store, flush_every=3600, batch=4) as log:
            log.start_session("counter", "sandbox-s")
            rows = [row(n) for n in range(4)]
            served = [pending_recording(store, r) for r in rows]
            await log.add(rows)
            with anyio.fail_after(30):
                while log.written < 4:
                    await anyio.sleep(0.01)
            kept = store.recordings(session="sandbox-s")
        assert [(r.key, r.result, r.name, r.arguments) for r in kept] == [
            (r.key, r.result, r.name, r.arguments) for r in served
        ]


async def test_past_its_bound_an_answer_waits_for_the_write_under_way(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        async with AnswerLog(lambda: store, flush_every=3600, batch=1000, bound=2) as log:
            log.start_session("counter", "sandbox-s")
            await log.add([row(0), row(1)])
            with anyio.fail_after(30):
                await log.add([row(2)])  # two wait: this one waits for their write first
            assert log.written == 2 and log.waiting == 1
