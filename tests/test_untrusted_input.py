"""Hostile input to the stdio and HTTP parsers (hypothesis): any nesting, size and code point.

Whatever a client sends, a parser answers ``-32700`` or ``-32600`` (or hands a well-formed message
on) and the server goes on serving: no ``RecursionError``, no HTTP 500. JSON nested deeper than
:data:`~replay_sim.untrusted.MAX_DEPTH` is refused exactly where the SDK's own parser refuses it,
whichever path reads it. The real processes get the 1,100-deep line in ``test_stdio_hardening.py``
and ``record/test_recorder_servers.py``-style HTTP tests below.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pydantic_core
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recording_helpers import ECHO_SERVER, PYTHON, REPLAY_SIM, proxy_http, spawn
from replay_helpers import ACCEPT, build_store, make_replay, raw_session

from replay_sim import untrusted
from replay_sim.errors import NestingError
from replay_sim.listener import serving_in_thread
from replay_sim.replay.core.connections import stdio_client
from replay_sim.replay.http.app import create_app
from replay_sim.replay.stdio.fastpath import StdioFastPath
from replay_sim.stdio_transport import TooLong, read_line

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REFUSALS = {types.PARSE_ERROR, types.INVALID_REQUEST}
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
MODERN_HEADERS = {
    **ACCEPT,
    "Mcp-Protocol-Version": "2026-07-28",
    "Mcp-Method": "tools/call",
    "Mcp-Name": "echo",
}

# Any code point, lone surrogates included (they reach the wire as \ud800 escapes or as bad UTF-8).
any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
scalars = st.none() | st.booleans() | st.integers() | st.floats() | any_text
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(any_text, children, max_size=4),
    max_leaves=20,
)
NO_PADDING = st.just(0)
depths = st.integers(0, 40) | st.integers(190, 215) | st.integers(900, 3_000)


def _nest(inner: str, depth: int, kinds: list[bool]) -> str:
    """JSON text ``inner`` inside ``depth`` arrays and objects (``kinds[i % len]``: True for an array).

    Built as text: ``json.dumps`` itself cannot write a value nested a thousand deep.
    """
    opened = "".join("[" if kinds[i % len(kinds)] else '{"k":' for i in range(depth))
    closed = "".join("]" if kinds[i % len(kinds)] else "}" for i in reversed(range(depth)))
    return opened + inner + closed


def _nested_value(depth: int) -> Any:
    """0 inside ``depth`` arrays (as the SDK's ``json.loads`` would hand it to a handler)."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _json(value: Any, ascii_only: bool = True) -> str:
    return json.dumps(value, ensure_ascii=ascii_only)


@dataclass(frozen=True)
class Body:
    """A tools/call of the recorded ``echo`` as sent, and how deep it nests."""

    text: bytes
    depth: int
    modern: bool


@st.composite
def requests(draw: st.DrawFn, padding: st.SearchStrategy[int] = NO_PADDING) -> Body:
    """A tools/call whose argument nests arbitrarily deep (and its ``_meta`` may), in either era."""
    ascii_only, modern = draw(st.booleans()), draw(st.booleans())
    kinds = draw(st.lists(st.booleans(), min_size=1, max_size=3))
    value = draw(json_values)
    depth = draw(depths)
    meta: dict[str, Any] = dict(MODERN_META) if modern else {}
    if draw(st.booleans()):
        meta["replay-sim/episode"] = "ep-hostile"
    if pad := draw(padding):  # past what the router reads first: the SDK's parsers and the handlers answer
        meta["padding"] = "x" * pad
    meta_depth = draw(depths) if draw(st.booleans()) else 0
    request = {
        "jsonrpc": "2.0",
        "id": draw(st.integers(-(2**70), 2**70) | any_text),
        "method": "tools/call",
        "params": {
            "name": "echo",
            "arguments": {"message": "@ARGUMENT@"},
            "_meta": {**meta, "deep": "@META@"},
        },
    }
    text = _json(request, ascii_only)
    text = text.replace('"@ARGUMENT@"', _nest(_json(value, ascii_only), depth, kinds))
    text = text.replace('"@META@"', _nest("1", meta_depth, kinds))
    nested = 3 + max(depth + _levels(value), meta_depth + 1)
    return Body(text.encode("utf-8", "surrogatepass"), nested, modern)


def _levels(value: Any) -> int:
    """How many levels a JSON value nests (a scalar or an empty array is 1, ``[0]`` is 2)."""
    stack, deepest = [(value, 1)], 1
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict | list):
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


