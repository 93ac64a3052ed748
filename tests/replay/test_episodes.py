"""Episodes any MCP client can use: episode URLs, the episodes API, and bounded memory.

``/episodes/<id>/mcp/<server>`` serves what ``/mcp/<server>`` serves with its history scoped to the
episode; ids come from the URL, the ``X-Replay-Episode`` header or ``_meta``, and two different ones
in one request are refused. ``POST``/``GET``/``DELETE /api/episodes`` create, read and end them;
idle ones expire, and past the cap a new one is refused without evicting a live one. Real HTTP on
127.0.0.1 with the MCP SDK's client in both protocol eras, and raw JSON-RPC for bad input.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from replay_helpers import ACCEPT, make_replay, match_of, payload

from replay_sim.errors import EpisodeError
from replay_sim.listener import serving_in_thread
from replay_sim.protocol import agreed_episode, episode_problem
from replay_sim.replay.core.episodes import Episodes, seed_of
from replay_sim.replay.core.histories import EPISODE_FIX
from replay_sim.replay.http.app import create_app
from replay_sim.replay.options import Limits

MODES = ["auto", "legacy"]
"""The SDK client's default (2026-07-28, no sessions) and the handshake era."""


ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
"""What every 2026-07-28 request carries in ``_meta``."""
LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": ENVELOPE}}


def _call(name: str, meta: Any = None) -> dict[str, Any]:
    """A 2026-era ``tools/call`` of ``name`` with no arguments, its ``_meta`` extended by ``meta``."""
    params = {"name": name, "arguments": {}, "_meta": ENVELOPE | (meta or {})}
    return {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}


MODERN = ACCEPT | {"MCP-Protocol-Version": "2026-07-28"}


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx2.Response:
    """POST one 2026-era JSON-RPC request with the routing headers the era asks for."""
    routing = {"Mcp-Method": body["method"]}
    if body["method"] == "tools/call":
        routing["Mcp-Name"] = body["params"]["name"]
    return httpx2.post(url, json=body, headers=MODERN | routing | (headers or {}), timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    """The demo store's replay over real HTTP: ``counter`` recorded as 0, then 1 after ``increment``."""
    replay = make_replay(tmp_path_factory.mktemp("episodes") / "replay.db")
    with serving_in_thread(create_app(replay)) as url:
        yield url, replay


@contextlib.asynccontextmanager
async def connect(url: str, mode: str, headers: dict[str, str] | None = None) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers=headers or {}, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,  # type: ignore[arg-type]
    ):
        yield client


def _text(result: types.CallToolResult) -> str:
    assert isinstance(result.content[0], types.TextContent)
    return result.content[0].text


# -- episode URLs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_two_interleaved_episodes_through_episode_urls_each_keep_their_own_history(
    served: tuple[str, Any], mode: str
) -> None:
    url = served[0]

    async def main() -> list[str]:
        seen = []
        async with (
            connect(f"{url}/episodes/url-a-{mode}/mcp/demo", mode) as a,
            connect(f"{url}/episodes/url-b-{mode}/mcp/demo", mode) as b,
        ):
            for client, tool in [
                (a, "counter"),
                (a, "increment"),
                (b, "counter"),
                (a, "counter"),
                (b, "counter"),
            ]:
                result = await client.call_tool(tool, {})
                seen.append(_text(result))
        return seen

    assert anyio.run(main) == ["0", "ok", "0", "1", "0"]


def test_an_episode_url_serves_what_the_plain_endpoint_serves(served: tuple[str, Any]) -> None:
    url = served[0]

    async def main() -> tuple[Any, Any]:
        async with (
            connect(f"{url}/mcp/demo", "legacy") as plain,
            connect(f"{url}/episodes/same/mcp/demo", "legacy") as ep,
        ):
            return (
                (await plain.list_tools()).model_dump(),
                (await ep.list_tools()).model_dump(),
            )

    plain, scoped = anyio.run(main)
    assert plain == scoped


def test_every_server_under_one_episode_url_prefix_shares_the_episode(served: tuple[str, Any]) -> None:
    url = served[0]

    async def main() -> None:
        async with (
            connect(f"{url}/episodes/shared/mcp/demo", "auto") as demo,
            connect(f"{url}/episodes/shared/mcp/other", "auto") as other,
        ):
            await demo.call_tool("increment", {})
            assert _text(await other.call_tool("ping", {})) == "pong"
            assert _text(await demo.call_tool("counter", {})) == "1"

    anyio.run(main)
    summary = httpx2.get(f"{url}/api/episodes/shared", timeout=30).json()
    assert summary["calls_by_server"] == {"demo": 2, "other": 1}
    assert summary["urls"]["other"] == f"{url}/episodes/shared/mcp/other"


