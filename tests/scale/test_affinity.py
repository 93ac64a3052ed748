"""What a request belongs to, who owns an episode, and the gateway's choices — without Ray."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from replay_sim.scale.affinity import Affinity, affinity, episode_from_path, session_id_for, split_session_id
from replay_sim.scale.gateway import LIVENESS_POLL_S, Gateway, ReplicaGone
from replay_sim.scale.lost import LOST_CODE
from replay_sim.scale.registry import Holders
from replay_sim.scale.ring import owner
from replay_sim.scale.wire import REDIRECT, Envelope

JSON = (b"content-type", b"application/json")
META = {"replay-sim/episode": "m"}


def call(meta: dict[str, Any] | None = None) -> bytes:
    params: dict[str, Any] = {"name": "read_graph", "arguments": {}}
    if meta is not None:
        params["_meta"] = meta
    return json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}).encode()


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "expected"),
    [
        ("POST", "/mcp/memory", [JSON], call(), Affinity()),
        ("POST", "/mcp/memory", [JSON, (b"x-replay-episode", b"e-1")], call(), Affinity(episode="e-1")),
        ("POST", "/mcp/memory", [JSON], call({"replay-sim/episode": "m-1"}), Affinity(episode="m-1")),
        # _meta wins over the header, as in the replay server; the URL wins over both
        (
            "POST",
            "/mcp/memory",
            [JSON, (b"x-replay-episode", b"h")],
            call({"replay-sim/episode": "m"}),
            Affinity(episode="m"),
        ),
        (
            "POST",
            "/episodes/u%201/mcp/memory",
            [JSON],
            call({"replay-sim/episode": "m"}),
            Affinity(episode="u 1"),
        ),
        # a body is read only for a JSON POST
        (
            "POST",
            "/mcp/memory",
            [(b"content-type", b"text/plain")],
            call({"replay-sim/episode": "m"}),
            Affinity(),
        ),
        (
            "GET",
            "/mcp/memory",
            [(b"mcp-session-id", b"r-abc.123")],
            b"",
            Affinity(session="r-abc.123", replica="abc"),
        ),
        ("DELETE", "/mcp/memory", [(b"mcp-session-id", b"plain")], b"", Affinity(session="plain")),
        ("POST", "/mcp/memory", [JSON], b"{not json", Affinity()),
        ("GET", "/api/episodes/e9", [], b"", Affinity(episode="e9")),
        ("DELETE", "/api/episodes/e9", [], b"", Affinity(episode="e9")),
        ("POST", "/api/episodes", [JSON], b'{"id": "c1", "seed": 3}', Affinity(episode="c1")),
        ("POST", "/api/episodes", [JSON], b"{}", Affinity()),
        ("GET", "/api/episodes", [], b"", Affinity()),
        (
            "POST",
            "/mcp/memory",
            [JSON],
            b"[" + call({"replay-sim/episode": "b"}) + b"]",
            Affinity(episode="b"),
        ),
    ],
)
def test_affinity_is_read_from_the_session_url_meta_and_header(
    method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes, expected: Affinity
) -> None:
    assert affinity(method, path, headers, body) == expected


def test_a_body_over_the_peek_bound_is_not_parsed() -> None:
    big = call({"replay-sim/episode": "m", "pad": "x" * (1 << 20)})
    assert affinity("POST", "/mcp/memory", [JSON], big) == Affinity()


def test_episode_urls_and_session_ids_round_trip() -> None:
    assert episode_from_path("/episodes/e7/mcp/git") == "e7"
    assert episode_from_path("/episodes/e7") is None and episode_from_path("/mcp/git") is None
    assert split_session_id(session_id_for("rep1", "abc.def")) == ("rep1", "abc.def")
    assert split_session_id("0123abcd") == (None, "0123abcd")


def test_an_episode_has_one_owner_and_only_a_leaving_replicas_episodes_move() -> None:
    keys = [f"episode-{i}" for i in range(400)]
    three = {k: owner(k, ["a", "b", "c"]) for k in keys}
    assert three == {k: owner(k, ["c", "a", "b"]) for k in keys}  # order of the live set does not matter
    assert {"a", "b", "c"} == set(three.values())
    two = {k: owner(k, ["a", "c"]) for k in keys}
    assert all(two[k] == three[k] for k in keys if three[k] != "b")
    assert owner("x", []) is None


def test_the_registry_keeps_the_first_holder_of_an_episode() -> None:
    async def run() -> None:
        holders = Holders(max_episodes=2)
        assert await holders.claim("e1", "a") == "a"
        assert await holders.claim("e1", "b") == "a"
        await holders.claim("e2", "b")
        await holders.claim("e3", "b")  # e1 is the least recently claimed: forgotten
        assert await holders.claim("e1", "c") == "c"
        assert await holders.held() == {"b": 1, "c": 1}  # e2 went when e1 came back

    anyio.run(run)


class FakeReplicas:
    """Replicas 'a' and 'b': episodes hash as in the router; 'dead' replicas raise ReplicaGone."""

    def __init__(self, held: dict[str, str], dead: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.held = held
        self.dead = set(dead)
        self.sent: list[Envelope] = []

    def live(self) -> frozenset[str]:
        return frozenset({"a", "b"} - self.dead)

    async def dispatch(self, envelope: Envelope) -> AsyncIterator[list[dict[str, Any]]]:
        self.sent.append(envelope)
        chosen = envelope.target or owner(envelope.affinity.key or "", sorted(self.live()))
        if chosen in self.dead:
            raise ReplicaGone(chosen)
        episode = envelope.affinity.episode
        holder = self.held.setdefault(episode, chosen) if episode else chosen
        if holder != chosen:
            yield [{"type": REDIRECT, "replica": holder}]
            return
        headers = [(b"x-replay-replica", str(chosen).encode())]
        yield [
            {"type": "http.response.start", "status": 200, "headers": headers},
            {"type": "http.response.body", "body": b"ok", "more_body": False},
        ]


async def request(
    gateway: Gateway, headers: list[tuple[bytes, bytes]]
) -> tuple[int, bytes, dict[bytes, bytes]]:
    sent: list[dict[str, Any]] = []
    inbox = [{"type": "http.request", "body": call(), "more_body": False}]

    async def receive() -> dict[str, Any]:
        if inbox:
            return inbox.pop()
        await anyio.sleep_forever()
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/mcp/memory", "headers": [JSON, *headers]}
    await gateway(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]), dict(sent[0]["headers"])


def test_the_gateway_follows_a_redirect_to_the_live_holder_and_remembers_it() -> None:
    other = "b" if owner("e", ["a", "b"]) == "a" else "a"
    replicas = FakeReplicas({"e": other})  # held by the replica the episode does not hash to
    gateway = Gateway(replicas.dispatch, replicas.live)

    async def run() -> None:
        assert (await request(gateway, [(b"x-replay-episode", b"e")]))[2][
            b"x-replay-replica"
        ] == other.encode()
        await request(gateway, [(b"x-replay-episode", b"e")])

    anyio.run(run)
    assert [e.target for e in replicas.sent] == [None, other, other]


def test_the_gateway_names_a_lost_episode_and_serves_new_ones() -> None:
    replicas = FakeReplicas({"e": "a", "f": "b"}, dead={"a"})
    gateway = Gateway(replicas.dispatch, replicas.live)

    async def run() -> None:
        status, body, _ = await request(gateway, [(b"x-replay-episode", b"e")])
        error = json.loads(body)["error"]
        assert (
            status == 410 and error["code"] == LOST_CODE and error["data"] == {"episode": "e", "replica": "a"}
        )
        assert "episode 'e' was held by replay replica a, which is gone" in error["message"]
        assert "restart this rollout" in error["message"] and json.loads(body)["id"] == 7
        assert (await request(gateway, [(b"x-replay-episode", b"f")]))[0] == 200
        assert (await request(gateway, [(b"x-replay-episode", b"new")]))[0] == 200
        status, body, _ = await request(gateway, [(b"mcp-session-id", b"r-a.s1")])
        assert status == 410 and "MCP session 'r-a.s1' was held by replay replica a" in body.decode()

    anyio.run(run)


@pytest.mark.parametrize("dies", [True, False])
def test_a_forward_stops_waiting_when_its_target_leaves_the_live_replicas(dies: bool) -> None:
    """Serve routes a call Ray found dead again, and that retry may never end: once the target has
    left the live replicas, the gateway answers "lost". A live target that is slow is waited for."""
    live = {"a", "b"}

    async def dispatch(envelope: Envelope) -> AsyncIterator[list[dict[str, Any]]]:
        assert envelope.target == "a"
        if dies:
            live.discard("a")  # a call of this process found it dead
            await anyio.sleep_forever()
        await anyio.sleep(3 * LIVENESS_POLL_S)
        headers = [(b"x-replay-replica", b"a")]
        yield [
            {"type": "http.response.start", "status": 200, "headers": headers},
            {"type": "http.response.body", "body": b"ok", "more_body": False},
        ]

    gateway = Gateway(dispatch, lambda: frozenset(live), replica="b")

    async def run() -> tuple[int, bytes, dict[bytes, bytes]]:
        with anyio.fail_after(10):
            return await request(gateway, [(b"mcp-session-id", b"r-a.s1")])

    status, body, headers = anyio.run(run)
    if dies:
        assert status == 410 and "MCP session 'r-a.s1' was held by replay replica a" in body.decode()
    else:
        assert (status, body, headers[b"x-replay-replica"]) == (200, b"ok", b"a")


def test_the_gateway_forwards_nothing_for_a_client_gone_before_its_body_and_refuses_oversized_bodies() -> (
    None
):
    replicas = FakeReplicas({})
    sent: list[dict[str, Any]] = []
    scope = {"type": "http", "method": "POST", "path": "/mcp/memory", "headers": [JSON]}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def run() -> None:
        gone = [{"type": "http.disconnect"}, {"type": "http.request", "body": b"{", "more_body": True}]
        await Gateway(replicas.dispatch, replicas.live)(scope, lambda: _pop(gone), send)
        assert sent == [] and replicas.sent == []
        big = [{"type": "http.request", "body": b"x" * 11, "more_body": False}]
        await Gateway(replicas.dispatch, replicas.live, max_body=10)(scope, lambda: _pop(big), send)
        assert sent[0]["status"] == 413 and replicas.sent == []

    anyio.run(run)


async def _pop(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return messages.pop()
