"""The ``sandbox`` miss policy on real servers over real stdio: episodes bound to their own instances.

Recordings are made by the real recorder from the fixture servers; the replay is served over real
HTTP; instances come from the record side's real pool (fresh processes: the fixture servers keep
their state in the process).
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
from pathlib import Path

import anyio
import httpx2
import pytest
from click.testing import CliRunner
from mcp import Client
from mcp.shared.exceptions import MCPError
from recording_helpers import REPLAY_SIM, raw_client, raw_request, stdio, step
from resolver_helpers import GatedEmbedder
from sandbox_helpers import live_instances, match, record, sandboxed, text, until, write_config

import replay_sim
from replay_sim.cli import cli
from replay_sim.errors import ConfigError, SnapshotError
from replay_sim.protocol import LOST_CODE, MATCH_META_KEY
from replay_sim.record.config_file import load_config
from replay_sim.record.instances.building import sandbox_pool
from replay_sim.replay.factory import open_replay
from replay_sim.replay.policies.binding import same_answer
from replay_sim.resolve.embedding import SentenceTransformerEmbedder
from replay_sim.resolve.resolution import Tier
from replay_sim.resolve.snapshot import freeze
from replay_sim.store import Origin, Recording, Store
from replay_sim.store.snapshot import verify

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def counter_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One recorded session of the counter server (once): ``put(k1, a)``, ``put(k2, b)``, ``get(k1)``."""
    db = tmp_path_factory.mktemp("counter") / "replay.db"
    script = [step("put", key="k1", value="a"), step("put", key="k2", value="b"), step("get", key="k1")]
    anyio.run(record, db, "counter", script)
    return db


@pytest.fixture
def counter_db(counter_recording: Path, tmp_path: Path) -> Path:
    """A copy of :func:`counter_recording` each test may grow."""
    return Path(shutil.copy(counter_recording, tmp_path / "replay.db"))


