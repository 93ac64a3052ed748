"""The fast path: recorded answers as one JSON body, the SDK path's very bytes, no SDK models per call.

Two servers over copies of one store run side by side on 127.0.0.1: the replay app as it ships, and
the same app with its fast path taken out (every request through the MCP SDK). Each request goes to
both, in a fresh session (so both answer it from the same history), and the JSON-RPC bodies must be
byte-identical. Over stdio, ``replay-sim serve --stdio``'s answers are compared with the SDK path's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.server.streamable_http as sdk_http
import pytest
from mcp_types import JSONRPCResponse
from replay_helpers import ACCEPT, COUNTER_TOOLS, build_store, initialize, text_result

from replay_sim.listener import serving_in_thread
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.http.app import create_app
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store

MODERN = "2026-07-28"
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}
READ_ONLY = {"readOnlyHint": True}
EXTRA_TOOLS = [
    {
        "name": "weather",
        "annotations": READ_ONLY,
        "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
    {"name": "fail", "annotations": READ_ONLY, "inputSchema": {"type": "object", "properties": {}}},
    {
        "name": "say",
        "annotations": READ_ONLY,
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
]
WEATHER = {
    "content": [{"type": "text", "text": '{"temp": 21.5}'}],
    "structuredContent": {"temp": 21.5, "unit": "C", "big": 1e20, "none": None},
    "isError": False,
}
FAILED = {"content": [{"type": "text", "text": "no such city"}], "isError": True}
UNICODE = text_result('héllo ✓ \u2028 "quoted" \\ 😀')

CALLS = [
    ("tools/call", {"name": "echo", "arguments": {"message": "hello"}}, "exact"),
    ("tools/call", {"name": "echo", "arguments": {"message": "hello", "times": 1}}, "canonical"),
    ("tools/call", {"name": "weather", "arguments": {"city": "Oslo"}}, "exact"),
    ("tools/call", {"name": "fail", "arguments": {}}, "exact"),
    ("tools/call", {"name": "say", "arguments": {"text": "hi"}}, "exact"),
    ("resources/read", {"uri": "file:///readme.md"}, "exact"),
    ("prompts/get", {"name": "greet", "arguments": {"who": "Ada"}}, "exact"),
]
IDS = [7, -1, 2**70, "req-é", 'a"b']


def _store(path: Path) -> None:
    with build_store(path) as store:
        store.put_listing("demo", "tools/list", {"tools": [*COUNTER_TOOLS["tools"], *EXTRA_TOOLS]})
        session = store.start_session("demo", "s-2")
        for name, arguments, result in [
            ("weather", {"city": "Oslo"}, WEATHER),
            ("fail", {}, FAILED),
            ("say", {"text": "hi"}, UNICODE),
        ]:
            store.record_call(
                "demo", "tools/call", {"name": name, "arguments": arguments}, result=result, session=session
            )


def _replay(path: Path, **options: Any) -> Replay:
    store = Store(path)
    replay = Replay(store, resolver=Resolver(store, index_dir=None), **options)
    replay.resolver.warm(wait=True)  # canonical hits wait for the warm-up's matching state otherwise
    return replay


class Answered:
    """Counts what the SDK path does per call: handler bodies, request validations, response dumps."""

    def __init__(self, replay: Replay, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answers = self.validations = self.dumps = 0
        resolve, validate, dump = (
            replay.resolve,
            sdk_http.jsonrpc_message_adapter,
            JSONRPCResponse.model_dump_json,
        )

        async def counted_resolve(*args: Any, **kwargs: Any) -> Any:  # the SDK handler body's work per call
            self.answers += 1
            return await resolve(*args, **kwargs)

        class CountedAdapter:
            def validate_python(inner, *args: Any, **kwargs: Any) -> Any:
                self.validations += 1
                return validate.validate_python(*args, **kwargs)

        def counted_dump(model: Any, *args: Any, **kwargs: Any) -> Any:
            self.dumps += 1
            return dump(model, *args, **kwargs)

        monkeypatch.setattr(replay, "resolve", counted_resolve)
        monkeypatch.setattr(sdk_http, "jsonrpc_message_adapter", CountedAdapter())
        monkeypatch.setattr(JSONRPCResponse, "model_dump_json", counted_dump)

    def reset(self) -> None:
        self.answers = self.validations = self.dumps = 0


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fastpath") / "replay.db"
    _store(path)
    return path


@pytest.fixture(scope="module")
def servers(db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Replay]]:
    """(fast URL, SDK-only URL, the fast server's replay)."""
    copy = tmp_path_factory.mktemp("sdk") / "replay.db"
    shutil.copy(db, copy)
    fast, sdk = _replay(db), _replay(copy)
    sdk_app = create_app(sdk)
    sdk_app.fast = None  # every request through the MCP SDK, as before the fast path
    with serving_in_thread(create_app(fast)) as fast_url, serving_in_thread(sdk_app) as sdk_url:
        yield fast_url, sdk_url, fast


async def _open(http: httpx2.AsyncClient, url: str, version: str = "2025-11-25") -> dict[str, str]:
    """A handshake-era session: the headers its requests carry."""
    opened = await http.post(url, json=initialize(version), headers=ACCEPT)
    assert opened.headers["content-type"] == "application/json"  # the SDK path's single answer, as JSON
    headers = {k.lower(): v for k, v in ACCEPT.items()}
    headers |= {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": version}
    await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    return headers


def _modern(method: str, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    headers = {k.lower(): v for k, v in ACCEPT.items()} | {
        "mcp-protocol-version": MODERN,
        "mcp-method": method,
    }
    name = params.get("name", params.get("uri"))
    if name is not None:
        headers["mcp-name"] = name
    return {**params, "_meta": ENVELOPE}, headers


async def _post(
    http: httpx2.AsyncClient, url: str, id_: Any, method: str, params: Any, era: str
) -> httpx2.Response:
    if era == "modern":
        params, headers = _modern(method, params)
        # No session: an episode gives the reads their history (the demo server's `increment` may
        # change state, so a read with no history is a miss naming the fix).
        headers["x-replay-episode"] = "fast-path-modern"
    else:
        headers = await _open(http, url, era)
    body = json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params})
    return await http.post(url, content=body, headers=headers)


@pytest.mark.parametrize("era", ["2025-11-25", "2025-06-18", "modern"])
def test_fast_answers_are_the_sdk_paths_bytes_as_one_json_body(
    servers: tuple[str, str, Replay], era: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast_url, sdk_url, replay = servers
    for method, params, _ in CALLS:  # a tool's first canonical call builds its matching state (off the loop)
        replay.resolver.resolve("demo", method, params)
    counted = Answered(replay, monkeypatch)

    async def main() -> None:
        async with httpx2.AsyncClient(timeout=30) as http:
            for (method, params, status), id_ in zip(CALLS, IDS * 2, strict=False):
                fast = await _post(http, f"{fast_url}/mcp/demo", id_, method, params, era)
                sdk = await _post(http, f"{sdk_url}/mcp/demo", id_, method, params, era)
                assert fast.status_code == sdk.status_code == 200
                assert fast.headers["content-type"] == sdk.headers["content-type"] == "application/json"
                assert fast.content == sdk.content, (method, params)
                answer = json.loads(fast.content)
                assert answer["id"] == id_
                assert answer["result"]["_meta"]["replay-sim/match"]["status"] == status, answer
                if era != "modern":
                    assert fast.headers["mcp-session-id"]

    anyio.run(main)
    assert counted.answers == 0  # no call reached the SDK's handler on the fast server


def test_a_warm_fast_path_builds_no_sdk_model_per_call(
    servers: tuple[str, str, Replay], monkeypatch: pytest.MonkeyPatch
) -> None:
    fast_url, _, replay = servers
    url = f"{fast_url}/mcp/demo"

    async def main(counted: Answered) -> None:
        async with httpx2.AsyncClient(timeout=30) as http:
            headers = await _open(http, url)
            call = {"name": "echo", "arguments": {"message": "hello"}}
            first = await http.post(
                url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}, headers=headers
            )
            counted.reset()
            for i in range(2, 12):
                body = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": call}
                again = await http.post(url, json=body, headers=headers)
                assert again.content == first.content.replace(b'"id":1,', f'"id":{i},'.encode())

    counted = Answered(replay, monkeypatch)
    anyio.run(main, counted)
    assert (counted.answers, counted.validations, counted.dumps) == (0, 0, 0)


def test_history_is_kept_alike_by_the_fast_and_the_sdk_path(
    servers: tuple[str, str, Replay], monkeypatch: pytest.MonkeyPatch
) -> None:
    fast_url, _, replay = servers
    url = f"{fast_url}/mcp/demo"
    prepared = replay.prepared.answer

    def sdk_for_increment(server: str, method: str, params: dict[str, Any], *rest: Any) -> Any:
        return None if params.get("name") == "increment" else prepared(server, method, params, *rest)

    monkeypatch.setattr(replay.prepared, "answer", sdk_for_increment)
    counted = Answered(replay, monkeypatch)

    async def main() -> list[str]:
        async with httpx2.AsyncClient(timeout=30) as http:
            headers = await _open(http, url)
            texts = []
            for i, tool in enumerate(["counter", "increment", "counter"]):
                body = {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "tools/call",
                    "params": {"name": tool, "arguments": {}},
                }
                answer = await http.post(url, json=body, headers=headers)
                texts.append(answer.json()["result"]["content"][0]["text"])
            return texts

    assert anyio.run(main) == ["0", "ok", "1"]
    assert counted.answers == 1  # increment went through the SDK, both counters the fast path


def test_episode_stats_and_metrics_count_fast_answers(servers: tuple[str, str, Replay]) -> None:
    fast_url, _, _ = servers
    url = f"{fast_url}/episodes/fast-stats/mcp/demo"

    def increments() -> int:
        metrics = httpx2.get(f"{fast_url}/metrics").text
        counts = [line for line in metrics.splitlines() if line.startswith("replay_sim_calls_total")]
        return sum(int(line.split()[-1]) for line in counts if '"increment"' in line and '"exact"' in line)

    before = increments()

    async def main() -> dict[str, Any]:
        async with httpx2.AsyncClient(timeout=30) as http:
            texts = []
            for i, tool in enumerate(["counter", "increment", "counter"]):
                params, headers = _modern("tools/call", {"name": tool, "arguments": {}})
                body = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params}
                answer = await http.post(url, json=body, headers=headers)
                assert answer.headers["content-type"] == "application/json"
                texts.append(answer.json()["result"]["content"][0]["text"])
            assert texts == ["0", "ok", "1"]
            return (await http.get(f"{fast_url}/api/episodes/fast-stats")).json()

    summary = anyio.run(main)
    assert summary["calls"] == 3 and summary["tiers"] == {"exact": 3}
    assert increments() == before + 1


