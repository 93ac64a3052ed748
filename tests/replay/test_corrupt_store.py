"""A recording whose stored JSON is corrupt is answered with an error naming it, over every path."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from replay_helpers import build_store, payload, raw_session

from replay_sim.listener import serving_in_thread
from replay_sim.replay.factory import open_replay
from replay_sim.replay.http.app import create_app


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, int]]:
    db = tmp_path_factory.mktemp("corrupt") / "replay.db"
    build_store(db).close()
    conn = sqlite3.connect(db)
    (bad,) = conn.execute(
        "SELECT id FROM calls WHERE name='echo' AND arguments='{\"message\":\"hello\"}'"
    ).fetchone()
    conn.execute("UPDATE calls SET result='{\"content\": [trunc' WHERE id=?", (bad,))
    conn.commit()
    conn.close()
    with serving_in_thread(create_app(open_replay(db))) as url:
        yield f"{url}/mcp/demo", db, bad


def _names_the_recording(error: dict[str, Any], db: Path, bad: int) -> None:
    assert error["code"] == -32603
    assert f"{db}: recording #{bad} is corrupt: its result is not JSON" in error["message"]


def test_a_corrupt_recording_is_a_json_rpc_error_naming_it_not_a_500(served: tuple[str, Path, int]) -> None:
    url, db, bad = served

    async def main() -> tuple[httpx2.Response, httpx2.Response]:
        async with httpx2.AsyncClient(timeout=30) as http:
            headers = await raw_session(http, url)  # JSON first: the fast path's client
            call = {"name": "echo", "arguments": {"message": "hello"}}
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}
            broken = await http.post(url, json=body, headers=headers)
            body = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
            return broken, await http.post(url, json=body, headers=headers)

    broken, sound = anyio.run(main)
    assert broken.status_code == 200
    _names_the_recording(payload(broken)["error"], db, bad)
    assert [tool["name"] for tool in payload(sound)["result"]["tools"]][:1] == ["echo"]  # it serves on


def test_an_sdk_client_gets_the_error_naming_the_recording(served: tuple[str, Path, int]) -> None:
    url, db, bad = served

    async def main() -> MCPError:
        async with Client(url, mode="legacy") as client:
            with pytest.raises(MCPError) as refused:
                await client.call_tool("echo", {"message": "hello"})
            return refused.value

    error = anyio.run(main)
    _names_the_recording({"code": error.error.code, "message": error.error.message}, db, bad)


def test_the_admin_api_answers_a_corrupt_recording_and_every_other_error_as_json_with_its_status(
    served: tuple[str, Path, int],
) -> None:
    url, db, bad = served
    base = url.removesuffix("/mcp/demo")
    for path, status in (
        (f"/api/recordings/{bad}", 500),
        ("/api/recordings", 500),  # the page holding it
        ("/api/recordings/987654", 404),
        ("/api/recordings/not-a-number", 422),
        ("/api/episodes/nope", 404),
    ):
        answer = httpx2.get(base + path, timeout=30)
        assert answer.status_code == status, path
        assert answer.headers["content-type"] == "application/json", path
        body = answer.json()
        assert body["status"] == status and body["detail"], path
    corrupt = httpx2.get(f"{base}/api/recordings/{bad}", timeout=30).json()["detail"]
    assert f"{db}: recording #{bad} is corrupt: its result is not JSON" in corrupt
    assert httpx2.get(f"{base}/api/health", timeout=30).json() == {"status": "ok"}