def test_an_episode_url_a_header_and_meta_naming_the_same_episode_agree(served: tuple[str, Any]) -> None:
    url = served[0]
    headers = {"X-Replay-Episode": "agreed"}
    first = _post(f"{url}/episodes/agreed/mcp/demo", _call("increment"), headers)
    assert first.status_code == 200
    meta = {"replay-sim/episode": "agreed"}
    second = _post(f"{url}/episodes/agreed/mcp/demo", _call("counter", meta), headers)
    result = payload(second)["result"]
    assert result["content"][0]["text"] == "1" and match_of(result)["status"] == "exact"


# -- bad input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "headers", "meta", "said"),
    [
        (
            "/episodes/a/mcp/demo",
            {"X-Replay-Episode": "b"},
            None,
            "the URL names 'a', the X-Replay-Episode header names 'b'",
        ),
        ("/episodes/a/mcp/demo", {}, {"replay-sim/episode": "b"}, "_meta[\"replay-sim/episode\"] names 'b'"),
        ("/mcp/demo", {"X-Replay-Episode": "a"}, {"replay-sim/episode": "b"}, "names two episodes"),
    ],
)
def test_a_request_naming_two_different_episodes_gets_a_400_json_rpc_error(
    served: tuple[str, Any], path: str, headers: dict[str, str], meta: Any, said: str
) -> None:
    response = _post(f"{served[0]}{path}", _call("counter", meta), headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == -32600 and said in error["message"]


@pytest.mark.parametrize(
    ("path", "headers", "meta"),
    [
        ("/episodes/a%2Fb/mcp/demo", {}, None),  # an escaped slash: a path character
        ("/episodes/a/b/mcp/demo", {}, None),
        ("/episodes/..%2F..%2Fapi/mcp/demo", {}, None),
        ("/episodes/" + "x" * 10_000 + "/mcp/demo", {}, None),  # 10 kB
        ("/mcp/demo", {"X-Replay-Episode": "x" * 10_000}, None),
        ("/mcp/demo", {"X-Replay-Episode": "white space"}, None),
        ("/mcp/demo", {}, {"replay-sim/episode": "../../etc"}),
        ("/mcp/demo", {}, {"replay-sim/episode": 7}),  # not a string
    ],
)
def test_a_malformed_episode_id_is_refused_with_the_grammar(
    served: tuple[str, Any], path: str, headers: dict[str, str], meta: Any
) -> None:
    response = _post(f"{served[0]}{path}", _call("counter", meta), headers)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "ASCII letters, digits" in message and len(message) < 400


def test_an_episode_path_without_a_server_is_404_and_an_unknown_server_names_the_served_ones(
    served: tuple[str, Any],
) -> None:
    url = served[0]
    assert _post(f"{url}/episodes/a", LIST).status_code == 404
    unknown = _post(f"{url}/episodes/a/mcp/nope", LIST)
    assert unknown.status_code == 404 and "demo" in unknown.text


def test_the_episode_id_grammar_in_one_table() -> None:
    good = ["a", "ep-1", "rollout_7", "3f2b8c1e-0d5c-4c7a-9c4e-2f1d7a9b0e11", "run.3~x", "-x", "x" * 128]
    bad = ["", ".", "..", ".hidden", "~x", "a/b", "a b", "é", "a\nb", "x" * 129, "a%2Fb", "a?b", "a#b"]
    assert [episode_problem(e) for e in good] == [None] * len(good)
    assert all(episode_problem(e) is not None for e in bad)
    assert episode_problem(None) is not None
    assert agreed_episode(None, "a", {"replay-sim/episode": "a"}) == "a"
    assert agreed_episode(None, None, {"other": 1}) is None
    with pytest.raises(EpisodeError, match="two episodes"):
        agreed_episode("a", None, {"replay-sim/episode": "b"})


def test_a_sessionless_miss_names_the_episode_url(served: tuple[str, Any]) -> None:
    response = _post(f"{served[0]}/mcp/demo", _call("increment"))
    result = payload(response)["result"]
    assert result["isError"] and "/episodes/<id>/mcp/<server>" in result["content"][0]["text"]
    assert "/episodes/<id>/mcp/<server>" in EPISODE_FIX


# -- the episodes API ------------------------------------------------------------------------------------


def test_an_episode_is_created_read_and_ended_through_the_api(served: tuple[str, Any]) -> None:
    url = served[0]
    created = httpx2.post(
        f"{url}/api/episodes", json={"id": "api-1", "seed": 42, "metadata": {"task": 3}}, timeout=30
    )
    assert created.status_code == 201
    body = created.json()
    assert (body["id"], body["seed"], body["metadata"]) == ("api-1", 42, {"task": 3})
    assert body["urls"] == {s: f"{url}/episodes/api-1/mcp/{s}" for s in ("demo", "other")}
    assert httpx2.post(f"{url}/api/episodes", json={"id": "api-1"}, timeout=30).status_code == 409

    async def main() -> None:
        async with connect(body["urls"]["demo"], "auto") as client:
            await client.call_tool("counter", {})
            await client.call_tool("echo", {"message": "never recorded"})  # a miss
            await client.call_tool("nope", {})  # refused: unknown tool

    anyio.run(main)
    read = httpx2.get(f"{url}/api/episodes/api-1", timeout=30).json()
    assert read["calls"] == 3 and read["tiers"] == {"exact": 1, "miss": 1, "refused": 1}
    assert read["misses"] == 2 and [m["name"] for m in read["recent_misses"]] == ["echo", "nope"]
    assert read["diverged"] is False and read["seed"] == 42
    ended = httpx2.delete(f"{url}/api/episodes/api-1", timeout=30)
    assert ended.status_code == 200 and ended.json()["ended"] is True and ended.json()["calls"] == 3
    assert httpx2.get(f"{url}/api/episodes/api-1", timeout=30).status_code == 404
    assert httpx2.delete(f"{url}/api/episodes/api-1", timeout=30).status_code == 404


def test_an_episode_created_without_a_body_gets_an_id_and_a_seed_drawn_from_it(
    served: tuple[str, Any],
) -> None:
    body = httpx2.post(f"{served[0]}/api/episodes", timeout=30).json()
    assert body["id"].startswith("ep-") and body["seed"] == seed_of(body["id"])
    listed = httpx2.get(f"{served[0]}/api/episodes?limit=1", timeout=30)
    assert [e["id"] for e in listed.json()] == [body["id"]]  # the most recently used first
    assert int(listed.headers["x-total-count"]) >= 1


@pytest.mark.parametrize(
    "body",
    [
        {"id": "a/b"},
        {"id": "x" * 10_000},
        {"id": "ok", "metadata": {"big": "x" * 20_000}},
        {"id": "ok", "unknown": 1},
        {"id": "ok", "seed": "seven"},
    ],
)
def test_the_api_refuses_a_bad_episode(served: tuple[str, Any], body: dict[str, Any]) -> None:
    response = httpx2.post(f"{served[0]}/api/episodes", json=body, timeout=30)
    assert response.status_code in (400, 422) and len(response.text) < 2000


def test_deleting_an_episode_frees_its_state_so_its_id_starts_afresh(served: tuple[str, Any]) -> None:
    url, replay = served
    endpoint = f"{url}/episodes/fresh/mcp/demo"
    _post(endpoint, _call("increment"))
    assert replay.episodes.get("fresh") is not None
    assert httpx2.delete(f"{url}/api/episodes/fresh", timeout=30).status_code == 200
    assert replay.episodes.get("fresh") is None
    again = payload(_post(endpoint, _call("counter")))["result"]
    assert again["content"][0]["text"] == "0"


# -- bounded memory ----------------------------------------------------------------------------------------


def test_past_the_cap_a_new_episode_is_refused_and_no_live_one_is_evicted(tmp_path: Path) -> None:
    replay = make_replay(tmp_path / "cap.db")
    with serving_in_thread(create_app(replay, limits=Limits(max_episodes=2))) as url:
        assert _post(f"{url}/episodes/one/mcp/demo", _call("increment")).status_code == 200
        assert httpx2.post(f"{url}/api/episodes", json={"id": "two"}, timeout=30).status_code == 201
        refused = _post(f"{url}/episodes/three/mcp/demo", _call("counter"))
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert "--max-episodes 2" in error["message"] and "DELETE /api/episodes" in error["message"]
        by_header = _post(f"{url}/mcp/demo", _call("counter"), {"X-Replay-Episode": "three"})
        assert by_header.status_code == 503
        api = httpx2.post(f"{url}/api/episodes", json={"id": "three"}, timeout=30)
        assert api.status_code == 503 and "--max-episodes" in api.json()["detail"]
        # the live episode kept its state
        kept = payload(_post(f"{url}/episodes/one/mcp/demo", _call("counter")))
        assert kept["result"]["content"][0]["text"] == "1"
        metrics = httpx2.get(f"{url}/metrics", timeout=30).text
        assert "replay_sim_live_episodes 2" in metrics and "replay_sim_episodes_refused_total 3" in metrics
        # ending one makes room
        assert httpx2.delete(f"{url}/api/episodes/two", timeout=30).status_code == 200
        assert _post(f"{url}/episodes/three/mcp/demo", _call("counter")).status_code == 200


def test_idle_episodes_expire_on_the_registry_clock_and_a_used_one_does_not() -> None:
    now = [0.0]
    episodes = Episodes(max_live=3, idle_timeout=60, clock=lambda: now[0])
    episodes.create("idle")
    busy = episodes.create("busy")
    busy.trail("demo").steps.append("k")
    now[0] = 50
    episodes.open("busy")
    now[0] = 100  # idle for 100 s, busy for 50 s
    assert episodes.get("idle") is None and episodes.get("busy") is busy and episodes.expired == 1
    assert len(episodes) == 1
    now[0] = 105
    assert len(episodes.open("busy").trail("demo")) == 1  # a use keeps its history
    now[0] = 200
    assert len(episodes.open("busy").trail("demo")) == 0  # expired: its next request starts afresh
    assert episodes.expired == 2


def test_the_cap_counts_live_episodes_only_and_expired_ones_make_room() -> None:
    now = [0.0]
    episodes = Episodes(max_live=1, idle_timeout=10, clock=lambda: now[0])
    episodes.open("a")
    with pytest.raises(EpisodeError) as refused:
        episodes.open("b")
    assert refused.value.status == 503 and episodes.get("a") is not None
    now[0] = 10
    assert episodes.open("b").id == "b" and episodes.get("a") is None
    never = Episodes(max_live=1, idle_timeout=None, clock=lambda: now[0])
    never.open("a")
    now[0] = 1e9
    assert never.get("a") is not None


def test_invalid_requests_on_episode_urls_create_no_episode_and_a_real_rollout_still_gets_one(
    tmp_path: Path,
) -> None:
    replay = make_replay(tmp_path / "invalid.db")
    with serving_in_thread(create_app(replay, limits=Limits(max_episodes=10))) as url:
        made_up = ACCEPT | {"Mcp-Session-Id": "no-such-session", "MCP-Protocol-Version": "2025-11-25"}
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}

        async def flood(worker: int, statuses: list[int]) -> None:
            async with httpx2.AsyncClient(timeout=30) as http:
                for n in range(250):
                    episode_url = f"{url}/episodes/fake-{worker}-{n}/mcp/demo"
                    if n % 5:  # a made-up MCP session: the SDK's 404
                        response = await http.post(episode_url, json=body, headers=made_up)
                    else:  # a body that is not JSON-RPC at all: 400
                        response = await http.post(episode_url, content=b"{not json", headers=ACCEPT)
                    statuses.append(response.status_code)

        async def main() -> list[int]:
            statuses: list[int] = []
            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    for worker in range(8):
                        tg.start_soon(flood, worker, statuses)
            return statuses

        statuses = anyio.run(main)
        assert len(statuses) == 2_000 and set(statuses) == {400, 404}
        assert len(replay.episodes) == 0 and replay.episodes.refused == 0

        async def rollout() -> str:
            async with connect(f"{url}/episodes/real/mcp/demo", "legacy") as client:
                await client.call_tool("increment", {})
                return _text(await client.call_tool("counter", {}))

        assert anyio.run(rollout) == "1"
        assert [e.id for e in replay.episodes.live()] == ["real"]


