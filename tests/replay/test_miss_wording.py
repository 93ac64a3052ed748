"""What a miss says under ``--miss-detail full``: never another episode's arguments; the earlier call
it blames named by tool and arguments, and a tool of unknown effect called so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import replay_sim
from replay_sim.store import Origin, ServerRecord, Store

pytestmark = pytest.mark.anyio

_SCHEMA = {"type": "object", "properties": {"key": {"type": "string"}, "value": {"type": "string"}}}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _text(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}]}


def _store(path: Path) -> Path:
    """``put`` recorded live by the recorder, and once by another episode's sandbox (its own secret)."""
    with Store(path) as store:
        tools = [{"name": "put", "inputSchema": _SCHEMA}, {"name": "get", "inputSchema": _SCHEMA}]
        store.put_server(ServerRecord("kv", {"name": "kv", "version": "1"}, {"tools": {}}, "2025-06-18"))
        store.put_listing("kv", "tools/list", {"tools": tools})
        for session, value, origin in (
            ("rec", "public", Origin.LIVE),
            ("sb", "their-secret", Origin.SANDBOX),
        ):
            store.start_session("kv", session)
            params = {"name": "put", "arguments": {"key": "k", "value": value}}
            store.record_call("kv", "tools/call", params, result=_text("ok"), session=session, origin=origin)
        store.record_call(
            "kv",
            "tools/call",
            {"name": "get", "arguments": {"key": "k"}},
            result=_text("public"),
            session="rec",
        )
    return path


async def test_a_full_miss_shows_the_recorders_arguments_but_never_another_episodes(tmp_path: Path) -> None:
    db = _store(tmp_path / "r.db")
    async with (
        replay_sim.serving(db=db, miss_detail="full", index_dir=tmp_path / "index") as sim,
        Client(sim.episode("mine").url("kv")) as client,
    ):
        missed = await client.call_tool("put", {"key": "k", "value": "mine"})
    said = str(missed.content[0].text)  # type: ignore[union-attr]
    candidates = (missed.meta or {})[replay_sim.MATCH_META_KEY]["candidates"]
    assert missed.is_error and "their-secret" not in said and "their-secret" not in str(candidates)
    assert "value: recorded 'public', requested 'mine'" in said  # the recorder's own: shown
    assert "value differs" in said  # the sandbox's: its field only
    assert {"field": "value"} in [d for c in candidates for d in c["differences"]]


async def test_a_miss_after_an_unrecorded_call_names_that_call_and_its_unknown_effect(tmp_path: Path) -> None:
    db = _store(tmp_path / "r.db")
    async with (
        replay_sim.serving(db=db, miss_detail="full", index_dir=tmp_path / "index") as sim,
        Client(sim.episode("e").url("kv")) as client,
    ):
        await client.call_tool("put", {"key": "z", "value": "new"})  # never recorded: the state is unknown
        later = await client.call_tool("get", {"key": "k"})
    said = str(later.content[0].text)  # type: ignore[union-attr]
    assert later.is_error
    assert 'earlier call put({"key":"z","value":"new"}), a call of unknown effect, was never answered' in said
    assert "state-changing" not in said
