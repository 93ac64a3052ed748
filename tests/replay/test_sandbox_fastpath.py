"""Misses a bound, warm sandbox instance answers, taken on the HTTP fast path (no SDK request path).

Real fixture servers over real stdio, the record side's real pool, the replay over real HTTP: the
answer, its provenance and what it leaves (the episode's trail, the recording) are the SDK path's;
what the fast path cannot deliver itself is handed over, and its calls are cancelled as the SDK's.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from recording_helpers import step
from sandbox_helpers import live_instances, match, record, sandboxed, text, until, write_config

from replay_sim.protocol import LOST_CODE

pytestmark = pytest.mark.anyio

_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
_VERSION = "2025-06-18"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The counter server's ``put(k1, a)``, ``get(k1)``, the hang server's ``quick`` and the echo
    server's ``echo(hello)``, recorded once."""
    db = tmp_path_factory.mktemp("fastpath") / "replay.db"

    async def both() -> None:
        await record(db, "counter", [step("put", key="k1", value="a"), step("get", key="k1")])
        await record(db, "hang", [step("quick")])
        await record(db, "echo", [step("echo", text="hello")])

    anyio.run(both)
    return db


@pytest.fixture
def db(recorded: Path, tmp_path: Path) -> Path:
    return Path(shutil.copy(recorded, tmp_path / "replay.db"))


def counts(sim: Any) -> dict[str, Any]:
    return dict(sim.replay.policy.stats())


