"""Schema dialects on real servers: replay refuses only what the real server refuses.

Two real servers, recorded through the real ``replay-sim record`` CLI and then asked the probe calls
directly for their truth: PyPI ``mcp-server-git`` (pydantic: it coerces ``"2"`` for an integer and
refuses ``"ten"`` and null), and the fixture server's ``repeat`` (an OpenAPI-style
``"nullable": true`` property, coerced like pydantic). A replayed answer is either what the real
server said or a miss, never a made-up refusal.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from recording_helpers import BIN, ECHO_SERVER, PYTHON, Script, proxy_stdio, run_script, stdio, step
from replay_helpers import make_replay, match_of

from replay_sim.replay.core.replay import Replay
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _text(answer: dict[str, Any]) -> str:
    return "\n".join(c.get("text", "") for c in answer.get("content") or [])


def _repo(path: Path) -> Path:
    env = {"GIT_AUTHOR_DATE": "2026-01-02T03:04:05Z", "GIT_COMMITTER_DATE": "2026-01-02T03:04:05Z"}
    env |= {"HOME": str(path.parent), "PATH": "/usr/bin:/bin"}
    path.mkdir()
    for args in (
        ["init", "-q", "-b", "main"],
        ["config", "user.email", "t@example.com"],
        ["config", "user.name", "T"],
    ):
        subprocess.run(["git", *args], cwd=path, check=True, env=env)
    for message in ("one", "two", "three"):
        subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", message], cwd=path, check=True, env=env)
    return path


async def _replayed(db: Path, server: str, probes: Script) -> list[Any]:
    store = Store(db, create=False)
    replay = Replay(store, resolver=Resolver(store, index_dir=None, semantic=False))
    async with Client(replay.server(server), mode="legacy") as client:
        return [await client.call_tool(p["name"], p["arguments"]) for _, p in probes]


async def test_a_pydantic_server_s_coercions_and_refusals_are_replayed_as_it_gave_them(
    tmp_path: Path,
) -> None:
    repo = str(_repo(tmp_path / "repo"))
    command = [BIN / "mcp-server-git", "--repository", repo]
    db = tmp_path / "git.db"
    session = [
        ("tools/list", {}),
        step("git_log", repo_path=repo, max_count="2"),  # accepted: pydantic coerces it
        step("git_log", repo_path=repo, max_count="ten"),  # refused
    ]
    recorded = await run_script(proxy_stdio(db, "git", command), session)
    assert not recorded[1].get("isError") and recorded[2].get("isError")
    probes = [
        step("git_log", repo_path=repo, max_count="2"),  # the recorded call: exact
        step("git_log", repo_path=repo, max_count="eleven"),  # refused like "ten"
        step("git_log", repo_path=repo, max_count="1"),  # coerced like "2", but never recorded
        step("git_log", repo_path=repo, max_count=None),  # refused, not "absent ≡ default"
        step("git_log", max_count=2),  # a required argument missing: every dialect refuses
    ]
    truth = await run_script(stdio(*command), probes)
    replayed = await _replayed(db, "git", probes)

    exact, eleven, one, null, missing = replayed
    assert match_of(exact)["status"] == "exact" and exact.content[0].text == _text(truth[0])
    assert eleven.is_error and eleven.content[0].text == _text(truth[1])  # the server's own words
    assert not truth[2].get("isError")  # the real server answers "1": a refusal would be wrong
    assert one.is_error and match_of(one)["status"] == "miss" and "may violate" in one.content[0].text
    assert truth[3].get("isError")  # null is refused: serving the default's log would be wrong
    assert match_of(null)["status"] == "miss" and "may violate" in null.content[0].text
    assert truth[4].get("isError") and missing.is_error
    assert "repo_path" in missing.content[0].text and match_of(missing)["status"] == "miss"


async def test_a_nullable_property_takes_null_and_a_coerced_value_is_never_refused(tmp_path: Path) -> None:
    command = [PYTHON, ECHO_SERVER]
    db = tmp_path / "echo.db"
    session = [
        ("tools/list", {}),
        step("repeat", text="hi"),
        step("repeat", text="hi", times="2"),
        step("repeat", text="hi", times="x"),
    ]
    await run_script(proxy_stdio(db, "echo", command), session)
    probes = [
        step("repeat", text="hi", times=None),  # nullable: valid, and null for an optional is absent
        step("repeat", text="hi", times="2"),  # the recorded coercion: exact
        step("repeat", text="hi", times="3"),  # coerced too, never recorded: a miss, not a refusal
        step("repeat", text="hi", times="y"),  # refused like "x"
    ]
    truth = await run_script(stdio(*command), probes)
    null, two, three, why = await _replayed(db, "echo", probes)

    assert match_of(null)["status"] == "canonical" and null.content[0].text == _text(truth[0]) == "hi"
    assert match_of(two)["status"] == "exact" and two.content[0].text == _text(truth[1]) == "hi hi"
    assert _text(truth[2]) == "hi hi hi" and match_of(three)["status"] == "miss"
    assert "may violate" in three.content[0].text and "times" in three.content[0].text
    assert why.is_error and why.content[0].text == _text(truth[3]) == "times: not a whole number: 'y'"


async def test_an_unknown_tool_is_not_refused_when_the_server_was_recorded_answering_unlisted_tools(
    tmp_path: Path,
) -> None:
    replay = make_replay(tmp_path / "r.db")
    async with Client(replay.server("demo"), mode="legacy") as client:
        assert (await client.call_tool("nosuch", {})).content[0].text == "Unknown tool: nosuch"
    # A tool the listing lacks answered: the listing is not the whole story (tools added later).
    replay.store.record_call(
        "demo", "tools/call", {"name": "late", "arguments": {}}, result={"content": [], "isError": False}
    )
    replay = Replay(replay.store, resolver=Resolver(replay.store, index_dir=None, semantic=False))
    async with Client(replay.server("demo"), mode="legacy") as client:
        result = await client.call_tool("nosuch", {})
    assert result.is_error and match_of(result)["status"] == "miss"
    assert "Unknown tool" not in result.content[0].text and "unknown tool 'nosuch'" in result.content[0].text
