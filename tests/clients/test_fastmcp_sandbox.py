"""fastmcp's ``Client`` on stateful episodes served with ``serving(miss="sandbox", config=...)``:
each episode writes something no recording has and reads it back from its own instance."""

from __future__ import annotations

from pathlib import Path

import anyio
from fastmcp import Client
from recording_helpers import step
from sandbox_helpers import record, write_config

import replay_sim
from replay_sim import match_of


def test_fastmcp_rollouts_write_what_was_never_recorded_and_read_back_their_own(tmp_path: Path) -> None:
    db = tmp_path / "replay.db"
    anyio.run(record, db, "counter", [step("put", key="seen", value="recorded"), step("get", key="seen")])
    config = write_config(tmp_path / "recorder.toml")
    with replay_sim.serving(
        db, miss="sandbox", config=config, sandbox_pool=0, index_dir=tmp_path / "index"
    ) as sim:
        a, b = sim.episode(), sim.episode()

        async def rollouts() -> list[tuple[str, str]]:
            async with Client(a.url("counter")) as one, Client(b.url("counter")) as two:
                await one.call_tool("put", {"key": "answer", "value": "forty-two"})
                await two.call_tool("put", {"key": "answer", "value": "seven"})
                seen = []
                for client in (one, two):
                    result = await client.call_tool("get", {"key": "answer"})
                    match = match_of(result)
                    assert match is not None
                    seen.append((result.content[0].text, match.status))
                return seen

        assert anyio.run(rollouts) == [("forty-two", "sandbox"), ("seven", "sandbox")]
        assert a.stats()["sandbox"]["instances"] == b.stats()["sandbox"]["instances"] == 1