def _same_but_instance(one: dict[str, Any], other: dict[str, Any]) -> None:
    """Two sandbox answers' provenance: the same record but for the instance and its latency."""
    assert one.keys() == other.keys()
    assert one["sandbox"].keys() == other["sandbox"].keys()
    for key in one.keys() - {"sandbox"}:
        assert one[key] == other[key], key
    assert one["sandbox"]["replayed"] == other["sandbox"]["replayed"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_warm_instances_answer_on_the_fast_path_is_the_sdk_paths_result_and_provenance(
    db: Path, tmp_path: Path, mode: str
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with (
        sandboxed(db, config, tmp_path) as sim,
        Client(sim.episode("fast").url("counter"), mode=mode) as fast,  # type: ignore[arg-type]
        Client(sim.episode("sdk").url("counter"), mode=mode) as sdk,  # type: ignore[arg-type]
    ):
        for client, value in ((fast, "fast"), (sdk, "sdk")):  # binds each (SDK path: none was warm)
            bound = await client.call_tool("put", {"key": "mine", "value": value})  # states differ
            assert match(bound)["status"] == "sandbox"
        assert counts(sim).get("fast", 0) == 0
        for tool, arguments in (("put", {"key": "k2", "value": "x"}), ("get", {"key": "k2"})):
            taken = await fast.call_tool(tool, arguments)
            # A progress token is the SDK path's (it may relay progress): the same call answered there.
            given = await sdk.call_tool(tool, arguments, meta={"progressToken": "p-1"})
            assert taken.model_dump(exclude={"meta"}) == given.model_dump(exclude={"meta"})
            assert match(taken)["status"] == "sandbox"
            _same_but_instance(match(taken), match(given))
        assert text(taken) == "x" and counts(sim)["fast"] == 2


async def test_a_state_changing_call_on_the_fast_path_marks_the_episode_and_is_recorded_for_the_next(
    db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with sandboxed(db, config, tmp_path) as sim:
        async with Client(sim.episode("first").url("counter")) as first:
            await first.call_tool("put", {"key": "k2", "value": "x"})  # binds: the SDK path
            steps = len(sim.replay.histories.history("first").trail("counter").steps)
            wrote = await first.call_tool("put", {"key": "k3", "value": "y"})  # a write, on the fast path
            assert match(wrote)["status"] == "sandbox" and counts(sim)["fast"] == 1
            trail = sim.replay.histories.history("first").trail("counter")
            assert len(trail.steps) == steps + 1 and trail.diverged is None
            assert text(await first.call_tool("get", {"key": "k3"})) == "y"
        await until(lambda: counts(sim)["log"]["waiting"] == 0)  # the answers are recorded (batched)
        async with Client(sim.episode("second").url("counter")) as second:  # the same calls again
            for key, value in (("k2", "x"), ("k3", "y")):
                put = await second.call_tool("put", {"key": key, "value": value})
                assert match(put)["status"] == "exact"
            read = await second.call_tool("get", {"key": "k3"})
            assert text(read) == "y" and match(read)["status"] == "exact"  # the cache, in that state


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_an_answer_with_notifications_is_handed_to_the_sdk_path_and_asked_once(
    db: Path, tmp_path: Path, mode: str
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with sandboxed(db, config, tmp_path) as sim:
        async with Client(sim.episode("progress").url("hang"), mode=mode) as client:  # type: ignore[arg-type]
            await client.call_tool("slow", {"steps": 1, "interval": 0.01})  # binds
            answered = counts(sim)["answers"]
            # Its instance reports progress (the instance is always given a token): the answer
            # carries notifications, which the SDK path re-enacts.
            result = await client.call_tool("slow", {"steps": 2, "interval": 0.01})
        assert text(result) == "done after 2 steps" and match(result)["status"] == "sandbox"
        stats = counts(sim)
        assert stats["handed"] == 1 and stats.get("fast", 0) == 0
        assert stats["answers"] == answered + 1  # asked once, on the fast path; delivered by the SDK's


async def test_a_call_whose_instance_dies_on_the_fast_path_gets_the_sdk_paths_lost_episode_error(
    db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with sandboxed(db, config, tmp_path) as sim:
        async with Client(sim.episode("doomed").url("echo")) as client:
            assert match(await client.call_tool("echo", {"text": "not recorded"}))["status"] == "sandbox"
            with pytest.raises(MCPError) as lost:
                await client.call_tool("crash", {})  # asked on the fast path: its instance dies
        assert lost.value.error.code == LOST_CODE and "episode 'doomed' is lost" in lost.value.error.message
        assert counts(sim)["handed"] == 1 and counts(sim)["lost"] == 1


async def _open_session(http: httpx2.AsyncClient, url: str) -> str:
    init = {"protocolVersion": _VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    opened = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init},
                             headers=_HEADERS)  # fmt: skip
    session = str(opened.headers["mcp-session-id"])
    await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                    headers={**_HEADERS, "mcp-session-id": session})  # fmt: skip
    return session


async def _post(http: httpx2.AsyncClient, url: str, session: str, body: Any) -> httpx2.Response:
    headers = {**_HEADERS, "mcp-session-id": session, "mcp-protocol-version": _VERSION}
    return await http.post(url, json=body, headers=headers)


def _call(id_: int, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": id_,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


@pytest.mark.parametrize("how", ["notifications/cancelled", "a batch of one cancellation", "session end"])
async def test_a_handshake_era_call_on_the_fast_path_is_cancelled_as_the_sdk_cancels_it(
    db: Path, tmp_path: Path, how: str
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with sandboxed(db, config, tmp_path) as sim, httpx2.AsyncClient(timeout=60) as http:
        url = sim.episode("cancelled").url("hang")
        session = await _open_session(http, url)
        bound = await _post(http, url, session, _call(2, "slow", {"steps": 1, "interval": 0.01}))
        assert bound.json()["result"]["content"][0]["text"] == "done after 1 steps"
        answers: list[httpx2.Response] = []
        async with anyio.create_task_group() as tg:

            async def hang() -> None:
                answers.append(await _post(http, url, session, _call(3, "hang", {})))

            tg.start_soon(hang)  # the instance is warm: the fast path asks it
            await until(lambda: counts(sim)["pool"]["hang"]["live"] == 1 and _busy(sim))
            if how == "session end":
                ended = await http.delete(url, headers={"mcp-session-id": session})
                assert ended.status_code == 200
            else:
                cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}}
                if how == "notifications/cancelled":
                    assert (await _post(http, url, session, cancel)).status_code == 202
                else:  # the SDK refuses a batch as it does; the call is cancelled all the same
                    batch = await _post(http, url, session, [cancel])
                    assert batch.status_code < 500, batch.text
        assert answers[0].json()["error"]["code"] == -32800  # the SDK's "Request cancelled"
        await until(lambda: live_instances(sim, "hang") == 0)  # the cut call ended its instance
        assert counts(sim)["cut"] == 1


async def test_a_2026_era_call_on_the_fast_path_is_cancelled_when_its_client_leaves(
    db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with sandboxed(db, config, tmp_path) as sim:
        async with Client(sim.episode("leaving").url("hang")) as client:
            await client.call_tool("slow", {"steps": 1, "interval": 0.01})  # binds
            with anyio.move_on_after(60) as waited:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(client.call_tool, "hang", {})
                    await until(lambda: _busy(sim))
                    tg.cancel_scope.cancel()  # the client stops waiting: its request's stream is closed
            assert not waited.cancelled_caught
        await until(lambda: live_instances(sim, "hang") == 0)
        assert counts(sim)["cut"] == 1


def _busy(sim: Any) -> bool:
    """Whether an episode's instance is answering a call now."""
    return any(b.lock.locked() for b in sim.replay.policy.keeper.holders)