def test_streams_stay_sse_and_other_answers_come_as_json(servers: tuple[str, str, Replay]) -> None:
    fast_url, _, _ = servers
    url = f"{fast_url}/mcp/demo"

    async def main() -> None:
        async with httpx2.AsyncClient(timeout=30) as http:
            headers = await _open(http, url)
            slow = {"name": "slow", "arguments": {"steps": 2}, "_meta": {"progressToken": "p"}}
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": slow}
            streamed = await http.post(url, json=body, headers=headers)
            assert streamed.headers["content-type"].startswith("text/event-stream")
            events = [json.loads(line[5:]) for line in streamed.text.splitlines() if line.startswith("data:")]
            methods = [e.get("method") for e in events[:-1]]
            assert methods == ["notifications/progress", "notifications/message", "notifications/progress"]
            assert events[-1]["result"]["content"][0]["text"] == "done"
            for method, params in [
                ("tools/list", {}),
                ("tools/call", {"name": "echo", "arguments": {"message": "boom"}}),  # a recorded error
                ("tools/call", {"name": "echo", "arguments": {"message": "never recorded"}}),  # a miss
            ]:
                answer = await http.post(
                    url, json={"jsonrpc": "2.0", "id": 2, "method": method, "params": params}, headers=headers
                )
                assert answer.headers["content-type"] == "application/json", method
                assert answer.headers["mcp-session-id"] == headers["mcp-session-id"]
                assert answer.json()["id"] == 2

    anyio.run(main)