lines = (
    st.binary(max_size=200)
    | st.builds(
        lambda value, ascii_only: _json(value, ascii_only).encode("utf-8", "surrogatepass"),
        json_values,
        st.booleans(),
    )
    | requests().map(lambda body: body.text)
    | st.builds(
        lambda depth, opener: opener * depth, st.integers(0, 5_000), st.sampled_from([b"[", b'{"a":'])
    )
)


def _sdk_refuses_as_too_deep(text: bytes) -> bool:
    try:
        pydantic_core.from_json(text)
    except ValueError as exc:
        return "recursion limit" in str(exc)
    return False


# -- the one parser of untrusted JSON ---------------------------------------------------------------


@SETTINGS
@given(st.integers(0, 3_000), st.lists(st.booleans(), min_size=1, max_size=3))
def test_json_is_refused_as_too_deep_exactly_where_the_sdks_parser_refuses_it(
    depth: int, kinds: list[bool]
) -> None:
    text = _nest("0", depth, kinds).encode()
    refused = _sdk_refuses_as_too_deep(text)
    assert refused == (depth + 1 > untrusted.MAX_DEPTH)  # the innermost 0 is a level too
    assert untrusted.too_deep(text) == refused
    if refused:
        with pytest.raises(NestingError):
            untrusted.loads(text)
    else:
        assert untrusted.loads(text) == pydantic_core.from_json(text)


def test_a_request_nested_too_deep_after_the_sdk_parsed_it_is_refused_as_invalid() -> None:
    from mcp.shared.exceptions import MCPError

    with pytest.raises(MCPError) as refused:
        untrusted.check_request({"arguments": _nested_value(1_100)})
    assert refused.value.error.code == types.INVALID_REQUEST and "201" in refused.value.error.message
    untrusted.check_request({"arguments": _nested_value(untrusted.MAX_DEPTH - 2)})  # its 0 at the limit
    for scalar in (None, 0, "text"):
        untrusted.check_request(scalar)


# -- stdio: the transport's reading of a line, and the replay's fast path before it ------------------


@pytest.fixture(scope="module")
def stdio_fast_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StdioFastPath]:
    replay = make_replay(tmp_path_factory.mktemp("stdio") / "replay.db")
    with stdio_client() as client:
        fast = StdioFastPath(replay.prepared, "demo", replay.server("demo"), client)
        init = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        }
        request = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}
        assert fast.answer(json.dumps(request).encode()) is None  # the SDK answers it
        fast.sent(types.JSONRPCResponse(jsonrpc="2.0", id=0, result={"protocolVersion": "2025-11-25"}))
        hit = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": "hello"}},
        }
        assert fast.answer(json.dumps(hit).encode()) is not None  # the fast path is open
        yield fast
    replay.store.close()


@SETTINGS
@given(lines)
def test_any_stdio_line_goes_to_the_server_as_a_message_or_is_answered_with_a_parse_or_request_error(
    line: bytes,
) -> None:
    message, for_server = read_line(line, 32 << 20)
    if for_server:
        assert isinstance(
            message.message,
            types.JSONRPCRequest | types.JSONRPCNotification | types.JSONRPCResponse | types.JSONRPCError,
        )
        assert _levels(json.loads(line)) <= untrusted.MAX_DEPTH
    else:
        assert isinstance(message.message, types.JSONRPCError) and message.message.error.code in REFUSALS
        if untrusted.too_deep(line):
            assert message.message.error.code == types.PARSE_ERROR


@SETTINGS
@given(lines)
def test_the_replays_stdio_fast_path_never_raises_on_any_line(
    stdio_fast_path: StdioFastPath, line: bytes
) -> None:
    answer = stdio_fast_path.answer(line)
    assert answer is None or json.loads(answer)["jsonrpc"] == "2.0"


def test_a_line_dropped_for_its_length_is_answered_with_its_id_and_the_cap() -> None:
    message, for_server = read_line(TooLong(10, b'{"jsonrpc": "2.0", "id": 3, "method": "x"'), 5)
    assert not for_server and message.message.id == 3 and "5-byte" in message.message.error.message


