"""Sandboxes correct by default (issue 27, item 2): never guess with a sandbox at hand, and a canary.

Real recordings of the fixture servers made by the real recorder; served over real HTTP with the
record side's real pool.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client
from recording_helpers import PYTHON, ROOT, proxy_stdio, run_script, step
from sandbox_helpers import live_instances, match, record, sandboxed, text, until, write_config

from replay_sim.effects import Effect
from replay_sim.resolve.resolution import Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Origin, Store

pytestmark = pytest.mark.anyio

COUNTER = [PYTHON, ROOT / "fixtures" / "counter_server.py"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _numbered_documents(db: Path) -> None:
    """``number_headings`` seen by reads of the headings (which print no numbers), on two documents."""
    script = [step("read_document", path="a.md")]
    for path in ("a.md", "b.md"):
        script += [step("read_headings", path=path), step("number_headings", path=path)]
        script += [step("read_headings", path=path)]
    await record(db, "document", script)


async def test_a_bound_episode_re_plays_a_call_only_learned_effect_free(tmp_path: Path) -> None:
    db = tmp_path / "replay.db"
    await _numbered_documents(db)
    with Store(db) as store:  # two different calls, each unchanged by a read naming its document
        learned = Resolver(store, index_dir=None, semantic=False).lookup.effect("document", "number_headings")
        assert learned.effect is Effect.NONE and learned.source == "evidence"
    config = write_config(tmp_path / "recorder.toml", servers=("document",))
    async with sandboxed(db, config, tmp_path) as sim, Client(sim.episode("e").url("document")) as client:
        numbered = await client.call_tool("number_headings", {"path": "a.md"})
        assert match(numbered)["status"] == "exact"  # recorded from the initial state
        # Never recorded: the episode's instance, brought to its state by re-playing every earlier
        # call — number_headings too, though the recordings show no read it changed.
        shown = await client.call_tool("read_document", {"path": "a.md"})
        assert match(shown)["status"] == "sandbox" and match(shown)["sandbox"]["replayed"] == 1
        assert text(shown).splitlines()[0] == "# 1. Intro"
        # Bound: a call only learned effect-free goes to the instance even though the cache has it.
        again = await client.call_tool("number_headings", {"path": "b.md"})
        assert match(again)["status"] == "sandbox"
        assert text(await client.call_tool("read_document", {"path": "b.md"})).startswith("# 1. Setup")


async def test_a_sandbox_server_is_never_answered_by_a_canonical_match(tmp_path: Path) -> None:
    db = tmp_path / "replay.db"
    await _numbered_documents(db)
    spelled = {"path": "a.md", "limit": 100}  # the schema's default, spelled out
    with Store(db) as store:  # with no sandbox at hand, the recorded call without it answers
        plain = Resolver(store, index_dir=None, semantic=False)
        assert plain.resolve("document", *step("read_document", **spelled), []).tier is Tier.CANONICAL
    config = write_config(tmp_path / "recorder.toml", servers=("document",))
    async with sandboxed(db, config, tmp_path) as sim, Client(sim.episode("e").url("document")) as client:
        read = await client.call_tool("read_document", spelled)
        assert match(read)["status"] == "sandbox" and text(read).startswith("# Intro")
        exact = await client.call_tool("read_headings", {"path": "a.md"})  # an exact repeat: the cache
        assert match(exact)["status"] == "exact"


async def test_an_instance_whose_state_is_not_the_initial_one_fails_the_canary_and_nothing_is_recorded(
    tmp_path: Path,
) -> None:
    state = tmp_path / "values.json"  # a state at a fixed path, outliving each process
    db = tmp_path / "replay.db"
    for _ in range(2):  # get(k1) recorded twice from the initial state, answered alike: a canary
        await run_script(
            proxy_stdio(db, "counter", [*COUNTER, "--state", str(state)]), [step("get", key="k1")]
        )
        state.unlink(missing_ok=True)
    state.write_text(json.dumps({"k1": "left over"}))  # what an earlier run left there
    args = json.dumps([str(COUNTER[1]), "--state", str(state)])
    config = tmp_path / "recorder.toml"
    config.write_text(f"[servers.counter]\ncommand = {json.dumps(PYTHON)}\nargs = {args}\nsandbox = true\n")
    async with sandboxed(db, config, tmp_path) as sim:
        async with Client(sim.episode("e").url("counter")) as client:
            missed = await client.call_tool("put", {"key": "k2", "value": "v"})
            assert missed.is_error and match(missed)["status"] == "miss"
            said = text(missed)
            assert "the sandbox of 'counter' is refused" in said and 'canary get({"key":"k1"})' in said
            assert "do not start from the recordings' initial state" in said
        async with Client(sim.episode("f").url("counter")) as client:  # refused for good: no new instance
            later = await client.call_tool("double", {"x": 2})
            assert match(later)["status"] == "miss" and "refused" in text(later)
        await until(lambda: live_instances(sim, "counter") == 0)
        assert sim.replay.policy.stats()["canaries"] == 1  # type: ignore[attr-defined]
    with Store(db) as store:
        assert all(r.origin != Origin.SANDBOX for r in store.recordings())


async def test_an_instance_at_the_initial_state_passes_the_canary_and_answers(tmp_path: Path) -> None:
    db = tmp_path / "replay.db"
    for _ in range(2):
        await record(db, "counter", [step("get", key="k1")])
    config = write_config(tmp_path / "recorder.toml")
    async with sandboxed(db, config, tmp_path) as sim, Client(sim.episode("e").url("counter")) as client:
        answered = await client.call_tool("put", {"key": "k2", "value": "v"})
        assert match(answered)["status"] == "sandbox" and text(answered) == "ok"
        assert sim.replay.policy.stats()["canaries"] == 1  # type: ignore[attr-defined]


async def test_a_write_no_instance_could_take_leaves_the_episode_state_unknown(tmp_path: Path) -> None:
    db = tmp_path / "replay.db"
    await record(
        db, "counter", [step("get", key="k1"), step("put", key="k1", value="v"), step("get", key="k1")]
    )
    config = tmp_path / "recorder.toml"  # the counter server, but its instances cannot start
    config.write_text(
        f'[servers.counter]\ncommand = {json.dumps(PYTHON)}\nargs = ["-c", "raise SystemExit(\'no disk\')"]\n'
        "sandbox = true\n"
    )
    async with sandboxed(db, config, tmp_path) as sim:
        async with Client(sim.episode("e").url("counter")) as client:
            write = await client.call_tool("put", {"key": "k1", "value": "w"})
            assert match(write)["status"] == "miss" and "could not be started" in text(write)
            assert "no disk" in text(write)  # why, in the miss
            read = await client.call_tool("get", {"key": "k1"})  # recorded from the initial state
            assert match(read)["status"] == "miss", text(read)  # not the state before the write
        async with Client(sim.episode("f").url("counter")) as client:
            unknown = await client.call_tool("get", {"key": "k2"})  # a read no instance took
            assert match(unknown)["status"] == "miss"
            read = await client.call_tool("get", {"key": "k1"})
            assert match(read)["status"] == "exact"  # a read changes nothing: the state is still known
