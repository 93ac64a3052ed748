"""Sandbox instances as caches of episodes' state: given back idle, at a session's end or for room,
rebuilt when their episode comes back; calls bounded in time and cancelled with their client.

Real fixture servers over real stdio, the record side's real pool, the replay over real HTTP.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from recording_helpers import step
from sandbox_helpers import live_instances, match, record, sandboxed, text, until, write_config

from replay_sim.replay.core.misses import Miss
from replay_sim.resolve.resolution import Resolution, Tier
from replay_sim.store import Origin, Store

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The counter server's ``put(k1, a)``, ``get(k1)`` and the hang server's ``quick``, recorded once."""
    db = tmp_path_factory.mktemp("lifecycle") / "replay.db"

    async def both() -> None:
        await record(db, "counter", [step("put", key="k1", value="a"), step("get", key="k1")])
        await record(db, "hang", [step("quick")])

    anyio.run(both)
    return db


@pytest.fixture
def db(recorded: Path, tmp_path: Path) -> Path:
    return Path(shutil.copy(recorded, tmp_path / "replay.db"))


def policy_stats(sim: object) -> dict[str, object]:
    return sim.replay.policy.stats()  # type: ignore[attr-defined, no-any-return]


async def test_an_episode_whose_idle_instance_was_given_back_answers_its_next_read_right(
    db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with (
        sandboxed(db, config, tmp_path, sandbox_idle=0.3) as sim,
        Client(sim.episode("idle").url("counter")) as client,
    ):
        await client.call_tool("put", {"key": "k1", "value": "a"})  # from the cache
        written = await client.call_tool("put", {"key": "k2", "value": "x"})
        assert match(written)["status"] == "sandbox"
        await until(lambda: live_instances(sim, "counter") == 0)  # nothing asked it for 0.3 s
        read = await client.call_tool("get", {"key": "k2"})  # rebuilt: put(k1, a), put(k2, x) re-played
        assert text(read) == "x" and match(read)["status"] == "sandbox"
        assert match(read)["sandbox"]["replayed"] == 2
        assert text(await client.call_tool("get", {"key": "k1"})) == "a"
        stats = policy_stats(sim)
        assert stats["released"] == 1 and stats["rebuilt"] == 1 and stats["lost"] == 0


async def test_at_the_cap_the_least_recently_used_idle_instance_is_reclaimed_and_both_episodes_go_on(
    db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with (
        sandboxed(db, config, tmp_path, max_instances=1, sandbox_timeout=60) as sim,
        Client(sim.episode("one").url("counter")) as one,
        Client(sim.episode("two").url("counter")) as two,
    ):
        for _ in range(2):  # each call takes the one place from the other episode, which rebuilds
            await one.call_tool("put", {"key": "mine", "value": "one"})
            await two.call_tool("put", {"key": "mine", "value": "two"})
            assert text(await one.call_tool("get", {"key": "mine"})) == "one"
            assert text(await two.call_tool("get", {"key": "mine"})) == "two"
            assert live_instances(sim, "counter") == 1
        stats = policy_stats(sim)
        assert stats["reclaimed"] >= 3 and stats["lost"] == 0
        assert stats["pool"]["counter"]["reclaimed"] == stats["reclaimed"]  # type: ignore[index]


async def test_a_call_waits_only_while_every_instance_is_busy_and_its_miss_says_what_to_change(
    db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with (
        sandboxed(db, config, tmp_path, max_instances=1, sandbox_timeout=0.5) as sim,
        Client(sim.episode("waiting").url("counter")) as waiting,
        httpx2.AsyncClient(timeout=60) as http,
    ):
        async with anyio.create_task_group() as tg:
            url = sim.episode("busy").url("hang")
            session = await _open_session(http, url)
            tg.start_soon(_call, http, url, session, "hang", {})  # holds the one instance, answering
            await until(lambda: live_instances(sim, "hang") == 1)
            missed = await waiting.call_tool("put", {"key": "k9", "value": "v"})
            await http.delete(url, headers={"mcp-session-id": session})  # its call is cancelled
            await until(lambda: live_instances(sim, "hang") == 0)
        said = text(missed)
        assert missed.is_error and match(missed)["status"] == "miss"
        assert "busy answering calls" in said and "--max-sandboxes" in said
        assert "--miss live" not in said
        # The call was made nowhere, but the episode sent it: a write the real server would have
        # made, so what state the episode is in is unknown, and its later calls there miss.
        later = await waiting.call_tool("get", {"key": "k9"})
        assert match(later)["status"] == "miss", text(later)
        said = text(later)
        assert 'earlier call put({"key":"k9","value":"v"})' in said and "state is unknown" in said


async def test_a_call_reporting_progress_is_cut_at_the_call_limit_and_its_episode_state_is_unknown(
    db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with (
        sandboxed(db, config, tmp_path, sandbox_call_limit=1.0) as sim,
        Client(sim.episode("slow").url("hang")) as client,
    ):
        cut = await client.call_tool("slow", {"steps": 100_000, "interval": 0.05})  # progress for ever
        assert cut.is_error and match(cut)["status"] == "miss" and "--sandbox-call-limit" in text(cut)
        await until(lambda: live_instances(sim, "hang") == 0)  # its instance was ended
        assert policy_stats(sim)["cut"] == 1
        after = await client.call_tool("quick", {})  # what the cut call did is unknown: not lost, diverged
        assert match(after)["status"] == "miss", text(after)
        assert "earlier call slow(" in text(after) and "state is unknown" in text(after)


async def test_a_session_that_ends_gives_back_its_instance_and_a_call_in_flight_is_cancelled(
    db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with sandboxed(db, config, tmp_path) as sim:
        episode = sim.episode("sessions")
        async with Client(episode.url("counter"), mode="legacy") as client:  # a handshake-era session
            await client.call_tool("put", {"key": "k2", "value": "x"})
            assert live_instances(sim, "counter") == 1
        # Its DELETE gave the instance back at once (no collector, no idle time: 5 s by default).
        await until(lambda: live_instances(sim, "counter") == 0, timeout=4)
        async with Client(episode.url("counter"), mode="legacy") as client:  # the episode comes back
            assert text(await client.call_tool("get", {"key": "k2"})) == "x"
        async with httpx2.AsyncClient(timeout=60) as http, anyio.create_task_group() as tg:
            url = sim.episode("left").url("hang")
            session = await _open_session(http, url)
            bound = policy_stats(sim).get("instances", 0)  # instances episodes were bound to so far
            tg.start_soon(_call, http, url, session, "slow", {"steps": 100_000, "interval": 0.05})
            # The call is on its instance once the episode is bound to one (a warm instance is live
            # before: a session ended then cancels the call while it binds, the test below).
            await until(lambda: policy_stats(sim).get("instances", 0) != bound)
            ended = await http.delete(url, headers={"mcp-session-id": session})  # the client leaves
            assert ended.status_code == 200
            await until(lambda: live_instances(sim, "hang") == 0, timeout=4)  # the call was cancelled
            tg.cancel_scope.cancel()
        assert policy_stats(sim)["cut"] == 1


_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


async def test_a_session_that_ends_while_its_episode_is_re_played_cuts_the_instance_being_bound(
    db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with sandboxed(db, config, tmp_path) as sim, httpx2.AsyncClient(timeout=60) as http:
        url = sim.episode("rebuilt").url("hang")
        session = await _open_session(http, url)
        await _call(http, url, session, "slow", {"steps": 40, "interval": 0.05})  # 2 s, of unknown effect
        await http.delete(url, headers={"mcp-session-id": session})  # its instance is given back
        await until(lambda: live_instances(sim, "hang") == 0)
        session = await _open_session(http, url)  # the episode comes back: its state is re-played first
        async with anyio.create_task_group() as tg:
            tg.start_soon(_call, http, url, session, "quick", {})
            await until(lambda: live_instances(sim, "hang") == 1)  # started: re-playing the 2 s call
            assert policy_stats(sim)["instances"] == 1  # not bound yet
            await http.delete(url, headers={"mcp-session-id": session})  # the client leaves
            await until(lambda: live_instances(sim, "hang") == 0)
            tg.cancel_scope.cancel()
        assert policy_stats(sim)["cut"] == 1 and policy_stats(sim)["instances"] == 1


async def _open_session(http: httpx2.AsyncClient, url: str) -> str:
    """Open a handshake-era MCP session by hand; its id."""
    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    opened = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init},
                             headers=_HEADERS)  # fmt: skip
    session = opened.headers["mcp-session-id"]
    headers = {**_HEADERS, "mcp-session-id": session}
    await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    return str(session)


async def _call(
    http: httpx2.AsyncClient, url: str, session: str, tool: str, arguments: dict[str, object]
) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    headers = {**_HEADERS, "mcp-session-id": session, "mcp-protocol-version": "2025-06-18"}
    async with http.stream("POST", url, json=body, headers=headers) as response:
        async for _ in response.aiter_bytes():
            pass


async def test_requests_with_no_history_share_a_few_instances_and_one_a_write_changed_is_discarded(
    db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with sandboxed(db, config, tmp_path) as sim, Client(sim.endpoint("counter")) as client:
        for n in range(6):  # 2026-era, no episode: answered from the initial state
            read = await client.call_tool("get", {"key": f"nobody-{n}"})
            assert text(read) == "(unset)" and match(read)["status"] == "sandbox"
        shared = policy_stats(sim)["shared"]
        assert shared["started"] == 1 and shared["idle"] == 1  # type: ignore[index]
        policy = sim.replay.policy
        write = Miss("counter", "tools/call", {"name": "put", "arguments": {"key": "k", "value": "v"}},
                     Resolution(Tier.MISS, 0.0))  # fmt: skip
        assert (await policy.answer(write)).tier is Tier.SANDBOX  # type: ignore[attr-defined]
        assert policy_stats(sim)["shared"]["discarded"] == 1  # type: ignore[index]
        read = await client.call_tool("get", {"key": "k"})  # a fresh instance: the write is not there
        assert text(read) == "(unset)"


async def test_a_sandbox_answer_is_served_while_the_store_is_locked_and_recorded_after(
    db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with (
        sandboxed(db, config, tmp_path) as sim,
        Client(sim.episode("fast").url("counter")) as client,
    ):
        locker = sqlite3.connect(db, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")  # another writer holds the store's write lock
        try:
            with anyio.fail_after(20):  # far below the store's busy wait: not waiting for the lock
                answered = await client.call_tool("put", {"key": "k7", "value": "v"})
            assert match(answered)["status"] == "sandbox"
            assert sim.replay.policy.log.waiting >= 1  # type: ignore[attr-defined]
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        await until(lambda: sim.replay.policy.log.waiting == 0)  # type: ignore[attr-defined]
    with Store(db) as store:
        kept = [(r.name, r.arguments) for r in store.recordings() if r.origin == Origin.SANDBOX]
    assert ("put", {"key": "k7", "value": "v"}) in kept


async def test_a_call_not_recorded_exactly_goes_to_the_sandbox_without_embedding_anything(
    db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with (
        sandboxed(db, config, tmp_path) as sim,
        Client(sim.episode("near").url("counter")) as client,
    ):
        embedder = sim.replay.resolver.embedder
        embedded: list[object] = []
        encode = embedder.encode
        embedder.encode = lambda texts, *a, **k: embedded.append(texts) or encode(texts, *a, **k)  # type: ignore[method-assign]
        near = await client.call_tool("put", {"key": "k1", "value": "b"})  # one value from a recording
        assert match(near)["status"] == "sandbox"
        for n in range(3):
            assert match(await client.call_tool("get", {"key": f"k{n}"}))["status"] == "sandbox"
        assert embedded == []  # no similar recording was looked up on the way