# -- HTTP: the replay's router, fast path and SDK paths, both eras -----------------------------------


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    replay = make_replay(tmp_path_factory.mktemp("http") / "replay.db")
    with serving_in_thread(create_app(replay)) as url:
        yield f"{url}/mcp/demo"


def _echo(modern: bool) -> dict[str, Any]:
    # A 2026-era request has no session: a fresh episode says which state it is asked from (the
    # initial one), without which a call of a server with a state-changing tool is a miss.
    meta = {**MODERN_META, "replay-sim/episode": f"fresh-{uuid.uuid4().hex}"} if modern else {}
    params = {"name": "echo", "arguments": {"message": "hello"}, "_meta": meta}
    return {"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": params}


async def _still_serves(http: httpx2.AsyncClient, url: str, headers: dict[str, str], modern: bool) -> None:
    answer = (await http.post(url, json=_echo(modern), headers=headers)).json()
    assert answer["result"]["_meta"]["replay-sim/match"]["status"] == "exact", answer


@SETTINGS
@given(requests(padding=st.sampled_from([0, 0, 0, (1 << 20) + 16])))
def test_any_http_body_is_answered_with_a_result_or_a_json_rpc_error_and_never_a_500(
    endpoint: str, body: Body
) -> None:
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=60) as http:
            headers = MODERN_HEADERS if body.modern else await raw_session(http, endpoint)
            response = await http.post(endpoint, content=body.text, headers=headers)
            assert response.status_code < 500, response.text[:300]
            if body.depth > untrusted.MAX_DEPTH:
                assert response.json()["error"]["code"] in REFUSALS, response.text[:300]
            await _still_serves(http, endpoint, headers, body.modern)

    anyio.run(main)


# -- real processes over HTTP: the 1,100-deep body ---------------------------------------------------

DEEP = "@DEEP@"


@pytest.mark.parametrize("modern", [False, True], ids=["handshake", "2026"])
def test_serve_answers_a_1100_deep_body_with_a_parse_error_and_goes_on(tmp_path: Path, modern: bool) -> None:
    build_store(tmp_path / "replay.db").close()

    async def main() -> None:
        command = ["serve", "--db", str(tmp_path / "replay.db"), "--port", "0"]
        async with spawn(REPLAY_SIM, *command) as process:
            match = await process.wait_for(r"replaying demo at (http://127\.0\.0\.1:\d+/mcp/demo)", 120)
            await _refuses_deep_and_serves(match.group(1), modern, "hello")

    anyio.run(main)


@pytest.mark.parametrize("modern", [False, True], ids=["handshake", "2026"])
def test_the_http_recorder_answers_a_1100_deep_body_with_a_parse_error_and_goes_on(
    tmp_path: Path, modern: bool
) -> None:
    async def main() -> None:
        async with proxy_http(tmp_path / "rec.db", "--name", "echo", "--", PYTHON, ECHO_SERVER) as (url, _):
            await _refuses_deep_and_serves(f"{url}/mcp/echo", modern, None)

    anyio.run(main)


async def _refuses_deep_and_serves(url: str, modern: bool, recorded: str | None) -> None:
    """Post the 1,100-deep call (episode in ``_meta``), then an ordinary call: both answered."""
    async with httpx2.AsyncClient(timeout=60) as http:
        headers = MODERN_HEADERS if modern else await raw_session(http, url)
        call = _echo(modern)
        call["params"]["_meta"] = {**call["params"]["_meta"], "replay-sim/episode": "ep-deep"}
        call["params"]["arguments"] = {"message": DEEP, "text": DEEP}
        text = json.dumps(call).replace('"@DEEP@"', _nest("[]", 1_099, [True]))  # 2.2 KB
        response = await http.post(url, content=text, headers=headers)
        assert response.status_code == 400 and response.json()["error"]["code"] == types.PARSE_ERROR, (
            response.text
        )
        arguments = {"message": recorded} if recorded else {"text": "after"}
        fine = {**_echo(modern), "params": {**_echo(modern)["params"], "arguments": arguments}}
        answer = (await http.post(url, json=fine, headers=headers)).text
        assert (recorded or "after") in answer and '"error"' not in answer, answer
