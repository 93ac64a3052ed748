"""Bad input at the replay endpoint gets a clear JSON-RPC error, and the server keeps serving."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest
from replay_helpers import make_replay, payload, raw_session

from replay_sim.listener import serving_in_thread
from replay_sim.replay.http.app import create_app


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    replay = make_replay(tmp_path_factory.mktemp("bad") / "replay.db")
    with serving_in_thread(create_app(replay)) as url:
        yield f"{url}/mcp/demo"


async def _still_serves(http: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 99,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"message": "hello"}},
    }
    answer = payload(await http.post(url, json=body, headers=headers))
    assert answer["result"]["_meta"]["replay-sim/match"]["status"] == "exact"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", -32700),  # parse error
        (b'{"jsonrpc": "2.0", "id": 1}', -32602),  # no method: the SDK's answer (JSON-RPC says -32600)
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/explode", "params": {}}', -32601),  # unknown method
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"arguments": {}}}',
            -32602,
        ),  # no name
    ],
    ids=["parse error", "invalid request", "unknown method", "invalid params"],
)
def test_malformed_json_rpc_gets_its_error_code_and_the_session_keeps_working(
    endpoint: str, body: bytes, code: int
) -> None:
    async def main() -> dict[str, Any]:
        async with httpx2.AsyncClient(timeout=30) as http:
            headers = await raw_session(http, endpoint)
            response = await http.post(endpoint, content=body, headers=headers)
            error = payload(response)["error"]
            await _still_serves(http, endpoint, headers)
            return error

    error = anyio.run(main)
    assert error["code"] == code and error["message"]


def test_an_oversize_payload_is_refused_and_the_server_keeps_serving(endpoint: str) -> None:
    huge = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"message": "x" * (8 << 20)}},
    }

    async def main() -> int:
        async with httpx2.AsyncClient(timeout=60) as http:
            headers = await raw_session(http, endpoint)
            response = await http.post(endpoint, json=huge, headers=headers)
            await _still_serves(http, endpoint, headers)
            return response.status_code

    assert anyio.run(main) == 413


def test_arguments_that_are_not_an_object_get_an_invalid_params_error(endpoint: str) -> None:
    async def main() -> dict[str, Any]:
        async with httpx2.AsyncClient(timeout=30) as http:
            headers = await raw_session(http, endpoint)
            body = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": [1, 2]},
            }
            return payload(await http.post(endpoint, json=body, headers=headers))

    assert anyio.run(main)["error"]["code"] == -32602
