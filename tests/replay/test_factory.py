"""``open_replay``: a store or snapshot opened and wired up, with what it needs injected."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from replay_helpers import build_store

from replay_sim.errors import ConfigError, StoreError
from replay_sim.redaction import REDACTED, Redactor
from replay_sim.replay.factory import open_replay


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_opening_a_store_that_does_not_exist_is_refused_naming_the_path(tmp_path: Path) -> None:
    typo = tmp_path / "typo.db"
    with pytest.raises(StoreError, match=re.escape(f"{typo}: no such recording store")):
        open_replay(typo)
    assert not typo.exists()  # nothing was created in its place


def test_the_live_policy_needs_a_forwarder(tmp_path: Path) -> None:
    build_store(tmp_path / "r.db").close()
    with pytest.raises(ConfigError, match="'live' needs a recorder config"):
        open_replay(tmp_path / "r.db", miss="live")


@pytest.mark.anyio
async def test_an_injected_forwarder_answers_misses_and_the_injected_redactor_applies(tmp_path: Path) -> None:
    build_store(tmp_path / "r.db").close()
    forwarded: list[tuple[str, str, dict[str, Any]]] = []

    async def forward(server: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        forwarded.append((server, method, params))
        return {"params": params, "result": {"content": [], "isError": False}, "latency_ms": 1.0}

    redactor = Redactor(secrets=["hunter2"])
    replay = open_replay(tmp_path / "r.db", miss="live", forward=forward, redactor=redactor)
    answer = await replay.resolve("demo", "tools/call", {"name": "echo", "arguments": {"message": "hunter2"}})
    assert answer.status == "live"
    assert forwarded == [("demo", "tools/call", {"name": "echo", "arguments": {"message": "hunter2"}})]
    # The injected secret is redacted from incoming calls, on top of the rules the store records.
    assert replay.redactor.redact({"message": "say hunter2"}) == {"message": f"say {REDACTED}"}