def test_episodes_are_created_at_a_bounded_rate_after_a_burst_and_a_refused_request_spends_none() -> None:
    now = [0.0]
    episodes = Episodes(max_live=100, idle_timeout=None, clock=lambda: now[0], rate=2, burst=3)
    for n in range(10):
        episodes.admit(f"checked-{n}")  # checked only: creates nothing, spends nothing
    assert len(episodes) == 0
    for n in range(3):
        episodes.open(f"batch-{n}")  # a batch starting at once
    with pytest.raises(EpisodeError, match="--episode-rate 2 a second after a burst of 3") as refused:
        episodes.admit("one-more")
    assert refused.value.status == 503
    assert episodes.open("batch-0").id == "batch-0"  # a live one is not a creation
    now[0] = 0.5
    episodes.open("later")  # one more per half second
    with pytest.raises(EpisodeError):
        episodes.create("too-soon")
    assert len(episodes) == 4 and episodes.refused == 2


# -- the Host/Origin check and the admin token hold for the new routes --------------------------------------


def test_episode_urls_keep_the_host_check_and_the_episodes_api_needs_the_token(tmp_path: Path) -> None:
    replay = make_replay(tmp_path / "guarded.db")
    with serving_in_thread(create_app(replay, token="s3cret")) as url:
        rebound = _post(f"{url}/episodes/a/mcp/demo", LIST, {"Host": "evil.example"})
        assert rebound.status_code == 421
        other_site = _post(f"{url}/episodes/a/mcp/demo", LIST, {"Origin": "http://evil.example"})
        assert other_site.status_code == 403
        assert _post(f"{url}/episodes/a/mcp/demo", LIST).status_code == 200
        for method, path in [
            ("POST", "/api/episodes"),
            ("GET", "/api/episodes/a"),
            ("DELETE", "/api/episodes/a"),
        ]:
            assert httpx2.request(method, f"{url}{path}", timeout=30).status_code == 401
        auth = {"Authorization": "Bearer s3cret"}
        assert httpx2.get(f"{url}/api/episodes/a", headers=auth, timeout=30).status_code == 200