def test_an_answer_held_by_injected_latency_streams(db: Path, tmp_path: Path) -> None:
    copy = tmp_path / "replay.db"
    shutil.copy(db, copy)
    with serving_in_thread(create_app(_replay(copy, latency="fixed:5"))) as base:
        url = f"{base}/mcp/demo"

        async def main() -> httpx2.Response:
            async with httpx2.AsyncClient(timeout=30) as http:
                headers = await _open(http, url)
                call = {"name": "echo", "arguments": {"message": "hello"}}
                body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}
                return await http.post(url, json=body, headers=headers)

        held = anyio.run(main)
    assert held.headers["content-type"].startswith("text/event-stream")
    data = [json.loads(line[5:]) for line in held.text.splitlines() if line.startswith("data:")]
    assert data[-1]["result"]["_meta"]["replay-sim/match"]["latency_ms"] == 5.0


def test_requests_the_sdk_would_refuse_still_get_its_answers(servers: tuple[str, str, Replay]) -> None:
    fast_url, sdk_url, _ = servers

    async def answers(base: str) -> list[tuple[int, bytes]]:
        url = f"{base}/mcp/demo"
        async with httpx2.AsyncClient(timeout=30) as http:
            headers = await _open(http, url)
            call = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {}},
            }
            out = []
            for changed in [
                {"mcp-session-id": "not-a-session"},
                {"accept": "application/json"},
                {"content-type": "text/plain"},
            ]:
                response = await http.post(url, json=call, headers=headers | changed)
                out.append((response.status_code, response.content))
            for bad in [
                {"name": 3},
                {"name": "echo", "arguments": [1]},
                {"name": "echo", "_meta": {"progressToken": 1.5}},
            ]:
                body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": bad}
                response = await http.post(url, json=body, headers=headers)
                out.append((response.status_code, json.loads(response.content)["error"]["code"]))
            return out

    fast, sdk = anyio.run(answers, fast_url), anyio.run(answers, sdk_url)
    assert [status for status, _ in fast] == [404, 406, 400, 200, 200, 200]
    assert fast == sdk