@pytest.mark.parametrize("unconfined", [False, True])
async def test_readiness_and_the_dashboard_say_whether_sandbox_instances_run_confined(
    counter_db: Path, tmp_path: Path, unconfined: bool
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    pool = sandbox_pool(load_config(config), pool=0, unconfined=unconfined)
    async with (
        replay_sim.serving(
            db=counter_db, miss="sandbox", sandboxes=pool, index_dir=tmp_path / "index"
        ) as sim,
        httpx2.AsyncClient() as http,
    ):
        ready = (await http.get(f"{sim.url}/api/ready")).json()
        page = (await http.get(f"{sim.url}/")).text
    assert ready["sandboxes_confined"] is (not unconfined)
    assert 'id="unconfined"' in page  # shown by the dashboard when the pool says so


async def test_two_interleaved_episodes_writing_the_same_key_each_read_back_their_own_value(
    counter_db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with sandboxed(counter_db, config, tmp_path) as sim:
        one, two = sim.episode("one"), sim.episode("two")
        async with Client(one.url("counter")) as a, Client(two.url("counter")) as b:
            put = await a.call_tool("put", {"key": "k1", "value": "a"})
            assert match(put)["status"] == "exact"  # recorded: answered from the cache
            # Never recorded: one's own instance, brought to one's state by re-playing put(k1, a).
            first = await a.call_tool("put", {"key": "k2", "value": "x"})
            assert text(first) == "ok" and match(first)["status"] == "sandbox"
            assert match(first)["sandbox"]["replayed"] == 1
            other = await b.call_tool("put", {"key": "k2", "value": "y"})
            assert match(other)["status"] == "sandbox" and match(other)["sandbox"]["replayed"] == 0
            assert match(other)["sandbox"]["instance"] != match(first)["sandbox"]["instance"]
            # Reads no recording made from these states answers: each episode's instance.
            assert text(await a.call_tool("get", {"key": "k2"})) == "x"
            assert text(await b.call_tool("get", {"key": "k2"})) == "y"
            assert text(await a.call_tool("get", {"key": "k1"})) == "a"  # re-played into one's instance
            assert text(await b.call_tool("get", {"key": "k1"})) == "(unset)"
            # A write the cache answers (recorded from the initial state, which two is not in) and
            # one it could answer from this state both go to the bound instance.
            again = await b.call_tool("put", {"key": "k1", "value": "a"})
            assert match(again)["status"] == "sandbox"
            assert text(await b.call_tool("get", {"key": "k1"})) == "a"
        stats = one.stats()
        assert stats["sandbox"] == {"instances": 1, "replayed": 1, "answers": 3, "lost": 0}
        assert stats["tiers"] == {"exact": 1, "sandbox": 3}


async def test_a_second_episode_making_the_same_calls_is_answered_from_what_the_first_recorded(
    counter_db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    calls = [
        ("put", {"key": "k1", "value": "a"}),
        ("put", {"key": "k2", "value": "x"}),
        ("get", {"key": "k1"}),
        ("get", {"key": "k2"}),
    ]
    async with sandboxed(counter_db, config, tmp_path) as sim:
        runs = []
        for name in ("first", "second"):
            async with Client(sim.episode(name).url("counter")) as client:
                runs.append([await client.call_tool(tool, arguments) for tool, arguments in calls])
            # The first's answers are recorded off the answer path, in batches: once they are written.
            await until(lambda: sim.replay.policy.log.waiting == 0)  # type: ignore[attr-defined]
        assert [text(r) for r in runs[0]] == [text(r) for r in runs[1]] == ["ok", "ok", "a", "x"]
        assert [match(r)["status"] for r in runs[0]] == ["exact", "sandbox", "sandbox", "sandbox"]
        assert [match(r)["status"] for r in runs[1]] == ["exact"] * 4
        assert sim.replay.episodes.get("second").sandbox == {}  # no instance was taken
    with Store(counter_db) as store:
        added = [r for r in store.recordings() if r.origin == Origin.SANDBOX]
    # One session: the re-played put(k1, a), then the three answers the instance gave.
    assert len({r.session for r in added}) == 1
    assert [(r.name, r.arguments) for r in added] == [
        ("put", {"key": "k1", "value": "a"}),
        *[(tool, arguments) for tool, arguments in calls[1:]],
    ]
    shown = CliRunner().invoke(cli, ["stats", "--db", str(counter_db)])
    assert shown.exit_code == 0 and "added by rollouts" in shown.output
    assert "counter\t4 calls of 2 tools/resources/prompts" in shown.output


async def test_a_bound_episodes_write_the_cache_answers_still_goes_to_its_instance(
    counter_db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with (
        sandboxed(counter_db, config, tmp_path) as sim,
        Client(sim.episode("bound").url("counter")) as client,
    ):
        unset = await client.call_tool("get", {"key": "k1"})  # recorded only after writes: not from here
        assert text(unset) == "(unset)" and match(unset)["status"] == "sandbox"
        write = await client.call_tool("put", {"key": "k1", "value": "a"})  # recorded from this state
        assert match(write)["status"] == "sandbox"  # yet its instance makes it: its state stays ours
        # No recording of get(k1) was made after put(k1, a) alone: the instance, which has it.
        read = await client.call_tool("get", {"key": "k1"})
        assert text(read) == "a" and match(read)["status"] == "sandbox"


async def test_an_episode_ended_by_delete_closes_its_instance(counter_db: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with sandboxed(counter_db, config, tmp_path) as sim:
        episode = sim.episode("ending")
        async with Client(episode.url("counter")) as client:
            await client.call_tool("put", {"key": "new", "value": "v"})
        assert live_instances(sim, "counter") == 1
        async with httpx2.AsyncClient() as http:
            metrics = (await http.get(f"{sim.url}/metrics")).text
            stats = (await http.get(f"{sim.url}/api/stats")).json()["sandbox"]
            summary = (await http.get(f"{sim.url}/api/episodes/ending")).json()
        assert "replay_sim_sandbox_instances_total 1" in metrics
        assert 'replay_sim_sandbox_live_instances{server="counter"} 1' in metrics
        assert stats["bound"] == 1 and stats["answers"] == 1 and stats["pool"]["counter"]["live"] == 1
        assert summary["sandbox"] == {"instances": 1, "replayed": 0, "answers": 1, "lost": 0}
        assert summary["tiers"] == {"sandbox": 1}
        episode.close()
        await until(lambda: live_instances(sim, "counter") == 0)
        assert sim.replay.policy.stats()["bound"] == 0


async def test_episodes_ended_over_the_admin_api_close_their_instances(
    counter_db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with sandboxed(counter_db, config, tmp_path) as sim, httpx2.AsyncClient() as http:
        for n in range(3):  # ended on the server's own loop, as a trainer's DELETE ends them
            async with Client(sim.episode(f"api-{n}").url("counter")) as client:
                await client.call_tool("put", {"key": "new", "value": str(n)})
            assert (await http.delete(f"{sim.url}/api/episodes/api-{n}")).status_code == 200
        await until(lambda: live_instances(sim, "counter") == 0)
        assert sim.replay.policy.stats()["bound"] == 0


async def test_a_server_answering_a_replayed_call_otherwise_is_a_miss_naming_the_call(tmp_path: Path) -> None:
    db = tmp_path / "replay.db"
    home = ("tools/call", {"name": "env", "arguments": {"name": "HOME"}})
    await record(db, "echo", [step("echo", text="hi")])  # its opening canary: answered alike
    await record(db, "echo", [home])  # the server inherits the recorder's HOME
    config = write_config(tmp_path / "recorder.toml", env={"echo": {"HOME": str(tmp_path)}})
    async with sandboxed(db, config, tmp_path) as sim:
        async with Client(sim.episode("e").url("echo")) as client:
            seen = await client.call_tool("env", {"name": "HOME"})
            assert match(seen)["status"] == "exact"  # `env` has no annotations: it may change state
            missed = await client.call_tool("echo", {"text": "never recorded"})
            assert missed.is_error and match(missed)["status"] == "miss"
            said = text(missed)
            assert 'echo is not deterministic for env({"name":"HOME"}): re-play answered differently' in said
            # ... and the first field that differed, with the recorded and the re-played value (the
            # config's env values are redacted from what an instance answers, as the recorder does).
            recorded = os.environ.get("HOME", "/root")
            first = f'first difference at content[0].text: recorded "{recorded}", re-played "[REDACTED]"'
            assert first in said
            # A miss served as one carries how sure its best candidate is (recorded from another
            # state): judged only now, not on every call a sandbox answers.
            other = await client.call_tool("echo", {"text": "hi"})
            assert match(other)["status"] == "miss" and 0 < match(other)["confidence"] < 1
        await until(lambda: live_instances(sim, "echo") == 0)  # the instance that diverged is closed
    with Store(db) as store:
        assert all(r.origin != Origin.SANDBOX for r in store.recordings())  # none from another state


async def test_an_instance_that_dies_makes_its_episode_lost(tmp_path: Path) -> None:
    db = tmp_path / "replay.db"
    await record(db, "echo", [step("echo", text="hello")])
    config = write_config(tmp_path / "recorder.toml")
    async with sandboxed(db, config, tmp_path) as sim:
        async with Client(sim.episode("doomed").url("echo")) as client:
            said = await client.call_tool("echo", {"text": "not recorded"})
            assert match(said)["status"] == "sandbox"
            for _ in range(2):  # the call that kills it, then any later call: the state is gone
                with pytest.raises(MCPError) as lost:
                    await client.call_tool("crash", {})
                assert (
                    lost.value.error.code == LOST_CODE
                    and "episode 'doomed' is lost" in lost.value.error.message
                )
            with pytest.raises(MCPError) as later:
                await client.call_tool("echo", {"text": "hello"})  # recorded, but not from this state
            assert later.value.error.code == LOST_CODE
        assert sim.replay.episodes.get("doomed").sandbox["lost"] == 1


@pytest.mark.parametrize("chosen_by", ["--miss sandbox", 'miss = "sandbox" in the recorder config'])
async def test_serve_over_stdio_with_miss_sandbox_answers_from_an_instance_and_keeps_the_answer(
    counter_db: Path, tmp_path: Path, chosen_by: str
) -> None:
    by_flag = chosen_by.startswith("--")
    config = write_config(tmp_path / "recorder.toml", own_miss=() if by_flag else ("counter",))
    serve = stdio(
        REPLAY_SIM, "serve", "--stdio", "--server", "counter", "--db", counter_db,
        "--miss", "sandbox" if by_flag else "error",
        "--config", config, "--sandbox-pool", "0", "--index-dir", tmp_path / "index",
        env=dict(os.environ),  # this checkout's replay_sim (PYTHONPATH), not only the SDK's safe variables
    )  # fmt: skip
    with anyio.fail_after(120):
        async with raw_client(serve) as client:  # the stdio client's history is the one bound
            first = await raw_request(client, "tools/call", {"name": "double", "arguments": {"x": 21}})
        async with raw_client(serve) as client:  # a new process: the answer was recorded
            again = await raw_request(client, "tools/call", {"name": "double", "arguments": {"x": 21}})
    assert first["content"] == again["content"] == [{"type": "text", "text": "42"}]
    assert first["_meta"][MATCH_META_KEY]["status"] == "sandbox"
    assert again["_meta"][MATCH_META_KEY]["status"] == "exact"


async def test_a_snapshot_served_with_sandboxes_keeps_their_answers_in_a_side_store(
    counter_db: Path, tmp_path: Path
) -> None:
    bundle = tmp_path / "snap"
    await anyio.to_thread.run_sync(freeze, counter_db, bundle)
    config = write_config(tmp_path / "recorder.toml")
    async with (
        sandboxed(None, config, tmp_path, snapshot=bundle) as sim,
        Client(sim.episode("frozen").url("counter")) as client,
    ):
        assert match(await client.call_tool("put", {"key": "k1", "value": "a"}))["status"] == "exact"
        write = await client.call_tool("put", {"key": "k3", "value": "z"})
        assert match(write)["status"] == "sandbox" and match(write)["snapshot"] == sim.replay.snapshot
        # The snapshot cannot hold the new state: from here the episode's instance answers, reads too.
        assert [text(await client.call_tool("get", {"key": k})) for k in ("k3", "k1", "k2")] == [
            "z",
            "a",
            "(unset)",
        ]
    side = tmp_path / "snap.sandbox.db"
    with Store(side) as store:
        kept = [(r.name, r.arguments, r.origin) for r in store.recordings()]
    assert kept[:2] == [
        ("put", {"key": "k1", "value": "a"}, "sandbox"),
        ("put", {"key": "k3", "value": "z"}, "sandbox"),
    ]
    assert len(kept) == 5
    assert verify(bundle).id == sim.replay.snapshot  # the bundle itself is untouched


async def test_a_later_freeze_with_sandbox_answers_makes_a_bundle_answering_what_the_side_store_held(
    counter_db: Path, tmp_path: Path
) -> None:
    bundle, folded = tmp_path / "snap", tmp_path / "snap2"
    await anyio.to_thread.run_sync(freeze, counter_db, bundle)
    calls = [("put", {"key": "k1", "value": "a"}), ("put", {"key": "k3", "value": "z"}),
             ("get", {"key": "k3"}), ("get", {"key": "k1"})]  # fmt: skip
    async with (
        sandboxed(None, write_config(tmp_path / "recorder.toml"), tmp_path, snapshot=bundle) as sim,
        Client(sim.episode().url("counter")) as client,
    ):
        served = [await client.call_tool(tool, arguments) for tool, arguments in calls]
    assert [match(r)["status"] for r in served] == ["exact", "sandbox", "sandbox", "sandbox"]

    def held(path: Path) -> set[tuple[object, ...]]:
        with Store(path, readonly=True) as store:
            return {
                (r.session, r.seq, r.name, str(r.arguments), str(r.result), r.origin)
                for r in store.recordings()
            }

    side = held(tmp_path / "snap.sandbox.db")
    invoke = CliRunner().invoke
    arguments = [
        "snapshot",
        "freeze",
        "--db",
        str(bundle / "store.db"),
        "--with-sandbox-answers",
        "--out",
        str(folded),
    ]
    result = await anyio.to_thread.run_sync(invoke, cli, arguments)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == verify(folded).id != verify(bundle).id
    assert held(folded / "store.db") == held(bundle / "store.db") | side
    # Served with no sandbox at all, the new bundle answers the episode from what the side store held.
    async with (
        replay_sim.serving(snapshot=folded) as sim,  # miss error: nothing but the bundle answers
        Client(sim.episode().url("counter")) as client,
    ):
        again = [await client.call_tool(tool, arguments) for tool, arguments in calls]
    assert [match(r)["status"] for r in again] == ["exact"] * 4
    assert [text(r) for r in again] == [text(r) for r in served] == ["ok", "ok", "z", "a"]


def test_freeze_with_sandbox_answers_and_no_side_store_is_refused_naming_the_file(
    counter_db: Path, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "snapshot",
            "freeze",
            "--db",
            str(counter_db),
            "--with-sandbox-answers",
            "--out",
            str(tmp_path / "s"),
        ],
    )
    assert isinstance(result.exception, SnapshotError)
    assert f"{counter_db}.sandbox.db: no sandbox answers kept" in str(result.exception)
    assert not (tmp_path / "s").exists()


def test_re_play_takes_an_answer_leaving_out_what_the_recording_spelled_out_as_the_same_answer() -> None:
    # A recording made through an SDK client (the dev probe sets) spells out `isError: false` and
    # `resultType: "complete"`; a server's raw answer leaves them out. Only content differences count.
    content = [{"type": "text", "text": "Entities deleted successfully"}]
    recorded = {"content": content, "isError": False, "resultType": "complete", "_meta": {"x": 1}}
    recording = Recording(
        1, "memory", "tools/call", "delete_entities", {}, {}, "k", recorded, None, "s", 1, None, "t", "import"
    )
    assert same_answer(recording, {"result": {"content": content}, "error": None})
    assert not same_answer(recording, {"result": {"content": content, "isError": True}, "error": None})
    assert not same_answer(
        recording, {"result": {"content": [{"type": "text", "text": "no"}]}, "error": None}
    )


def test_a_server_can_only_choose_the_sandbox_policy_and_only_as_a_sandbox(tmp_path: Path) -> None:
    config = tmp_path / "recorder.toml"
    config.write_text('[servers.counter]\ncommand = "python"\nmiss = "live"\nsandbox = true\n')
    with pytest.raises(ConfigError, match="'miss' can only be \"sandbox\" per server"):
        load_config(config)
    config.write_text('[servers.counter]\ncommand = "python"\nmiss = "sandbox"\n')
    with pytest.raises(ConfigError, match='miss = "sandbox" needs sandbox = true'):
        load_config(config)


async def test_a_history_scoped_to_an_mcp_session_binds_per_session_and_its_end_closes_the_instance(
    counter_db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with sandboxed(counter_db, config, tmp_path) as sim:
        async with (
            Client(sim.endpoint("counter"), mode="legacy") as one,
            Client(sim.endpoint("counter"), mode="legacy") as two,
        ):  # handshake-era sessions, no episode: each session is its own history
            await one.call_tool("put", {"key": "mine", "value": "one"})
            await two.call_tool("put", {"key": "mine", "value": "two"})
            assert text(await one.call_tool("get", {"key": "mine"})) == "one"
            assert text(await two.call_tool("get", {"key": "mine"})) == "two"
            assert live_instances(sim, "counter") == 2

        # The sessions ended: their histories are freed (the SDK's session objects hold cycles: the
        # collector frees them), and with them their instances. The server may finish ending a
        # session after the client has left (a loaded machine): each look collects again.
        def freed() -> bool:
            gc.collect()
            return live_instances(sim, "counter") == 0

        await until(freed)


async def test_a_request_with_no_history_is_answered_by_an_initial_state_instance_only_for_a_read(
    counter_db: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "recorder.toml")
    async with sandboxed(counter_db, config, tmp_path) as sim, Client(sim.endpoint("counter")) as client:
        read = await client.call_tool("get", {"key": "nobody-wrote"})  # 2026-era: no session, no episode
        assert text(read) == "(unset)" and match(read)["status"] == "sandbox"
        write = await client.call_tool("put", {"key": "k9", "value": "v"})  # its effect could not be kept
        assert write.is_error and match(write)["status"] == "miss" and "episode" in text(write)
        shared = sim.replay.policy.stats()["shared"]  # type: ignore[attr-defined]
        assert shared["started"] == 1 and shared["idle"] == 1  # kept for the next such read


async def test_a_call_needing_the_model_while_it_loads_is_answered_by_the_episodes_instance(
    counter_db: Path, tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    # The cache tiers that can answer before the model loads did not; the real server can: a
    # sandboxed call is not held for the warm-up, nor refused as "still starting". (The warm-up
    # loads the model for a server no sandbox answers: a sandbox-only store's never does.)
    with Store(counter_db) as store:
        store.record_call("other", "tools/call", {"name": "echo", "arguments": {"text": "hi"}}, result={})
    pool = sandbox_pool(load_config(write_config(tmp_path / "recorder.toml")), pool=0, max_instances=2)
    replay = open_replay(counter_db, miss="sandbox", sandboxes=pool, index_dir=tmp_path / "index")
    model = GatedEmbedder(embedder)
    replay.resolver._embedder = model  # the model is still loading until the test opens the gate
    replay.warm_wait = 0.2
    with replay, anyio.fail_after(120):
        async with contextlib.AsyncExitStack() as stack:
            await replay.enter(stack)
            replay.resolver.warm(wait=False)
            assert await anyio.to_thread.run_sync(model.waiting.wait, 60)  # the warm-up loads it
            trail = replay.histories.history("episode-1")
            assert trail is not None
            answer = await replay.resolve(
                "counter", "tools/call", {"name": "get", "arguments": {"key": "k9"}}, trail.trail("counter")
            )
            assert answer.resolution.tier is Tier.SANDBOX and "(unset)" in str(answer.reply)
            model.gate.set()


async def test_a_call_replay_sim_would_refuse_is_answered_by_the_real_server_in_a_sandbox(
    counter_db: Path, tmp_path: Path
) -> None:
    # An unlisted tool: the recorded surface would refuse it in the SDK's words; the real server
    # answers in its own, and that answer is the faithful one.
    config = write_config(tmp_path / "recorder.toml")
    async with (
        sandboxed(counter_db, config, tmp_path) as sim,
        Client(sim.episode("one").url("counter")) as client,
    ):
        unknown = await client.call_tool("nosuch", {})
    assert unknown.is_error and text(unknown) == "unknown tool 'nosuch'"
    assert match(unknown)["status"] == "sandbox"
