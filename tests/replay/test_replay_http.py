"""The replay server over real transports: streamable HTTP (uvicorn on 127.0.0.1), stdio, the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from replay_helpers import (
    ACCEPT,
    build_store,
    make_replay,
    match_of,
    payload,
    raw_session,
)

from replay_sim.listener import serving_in_thread
from replay_sim.replay.http.app import create_app

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CLIENT_INFO = {"name": "raw", "version": "0"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    replay = make_replay(tmp_path_factory.mktemp("http") / "replay.db")
    with serving_in_thread(create_app(replay)) as url:
        yield url, replay


async def _raw_call(http: httpx2.AsyncClient, url: str, headers: dict[str, str], name: str, args: Any) -> Any:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": args}}
    return payload(await http.post(url, json=body, headers=headers))


def test_replayed_results_are_the_recorded_wire_json_plus_provenance(served: tuple[str, Any]) -> None:
    url = f"{served[0]}/mcp/demo"

    async def main() -> Any:
        async with httpx2.AsyncClient(timeout=30) as http:
            headers = await raw_session(http, url)
            return await _raw_call(http, url, headers, "echo", {"message": "hello"})

    result = anyio.run(main)["result"]
    recorded = {
        "isError": False,
        "content": [{"type": "text", "text": "hello", "x-extra": 1}],
        "vendorField": [1, 2],
    }
    assert list(result) == [*recorded, "_meta"]  # recorded key order, unknown fields kept
    assert {k: v for k, v in result.items() if k != "_meta"} == recorded
    match = dict(result["_meta"]["replay-sim/match"])
    assert list(result["_meta"]) == ["replay-sim/match"] and 0.0 < match.pop("confidence") <= 1.0
    assert match.pop("drivers")[0]["feature"] == "base"
    assert match == {"status": "exact", "score": 1.0, "recording": 1, "snapshot": None}


def test_the_x_replay_episode_header_shares_history_between_http_sessions(served: tuple[str, Any]) -> None:
    url = f"{served[0]}/mcp/demo"

    async def main() -> tuple[str, str]:
        async with httpx2.AsyncClient(timeout=30) as http:
            first = await raw_session(http, url, episode="ep-http")
            await _raw_call(http, url, first, "counter", {})
            await _raw_call(http, url, first, "increment", {})
            second = await raw_session(http, url, episode="ep-http")
            shared = await _raw_call(http, url, second, "counter", {})
            alone = await _raw_call(http, url, await raw_session(http, url), "counter", {})
            return shared["result"]["content"][0]["text"], alone["result"]["content"][0]["text"]

    assert anyio.run(main) == ("1", "0")


def test_unknown_host_headers_are_refused_against_dns_rebinding(served: tuple[str, Any]) -> None:
    response = httpx2.post(f"{served[0]}/mcp/demo", json={}, headers=ACCEPT | {"Host": "evil.example"})
    assert response.status_code == 421


def test_an_unrecorded_server_path_is_a_404_naming_the_served_ones(served: tuple[str, Any]) -> None:
    response = httpx2.post(f"{served[0]}/mcp/nope", json={}, headers=ACCEPT)
    assert response.status_code == 404 and "demo, other" in response.json()["error"]


def test_two_hundred_concurrent_sessions_each_get_history_consistent_answers(
    served: tuple[str, Any],
) -> None:
    url = f"{served[0]}/mcp/demo"
    seen: dict[int, tuple[str, str]] = {}

    async def session(i: int) -> None:
        async with Client(url, mode="legacy") as client:
            before = (await client.call_tool("counter", {})).content[0].text
            if i % 2:
                await client.call_tool("increment", {})
            after = (await client.call_tool("counter", {})).content[0].text
            seen[i] = (before, after)

    async def main() -> None:
        with anyio.fail_after(150):
            async with anyio.create_task_group() as tg:
                for i in range(200):
                    tg.start_soon(session, i)

    anyio.run(main)
    assert len(seen) == 200
    assert all(seen[i] == (("0", "1") if i % 2 else ("0", "0")) for i in range(200))


def test_serve_stdio_replays_one_server_over_stdin_and_stdout(tmp_path: Path) -> None:
    build_store(tmp_path / "stdio.db").close()
    params = StdioServerParameters(
        command=str(BIN / "replay-sim"),
        args=["serve", "--stdio", "--server", "demo", "--db", str(tmp_path / "stdio.db")],
        cwd=str(tmp_path),
    )

    async def main() -> Any:
        with anyio.fail_after(60):
            async with Client(params, mode="legacy") as client:
                assert client.server_info is not None and client.server_info.name == "demo-server"
                return await client.call_tool("echo", {"message": "hello"})

    result = anyio.run(main)
    assert result.content[0].text == "hello" and match_of(result)["status"] == "exact"


def _listening_url(process: subprocess.Popen[str]) -> str:
    """The base URL in the one line ``replay-sim serve`` prints on stdout once it is ready."""
    assert process.stdout is not None
    said = []
    for line in process.stdout:
        said.append(line)
        if line.startswith("listening on "):
            return line.removeprefix("listening on ").strip()
    raise AssertionError("replay-sim serve exited without saying it listens:\n" + "".join(said))


def test_serve_over_http_answers_on_mcp_server_once_it_says_it_listens(tmp_path: Path) -> None:
    build_store(tmp_path / "serve.db").close()
    command = [str(BIN / "replay-sim"), "serve", "--db", str(tmp_path / "serve.db"), "--port", "0"]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        url = _listening_url(process)  # printed once ready: nothing to poll
        assert httpx2.get(f"{url}/api/ready", timeout=30).status_code == 200

        async def main() -> Any:
            async with Client(f"{url}/mcp/other", mode="legacy") as client:
                return await client.call_tool("ping", {})

        assert anyio.run(main).content[0].text == "pong"
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_serve_without_a_store_fails_with_one_line_naming_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / "replay-sim"), "serve", "--db", str(tmp_path / "none.db")], capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "none.db: no such recording store" in done.stderr


@pytest.mark.skipif(
    not (ROOT / "fixtures/node_modules/.bin/mcp-inspector").exists() or shutil.which("node") is None,
    reason="MCP Inspector not installed (npm ci --prefix fixtures)",
)
def test_the_mcp_inspector_cli_gets_recorded_answers(served: tuple[str, Any]) -> None:
    base = [str(ROOT / "fixtures/node_modules/.bin/mcp-inspector"), "--cli", f"{served[0]}/mcp/demo"]
    base += ["--transport", "http"]
    env = os.environ | {"NO_COLOR": "1"}
    listed = subprocess.run(
        [*base, "--method", "tools/list"], capture_output=True, text=True, timeout=120, env=env
    )
    assert listed.returncode == 0, listed.stderr
    assert [t["name"] for t in json.loads(listed.stdout)["tools"]] == ["echo", "counter", "increment", "slow"]
    called = subprocess.run(
        [*base, "--method", "tools/call", "--tool-name", "echo", "--tool-arg", "message=hello"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert called.returncode == 0, called.stderr
    answer = json.loads(called.stdout)
    assert answer["content"][0]["text"] == "hello"
    assert answer["_meta"]["replay-sim/match"]["status"] == "exact"