def _stdio_answers(db: Path, lines: list[dict[str, Any]], fast: bool) -> tuple[list[bytes], int, int]:
    """Serve ``db`` over stdio (``serve_stdio``, as ``serve --stdio`` does) and send ``lines``.

    Returns:
        The answers, in order; how many were resolved and answered from prepared bytes, and how
        many of those answered a line repeated but for its id without resolving it again.
    """
    script = (
        "import sys, anyio\n"
        "from replay_sim.replay.core.replay import Replay\n"
        "from replay_sim.resolve.resolver import Resolver\n"
        "from replay_sim.store import Store\n"
        "from replay_sim.replay.stdio import fastpath\n"
        "from replay_sim.replay.stdio.serve import serve_stdio\n"
        "store = Store(sys.argv[1], readonly=True)\n"
        "replay = Replay(store, resolver=Resolver(store, index_dir=None))\n"
        "replay.resolver.warm = lambda **kw: None  # resolve in place: no model to wait for\n"
        "if sys.argv[2] == 'sdk':\n"
        "    fastpath.StdioFastPath.answer = lambda self, line: None\n"
        "answered = {'answer_again': 0, 'again': 0}\n"
        "def counting(name):\n"
        "    method = getattr(replay.prepared, name)\n"
        "    def counted(*args):\n"
        "        found = method(*args)\n"
        "        answered[name] += found is not None\n"
        "        return found\n"
        "    setattr(replay.prepared, name, counted)\n"
        "counting('answer_again')\n"
        "counting('again')\n"
        "anyio.run(serve_stdio, replay, 'demo')\n"
        "print(answered['answer_again'], answered['again'], file=sys.stderr)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(db), "fast" if fast else "sdk"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    answers = []
    for line in lines:  # one at a time: at the end of its input a server may drop what is in flight
        process.stdin.write(json.dumps(line).encode() + b"\n")
        if "id" in line:
            answers.append(process.stdout.readline().rstrip(b"\n"))
    process.stdin.close()
    process.wait(timeout=120)
    resolved, again = (int(n) for n in process.stderr.read().decode().split()[-2:])
    return answers, resolved, again


def test_serve_stdio_answers_from_prepared_bytes_in_both_eras(db: Path) -> None:
    handshake = [initialize(), {"jsonrpc": "2.0", "method": "notifications/initialized"}] + [
        {"jsonrpc": "2.0", "id": i, "method": method, "params": params}
        for i, (method, params, _) in enumerate(CALLS, start=1)
    ]
    modern = [
        {"jsonrpc": "2.0", "id": f"m{i}", "method": method, "params": {**params, "_meta": ENVELOPE}}
        for i, (method, params, _) in enumerate([CALLS[0], *CALLS])
    ]
    for lines in (handshake, modern):
        (fast, resolved, _), (sdk, unresolved, _) = (
            _stdio_answers(db, lines, fast=True),
            _stdio_answers(db, lines, fast=False),
        )
        assert len(fast) == len(lines) - (1 if lines is handshake else 0)
        assert resolved > 0 and unresolved == 0
        assert fast == sdk


def test_serve_stdio_answers_a_repeated_call_again_as_the_sdk_path_would_in_the_episodes_state(
    db: Path,
) -> None:
    # echo "hello" was recorded once, before the counter's increment: the same line with another
    # id is answered without resolving it again until the increment leaves the recording's state.
    def call(id_: Any, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        params = {"name": name, "arguments": arguments}
        return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": params}

    hello = {"message": "hello"}
    lines = [
        initialize(),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        *(call(id_, "echo", hello) for id_ in [1, 2, -3, 2**40, "r-é", 'q"\\\u2028']),
        call(8, "weather", {"city": "Oslo"}),
        call(9, "weather", {"city": "Oslo"}),
        call(10, "counter", {}),
        call(11, "increment", {}),
        *(call(id_, "echo", hello) for id_ in [12, 13]),  # recorded only from the state before
        call(14, "counter", {}),
        call(15, "weather", {"city": "Oslo"}),  # recorded only from the first state too
    ]
    (fast, resolved, again), (sdk, _, _) = _stdio_answers(db, lines, True), _stdio_answers(db, lines, False)
    assert fast == sdk
    assert again == 6  # echo five times, weather once
    assert resolved == 5  # echo, weather, counter twice, increment
    assert [b'"status":"miss"' in answer for answer in fast[-4:]] == [True, True, False, True]


@pytest.mark.parametrize(
    ("accept", "json_answer"),
    [
        ("application/json, text/event-stream", True),  # what MCP SDK clients send
        ("*/*", True),
        ("text/event-stream, application/json", False),  # a client preferring the stream
        ("application/json;q=0.5, text/event-stream", False),
        ("text/event-stream;q=0.4, application/json", True),
    ],
)
def test_a_client_preferring_the_stream_gets_it(
    servers: tuple[str, str, Replay], accept: str, json_answer: bool
) -> None:
    fast_url, _, _ = servers
    url = f"{fast_url}/mcp/demo"

    async def main() -> httpx2.Response:
        async with httpx2.AsyncClient(timeout=30) as http:
            headers = await _open(http, url) | {"accept": accept}
            call = {"name": "echo", "arguments": {"message": "hello"}}
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}
            return await http.post(url, json=body, headers=headers)

    answer = anyio.run(main)
    kind = answer.headers["content-type"]
    assert kind == "application/json" if json_answer else kind.startswith("text/event-stream")
    assert answer.status_code == 200 and b'"text":"hello"' in answer.content
