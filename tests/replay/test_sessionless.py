"""Clients with no episode and no session: never a guess where the server's state matters.

The MCP SDK's default client speaks the 2026-07-28 era over HTTP, which has no session: without an
episode id nothing ties a rollout's requests together. A call whose answer depends on state is a miss
naming the fix; a call whose recordings agree is answered as usual. Handshake-era sessions and stdio
clients keep their own history. Real HTTP on 127.0.0.1 (and a real ``serve --stdio`` process).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from recording_helpers import PYTHON, ROOT, proxy_stdio, run_script, stdio, step
from replay_helpers import build_store, make_replay, match_of, text_result, tool_call

from replay_sim.listener import serving_in_thread
from replay_sim.replay.factory import open_replay
from replay_sim.replay.http.app import create_app
from replay_sim.resolve.calibration import MatchConfig, ToolOverride

pytestmark = pytest.mark.anyio

MODES = ["auto", "legacy"]
"""The SDK client's default (2026-07-28, sessionless over HTTP) and the handshake era."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The demo store's replay over real HTTP: ``counter`` recorded as 0, then 1 after ``increment``."""
    replay = make_replay(tmp_path_factory.mktemp("sessionless") / "replay.db")
    with serving_in_thread(create_app(replay)) as url:
        yield f"{url}/mcp/demo"


@contextlib.asynccontextmanager
async def connect(url: str, mode: str, headers: dict[str, str] | None = None) -> AsyncIterator[Client]:
    """An SDK client in ``mode`` whose HTTP requests all carry ``headers``."""
    async with (
        httpx2.AsyncClient(headers=headers or {}, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,  # type: ignore[arg-type]
    ):
        assert (client.protocol_version in MODERN_PROTOCOL_VERSIONS) == (mode == "auto")
        yield client


def text(result: types.CallToolResult) -> str:
    assert isinstance(result.content[0], types.TextContent)
    return result.content[0].text


def names_the_fix(result: types.CallToolResult) -> bool:
    """A miss that tells the client how to give its requests a history."""
    said = text(result)
    return (
        result.is_error
        and match_of(result)["status"] == "miss"
        and "X-Replay-Episode" in said
        and '_meta["replay-sim/episode"]' in said
    )


async def test_a_sessionless_write_and_the_read_after_it_are_misses_naming_the_fix(served: str) -> None:
    async with connect(served, "auto") as client:
        wrote = await client.call_tool("increment", {})
        read = await client.call_tool("counter", {})
    assert names_the_fix(wrote) and "may change the server's state" in text(wrote)
    # The recordings answer 0 before the write and 1 after it: never the pre-write "0".
    assert names_the_fix(read) and "answer differently" in text(read)
    assert [c["recording"] for c in match_of(read)["candidates"]] == [7, 9]


async def test_a_sessionless_read_is_a_miss_even_before_any_write(served: str) -> None:
    async with connect(served, "auto") as client:
        assert names_the_fix(await client.call_tool("counter", {}))


async def test_a_session_answers_reads_recorded_from_one_state_as_recorded(served: str) -> None:
    async with connect(served, "legacy") as client:
        echoed = await client.call_tool("echo", {"message": "hello"})
        readme = await client.read_resource("file:///readme.md")
        unknown = await client.call_tool("nosuch", {})
        with pytest.raises(MCPError, match="boom"):  # a recorded error is still the recorded error
            await client.call_tool("echo", {"message": "boom"})
    assert text(echoed) == "hello" and match_of(echoed)["status"] == "exact"
    assert isinstance(readme.contents[0], types.TextResourceContents) and readme.contents[0].text == "# Demo"
    assert unknown.is_error and text(unknown) == "Unknown tool: nosuch"  # refused as the real server does


async def test_a_sessionless_read_recorded_from_one_state_only_is_a_miss_but_refusals_are_answered(
    served: str,
) -> None:
    # `increment` may change state and every recording of these reads was made before it: whether
    # this client incremented (unseen: its write went elsewhere or missed) nothing shows.
    async with connect(served, "auto") as client:
        echoed = await client.call_tool("echo", {"message": "hello"})
        unknown = await client.call_tool("nosuch", {})
        with pytest.raises(MCPError, match="X-Replay-Episode"):
            await client.read_resource("file:///readme.md")
    assert names_the_fix(echoed) and "made from one state" in text(echoed)
    assert unknown.is_error and text(unknown) == "Unknown tool: nosuch"  # refused as the real server does


@pytest.mark.parametrize("mode", MODES)
async def test_an_episode_header_gives_the_read_the_post_write_answer(served: str, mode: str) -> None:
    async with connect(served, mode, {"X-Replay-Episode": f"header-{mode}"}) as client:
        before = await client.call_tool("counter", {})
        await client.call_tool("increment", {})
        after = await client.call_tool("counter", {})
    assert (text(before), text(after)) == ("0", "1")
    assert match_of(after) == {"status": "exact", "score": 1.0, "recording": 9, "snapshot": None}


async def test_an_episode_in_meta_gives_a_sessionless_client_its_history(served: str) -> None:
    meta = {"replay-sim/episode": "meta-auto"}
    async with connect(served, "auto") as client:
        await client.call_tool("increment", {}, meta=meta)
        assert text(await client.call_tool("counter", {}, meta=meta)) == "1"
        assert names_the_fix(await client.call_tool("counter", {}))  # the same client, no episode


async def test_handshake_sessions_keep_their_own_history_without_an_episode(served: str) -> None:
    async with connect(served, "legacy") as one, connect(served, "legacy") as two:
        await one.call_tool("increment", {})
        assert text(await one.call_tool("counter", {})) == "1"
        assert text(await two.call_tool("counter", {})) == "0"


@pytest.mark.parametrize("mode", MODES)
async def test_a_stdio_client_is_a_session_of_its_own_in_either_era(tmp_path: Path, mode: str) -> None:
    build_store(tmp_path / "stdio.db").close()
    params = StdioServerParameters(
        command=str(Path(sys.executable).parent / "replay-sim"),
        args=["serve", "--stdio", "--server", "demo", "--db", str(tmp_path / "stdio.db")],
        cwd=str(tmp_path),
    )
    with anyio.fail_after(60):
        async with Client(params, mode=mode) as client:
            assert (client.protocol_version in MODERN_PROTOCOL_VERSIONS) == (mode == "auto")
            before = await client.call_tool("counter", {})
            await client.call_tool("increment", {})
            after = await client.call_tool("counter", {})
    assert (text(before), text(after)) == ("0", "1")


async def test_recordings_that_agree_across_states_answer_without_a_history(tmp_path: Path) -> None:
    replay = make_replay(tmp_path / "r.db")
    store = replay.store
    session = store.start_session("demo", "s-2")
    # echo "same" before and after an increment, with the same answer; echo "after" only after two.
    for message in ("same", "same", "after"):
        echo = tool_call("echo", message=message)
        store.record_call("demo", "tools/call", echo, result=text_result(message), session=session)
        if message == "same":
            store.record_call(
                "demo", "tools/call", tool_call("increment"), result=text_result("ok"), session=session
            )
    answer = await replay.resolve("demo", "tools/call", tool_call("echo", message="same"), None)
    assert answer.status == "exact"
    # Recorded only after state changes: no telling whether this client made them.
    after = await replay.resolve("demo", "tools/call", tool_call("echo", message="after"), None)
    assert after.status == "miss" and "recorded only after state changes" in after.resolution.reason


async def test_a_sessionless_resource_whose_recordings_differ_is_the_resource_miss(tmp_path: Path) -> None:
    replay = make_replay(tmp_path / "r.db")
    session = replay.store.start_session("demo", "s-2")
    changed = {"contents": [{"uri": "file:///readme.md", "mimeType": "text/markdown", "text": "# Changed"}]}
    replay.store.record_call(
        "demo", "resources/read", {"uri": "file:///readme.md"}, result=changed, session=session
    )
    answer = await replay.resolve("demo", "resources/read", {"uri": "file:///readme.md"}, None)
    assert isinstance(answer.reply, MCPError) and "X-Replay-Episode" in answer.reply.error.message
    scoped = await replay.resolve("demo", "resources/read", {"uri": "file:///readme.md"}, ())
    assert scoped.status == "exact"  # with a history (here: empty), the resolver chooses as usual


COUNTER = [PYTHON, ROOT / "fixtures" / "counter_server.py"]


async def test_a_sessionless_read_recorded_from_one_state_is_not_served_after_the_clients_unseen_write(
    tmp_path: Path,
) -> None:
    # The real counter server, recorded: `get beta` only at the initial state; `get gamma` before
    # and after a `put` (two states, one answer).
    db = tmp_path / "r.db"
    recorded = [step("get", key="beta"), step("get", key="gamma"), step("put", key="alpha", value="1")]
    await run_script(proxy_stdio(db, "counter", COUNTER), [*recorded, step("get", key="gamma")])
    # What the real server says to a client that stores beta first (a write no recording answers).
    truth = await run_script(stdio(*COUNTER), [step("put", key="beta", value="2"), step("get", key="beta")])
    with serving_in_thread(create_app(open_replay(db))) as url:
        async with connect(f"{url}/mcp/counter", "auto") as client:
            wrote = await client.call_tool("put", {"key": "beta", "value": "2"})
            read = await client.call_tool("get", {"key": "beta"})
            other = await client.call_tool("get", {"key": "gamma"})
    assert names_the_fix(wrote)
    # Served before: the initial state's answer, which the real server no longer gives.
    assert names_the_fix(read) and "made from one state" in text(read)
    assert truth[1]["content"][0]["text"] == "2"  # the real answer after the write
    assert read.content != truth[1]["content"]  # (not replayed: the initial state's recording differs)
    assert match_of(other)["status"] == "exact"  # recorded from two states that agree


async def test_a_sessionless_call_is_answered_when_no_tool_of_its_server_may_change_state(
    tmp_path: Path,
) -> None:
    db = tmp_path / "r.db"
    await run_script(proxy_stdio(db, "counter", COUNTER), [step("get", key="beta"), step("double", x=2)])
    with serving_in_thread(create_app(open_replay(db))) as url:
        async with connect(f"{url}/mcp/counter", "auto") as client:
            unknown = await client.call_tool("get", {"key": "beta"})
    assert names_the_fix(unknown) and "(double, put)" in text(unknown)  # of unknown effect: may change it
    # The user declares the unannotated tools read-only (get and tally are annotated so).
    declared = MatchConfig(
        tools={"counter/put": ToolOverride(read_only=True), "counter/double": ToolOverride(read_only=True)}
    )
    with serving_in_thread(create_app(open_replay(db, match_config=declared))) as url:
        async with connect(f"{url}/mcp/counter", "auto") as client:
            got = await client.call_tool("get", {"key": "beta"})
    assert match_of(got)["status"] == "exact"
