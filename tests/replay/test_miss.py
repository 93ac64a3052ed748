"""Miss policies: error (default), nearest, live (a real upstream) and synthesize (a fake OpenAI API)."""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi import FastAPI, Request
from mcp import Client
from recording_helpers import REPLAY_SIM, spawn
from replay_helpers import build_store, match_of

from replay_sim.errors import ConfigError
from replay_sim.listener import serving_in_thread
from replay_sim.record.config import RecorderConfig, UpstreamSpec
from replay_sim.record.forward import Forwarder
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.options import MissPolicyName
from replay_sim.replay.policies.miss import MissSettings
from replay_sim.replay.policies.registry import MISS_POLICIES, make_policy, serving_policy
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Origin, ServerRecord, Store

ROOT = Path(__file__).resolve().parents[2]


def _replay(store: Store, miss: str, **settings: Any) -> Replay:
    resolver = Resolver(store, index_dir=None)
    policy, holds = serving_policy(miss, MissSettings(store=store, lookup=resolver.lookup, **settings))
    return Replay(store, resolver=resolver, policy=policy, policy_name=miss, holds=holds)


def test_the_registry_names_every_policy_and_rejects_unknown_ones(tmp_path: Path) -> None:
    assert set(MISS_POLICIES) == set(MissPolicyName)
    store = Store(tmp_path / "s.db")
    with pytest.raises(ConfigError, match="choose one of error, nearest, live, sandbox, synthesize"):
        make_policy("guess", MissSettings(store=store))
    with pytest.raises(ConfigError, match="needs a recorder config"):
        make_policy("live", MissSettings(store=store))
    with pytest.raises(ConfigError, match="needs --llm-url and --llm-model"):
        make_policy("synthesize", MissSettings(store=store))
    with pytest.raises(ConfigError, match="needs a recorder config declaring the sandbox servers"):
        make_policy("sandbox", MissSettings(store=store))


def test_nearest_serves_the_closest_recording_marked_nearest(tmp_path: Path) -> None:
    replay = _replay(build_store(tmp_path / "n.db"), "nearest")

    async def main() -> Any:
        async with Client(replay.server("demo"), mode="legacy") as client:
            return await client.call_tool("echo", {"message": "hello world"})

    result = anyio.run(main)
    assert result.content[0].text == "hello"
    match = match_of(result)
    assert match["status"] == "nearest" and match["recording"] == 1 and 0 < match["score"] < 1
    assert match["candidates"][0]["differences"][0]["field"] == "message"


# -- live ---------------------------------------------------------------------------------------


def _echo_store(path: Path) -> Store:
    store = Store(path)
    store.put_server(ServerRecord("echo", {"name": "echo-server", "version": "1"}, {"tools": {}}))
    text = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    steps = {"type": "object", "properties": {"steps": {"type": "integer"}}}
    store.put_listing(
        "echo",
        "tools/list",
        {
            "tools": [
                {"name": "echo", "inputSchema": text, "annotations": {"readOnlyHint": True}},
                {"name": "progress", "inputSchema": steps, "annotations": {"readOnlyHint": True}},
            ]
        },
    )
    return store


def test_live_forwards_a_miss_to_the_real_server_records_it_and_serves_it(tmp_path: Path) -> None:
    store = _echo_store(tmp_path / "live.db")
    spec = UpstreamSpec(command=sys.executable, args=(str(ROOT / "fixtures/echo_server.py"),))
    forwarder = Forwarder(RecorderConfig(servers={"echo": spec}))
    replay = _replay(store, "live", forward=forwarder, connections=forwarder)

    async def main() -> tuple[Any, Any, Any]:
        async with AsyncExitStack() as stack:
            await replay.enter(stack)
            with anyio.fail_after(60):
                async with Client(replay.server("echo"), mode="legacy") as client:
                    first = await client.call_tool("echo", {"text": "fresh"})
                    again = await client.call_tool("echo", {"text": "fresh"})
                    progress = await client.call_tool("progress", {"steps": 2})
        return first, again, progress

    first, again, progress = anyio.run(main)
    assert first.content[0].text == "fresh" and match_of(first)["status"] == "live"
    recorded = store.recordings("echo", name="echo")
    assert [(r.origin, r.result["content"][0]["text"]) for r in recorded] == [(Origin.LIVE, "fresh")]
    assert match_of(again) == {"status": "exact", "score": 1.0, "recording": recorded[0].id, "snapshot": None}
    assert progress.content[0].text == "done after 2 steps"
    notes = store.recordings("echo", name="progress")[0].notifications
    assert [n["method"] for n in notes] == ["notifications/progress", "notifications/message"] * 2
    assert "progressToken" not in notes[0]["params"]


# -- synthesize ----------------------------------------------------------------------------------


