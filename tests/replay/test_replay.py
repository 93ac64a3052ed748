"""The replay server's handlers, driven in-process with ``mcp.Client(server)``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from replay_helpers import COUNTER_TOOLS, make_replay, match_of

from replay_sim.errors import ConfigError
from replay_sim.store import ServerRecord

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def replay(tmp_path: Path) -> Any:
    return make_replay(tmp_path / "replay.db")


async def test_initialize_answers_with_the_recorded_identity_and_capabilities(
    replay: Any,
) -> None:
    async with Client(replay.server("demo"), mode="legacy") as client:
        assert client.server_info is not None
        assert (client.server_info.name, client.server_info.version) == ("demo-server", "1.2.3")
        assert client.server_info.title == "Demo Server"
        assert client.instructions == "Use echo to echo."
        caps = client.server_capabilities.model_dump(by_alias=True, exclude_none=True)
        assert caps["tools"] == {"listChanged": False}
        assert "completions" in caps and "logging" in caps


async def test_tools_list_is_the_recorded_listing(replay: Any) -> None:
    async with Client(replay.server("demo"), mode="legacy") as client:
        tools = (await client.list_tools()).tools
    dumped = [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in tools]
    assert dumped == COUNTER_TOOLS["tools"]


async def test_resources_templates_and_prompts_are_listed_as_recorded(replay: Any) -> None:
    async with Client(replay.server("demo"), mode="legacy") as client:
        assert [r.uri for r in (await client.list_resources()).resources] == ["file:///readme.md"]
        templates = (await client.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == ["file:///{path}"]
        assert [p.name for p in (await client.list_prompts()).prompts] == ["greet"]


async def test_an_exact_call_gets_the_recorded_result_with_provenance(replay: Any) -> None:
    async with Client(replay.server("demo"), mode="legacy") as client:
        result = await client.call_tool("echo", {"message": "hello"})
    assert result.content[0].text == "hello"
    assert match_of(result) == {"status": "exact", "score": 1.0, "recording": 1, "snapshot": None}


async def test_a_canonical_hit_says_how_the_call_differs_from_its_recording(replay: Any) -> None:
    async with Client(replay.server("demo"), mode="legacy") as client:
        result = await client.call_tool("echo", {"message": "hello", "times": 1})  # the schema default
    assert match_of(result) == {
        "status": "canonical", "score": 1.0, "recording": 1, "snapshot": None,
        "differences": [{"field": "times", "recorded": None, "requested": 1}],
    }  # fmt: skip


async def test_a_state_changing_call_moves_the_session_to_the_next_recorded_answer(replay: Any) -> None:
    async with Client(replay.server("demo"), mode="legacy") as client:
        first = await client.call_tool("counter", {})
        await client.call_tool("increment", {})
        second = await client.call_tool("counter", {})
    assert (first.content[0].text, second.content[0].text) == ("0", "1")
    assert (match_of(first)["recording"], match_of(second)["recording"]) == (7, 9)


async def test_each_session_has_its_own_history(replay: Any) -> None:
    async with (
        Client(replay.server("demo"), mode="legacy") as one,
        Client(replay.server("demo"), mode="legacy") as two,
    ):
        await one.call_tool("increment", {})
        assert (await one.call_tool("counter", {})).content[0].text == "1"
        assert (await two.call_tool("counter", {})).content[0].text == "0"


async def test_an_episode_id_in_meta_shares_history_between_sessions(replay: Any) -> None:
    meta = {"replay-sim/episode": "rollout-7"}
    async with Client(replay.server("demo"), mode="legacy") as one:
        await one.call_tool("increment", {}, meta=meta)
    async with Client(replay.server("demo"), mode="legacy") as two:
        assert (await two.call_tool("counter", {}, meta=meta)).content[0].text == "1"
        assert (await two.call_tool("counter", {})).content[0].text == "0"  # its own session: fresh


async def test_modern_era_requests_have_history_only_with_an_episode_id(replay: Any) -> None:
    async with Client(replay.server("demo")) as client:
        assert client.protocol_version == "2026-07-28"
        wrote, read = await client.call_tool("increment", {}), await client.call_tool("counter", {})
        # No session, no history: a state-dependent call is a miss naming the fix, never the pre-write "0".
        assert wrote.is_error and read.is_error and match_of(read)["status"] == "miss"
        assert "X-Replay-Episode" in read.content[0].text
        meta = {"replay-sim/episode": "modern-1"}
        await client.call_tool("increment", {}, meta=meta)
        counted = await client.call_tool("counter", {}, meta=meta)
    assert counted.content[0].text == "1"
    assert counted.meta["io.modelcontextprotocol/serverInfo"]["name"] == "demo-server"


async def test_an_unknown_tool_gets_the_sdk_refusal_when_none_was_recorded(replay: Any) -> None:
    async with Client(replay.server("demo"), mode="legacy") as client:
        result = await client.call_tool("nosuch", {})
    assert result.is_error and result.content[0].text == "Unknown tool: nosuch"
    assert match_of(result)["status"] == "miss"


async def test_a_missing_argument_is_refused_and_a_wrong_type_is_a_miss_not_a_made_up_refusal(
    replay: Any,
) -> None:
    async with Client(replay.server("demo"), mode="legacy") as client:
        wrong_type = await client.call_tool("echo", {"message": 3})
        missing = await client.call_tool("echo", {})
    # A server may coerce 3 to "3": nothing recorded says it refuses, so no refusal is made up.
    assert wrong_type.is_error and match_of(wrong_type)["status"] == "miss"
    assert (
        "may violate" in wrong_type.content[0].text
        and "3 is not of type 'string'" in wrong_type.content[0].text
    )
    # Every server refuses a call without a required argument.
    assert (
        missing.is_error
        and missing.content[0].text == "Input validation error: 'message' is a required property"
    )


async def test_a_recorded_refusal_sets_the_form_of_later_refusals(tmp_path: Path) -> None:
    replay = make_replay(tmp_path / "r.db")
    replay.store.record_call(
        "other",
        "tools/call",
        {"name": "gone", "arguments": {}},
        error={"code": -32602, "message": "Tool gone not found"},
    )
    replay = type(replay)(replay.store, resolver=replay.resolver)
    async with Client(replay.server("other"), mode="legacy") as client:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("vanished", {})
    assert (raised.value.code, raised.value.message) == (-32602, "Tool vanished not found")


async def test_a_recorded_json_rpc_error_is_replayed_as_that_error(replay: Any) -> None:
    async with Client(replay.server("demo"), mode="legacy") as client:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("echo", {"message": "boom"})
    assert (raised.value.code, raised.value.message) == (-32603, "Internal error: boom")


async def test_a_miss_is_an_error_result_naming_the_nearest_recordings_and_differences(
    replay: Any,
) -> None:
    async with Client(replay.server("demo"), mode="legacy") as client:
        result = await client.call_tool("echo", {"message": "hello world"})
    assert result.is_error
    match = match_of(result)
    assert match["status"] == "miss" and match["recording"] is None
    nearest = match["candidates"][0]
    assert nearest["recording"] == 1
    assert nearest["differences"] == [{"field": "message", "recorded": "hello", "requested": "hello world"}]
    assert "recording #1" in result.content[0].text and "'hello'" in result.content[0].text
    assert replay.metrics.recent_misses()[0]["name"] == "echo"


async def test_resources_prompts_and_completions_replay_through_the_resolver(replay: Any) -> None:
    async with Client(replay.server("demo"), mode="legacy") as client:
        resource = await client.read_resource("file:///readme.md")
        prompt = await client.get_prompt("greet", {"who": "Ada"})
        completion = await client.complete(
            types.PromptReference(type="ref/prompt", name="greet"), {"name": "who", "value": "A"}
        )
    assert resource.contents[0].text == "# Demo"
    assert prompt.messages[0].content.text == "Hello Ada"
    assert completion.completion.values == ["Ada", "Alan"]
    assert match_of(completion)["status"] == "exact"


async def test_an_unrecorded_resource_is_a_resource_not_found_error(replay: Any) -> None:
    async with Client(replay.server("demo"), mode="legacy") as client:
        with pytest.raises(MCPError) as raised:
            await client.read_resource("file:///missing.md")
    assert raised.value.code == -32002
    assert raised.value.data["replay-sim/match"]["status"] == "miss"


async def test_recorded_progress_and_log_notifications_are_re_emitted_in_order(replay: Any) -> None:
    events: list[tuple[str, Any]] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        events.append(("log", params.data))

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        events.append(("progress", (progress, total)))

    async with Client(replay.server("demo"), mode="legacy", logging_callback=on_log) as client:
        result = await client.call_tool("slow", {"steps": 2}, progress_callback=on_progress)
        with anyio.fail_after(5):
            while len(events) < 3:
                await anyio.sleep(0)
    assert result.content[0].text == "done"
    assert events == [("progress", (1, 2)), ("log", "halfway"), ("progress", (2, 2))]


async def test_the_same_call_sequence_yields_byte_identical_results(tmp_path: Path) -> None:
    async def run(path: Path) -> list[str]:
        replay = make_replay(path)
        out = []
        for method, params in [
            ("tools/call", {"name": "counter", "arguments": {}}),
            ("tools/call", {"name": "increment", "arguments": {}}),
            ("tools/call", {"name": "counter", "arguments": {}}),
            ("tools/call", {"name": "echo", "arguments": {"message": "hello world"}}),
        ]:
            trail = replay.histories.trail("demo", "ep")
            answer = await replay.resolve("demo", method, params, trail)
            replay.resolver.advance(trail, answer.resolution)
            out.append(json.dumps(answer.reply, sort_keys=False))
        return out

    assert await run(tmp_path / "a.db") == await run(tmp_path / "b.db")


async def test_asking_for_an_unrecorded_server_names_the_recorded_ones(replay: Any) -> None:
    with pytest.raises(ConfigError, match="recorded: demo, other"):
        replay.server("nope")


def test_strict_refuses_a_store_missing_a_listing_the_capabilities_promise(tmp_path: Path) -> None:
    replay = make_replay(tmp_path / "s.db")
    replay.store.put_server(ServerRecord("bare", {"name": "bare", "version": "1"}, {"tools": {}}))
    replay = type(replay)(replay.store, resolver=replay.resolver)
    assert replay.check(strict=False) == ["server 'bare' advertises tools but no tools/list was recorded"]
    with pytest.raises(ConfigError, match="strict replay refused"):
        replay.check(strict=True)