@pytest.fixture
def fake_openai() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local server speaking the OpenAI chat completions protocol; answers with a fixed tool result."""
    requests: list[dict[str, Any]] = []
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> dict[str, Any]:
        body = await request.json()
        requests.append({"body": body, "authorization": request.headers.get("authorization")})
        answer = {"content": [{"type": "text", "text": "hello, synthesized"}], "isError": False}
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "```json\n" + json.dumps(answer) + "\n```"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }

    with serving_in_thread(app) as url:
        yield f"{url}/v1", requests


def test_synthesize_asks_the_llm_with_schema_and_examples_and_stores_a_synthetic_answer(
    tmp_path: Path, fake_openai: tuple[str, list[dict[str, Any]]]
) -> None:
    url, requests = fake_openai
    store = build_store(tmp_path / "syn.db")
    replay = _replay(store, "synthesize", llm_url=url, llm_model="tiny", llm_api_key="k-123")

    async def main() -> tuple[Any, Any]:
        async with Client(replay.server("demo"), mode="legacy") as client:
            first = await client.call_tool("echo", {"message": "hello world"})
            again = await client.call_tool("echo", {"message": "hello world"})
        return first, again

    first, again = anyio.run(main)
    assert first.content[0].text == "hello, synthesized"
    assert match_of(first)["status"] == "synthetic" and match_of(again)["status"] == "synthetic"
    assert len(requests) == 1  # the stored synthetic answer serves the repeat
    sent = requests[0]
    assert sent["authorization"] == "Bearer k-123" and sent["body"]["model"] == "tiny"
    prompt = json.loads(sent["body"]["messages"][1]["content"])
    assert prompt["tool"]["name"] == "echo" and prompt["tool"]["inputSchema"]["required"] == ["message"]
    assert {"name": "echo", "arguments": {"message": "hello"}} in [
        e["request"] for e in prompt["recorded_examples"]
    ]
    assert prompt["request"]["params"]["arguments"] == {"message": "hello world"}
    (stored,) = [r for r in store.recordings("demo", name="echo") if r.origin == Origin.SYNTHETIC]
    assert stored.result == {"content": [{"type": "text", "text": "hello, synthesized"}], "isError": False}


def test_synthesize_reports_an_unreachable_llm_as_a_tool_error_not_a_crash(tmp_path: Path) -> None:
    store = build_store(tmp_path / "down.db")
    with socket.socket() as taken:  # bound, never listening: connections to it are refused
        taken.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{taken.getsockname()[1]}/v1"
        replay = _replay(store, "synthesize", llm_url=url, llm_model="m", timeout=5)

        async def main() -> Any:
            async with Client(replay.server("demo"), mode="legacy") as client:
                return await client.call_tool("echo", {"message": "hello world"})

        result = anyio.run(main)
    assert result.is_error and "LLM at http://127.0.0.1" in result.content[0].text
    assert match_of(result)["status"] == "miss"


# -- how much a miss tells (serve --miss-detail) --------------------------------------------------

_NO_RECORDING = "replay-sim: no recording answers this tools/call of tool 'echo' on 'demo'."
_MISS_DETAIL = [
    (
        "full",
        ["Nearest: recording #1 (score", "message: recorded 'hello', requested 'hello world'"],
        [{"field": "message", "recorded": "hello", "requested": "hello world"}],
    ),
    ("reason", ["Reason: ", "Nearest: recording #1 (score", ": message differs"], [{"field": "message"}]),
    ("none", [], None),
]


@pytest.mark.parametrize(("detail", "said", "differences"), _MISS_DETAIL)
def test_a_miss_tells_as_much_as_its_miss_detail_allows(
    tmp_path: Path, detail: str, said: list[str], differences: list[dict[str, Any]] | None
) -> None:
    store = build_store(tmp_path / "detail.db")
    replay = Replay(store, resolver=Resolver(store, index_dir=None), miss_detail=detail)

    async def main() -> Any:
        async with Client(replay.server("demo"), mode="legacy") as client:
            return await client.call_tool("echo", {"message": "hello world"})

    result = anyio.run(main)
    text = result.content[0].text
    assert result.is_error and text.startswith(
        "replay-sim: no recording answers this tools/call of tool 'echo'"
    )
    assert all(part in text for part in said), text
    match = match_of(result)
    if differences is None:  # none: only that no recording matches
        assert text == _NO_RECORDING
        assert match["candidates"] == []
    else:
        assert match["candidates"][0]["recording"] == 1
        assert match["candidates"][0]["differences"] == differences
    if detail != "full":
        assert "'hello'," not in text and "recorded" not in json.dumps(match)  # no recorded argument


def test_serving_and_serve_take_the_miss_detail(tmp_path: Path) -> None:
    import replay_sim

    build_store(tmp_path / "served.db").close()

    async def miss(url: str) -> Any:
        async with Client(f"{url}/mcp/demo", mode="legacy") as client:
            return await client.call_tool("echo", {"message": "hello world"})

    with replay_sim.serving(tmp_path / "served.db", index_dir=tmp_path / "index", miss_detail="none") as sim:
        result = anyio.run(miss, sim.url)
    assert (
        result.content[0].text == "replay-sim: no recording answers this tools/call of tool 'echo' on 'demo'."
    )
    with pytest.raises(ConfigError, match="unknown miss detail 'some': choose full, reason, none"):
        replay_sim.serving(tmp_path / "served.db", miss_detail="some").__enter__()

    async def served() -> str:
        command = [REPLAY_SIM, "serve", "--db", tmp_path / "served.db", "--port", "0"]
        async with spawn(*command, "--index-dir", tmp_path / "index", "--miss-detail", "reason") as process:
            match = await process.wait_for(r"^listening on (http://127\.0\.0\.1:\d+)$")
            with anyio.fail_after(300):  # the first call loads the model; each asks for 10 s at most
                while "embedding model is still loading" in (
                    text := (await miss(match.group(1))).content[0].text
                ):
                    pass
            return text

    text = anyio.run(served)
    assert "Nearest: recording #1" in text and ": message differs" in text and "recorded 'hello'" not in text
