"""Effect probes on a sandboxed server (``replay-sim explore`` with ``sandbox = true``), on real servers."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from recording_helpers import PYTHON, REPLAY_SIM, ROOT, proxy_stdio, run_script, stdio, step

from replay_sim.canonical import answer_text
from replay_sim.effects import Effect, Verdict
from replay_sim.record.config import RecorderConfig, UpstreamSpec
from replay_sim.record.sandbox import OBSERVERS, probe_effects
from replay_sim.resolve.resolution import Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.schemas import RecordedSchemas
from replay_sim.resolve.tooleffects import blockers, recorded_effects, store_effects
from replay_sim.store import Origin, Store

COUNTER = [PYTHON, ROOT / "fixtures" / "counter_server.py"]


def _episode(resolver: Resolver, server: str, *calls: tuple[str, dict[str, Any]]) -> list[tuple[Tier, str]]:
    """Each call's tier and answer text (canonical; '' for a miss), one episode from the initial state."""
    trail = resolver.lookup.trail([])
    out = []
    for method, params in calls:
        found = resolver.resolve(server, method, params, trail)
        resolver.advance(trail, found)
        rec = found.recording
        out.append((found.tier, "" if rec is None else answer_text(rec.result, rec.error)))
    return out


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_cli_learns_a_pure_tool_and_a_write_on_a_sandbox_and_replay_answers_what_the_server_does(
    tmp_path: Path,
) -> None:
    script = [
        step("get", key="alpha"),
        step("double", x=2),
        step("double", x=5),
        step("put", key="alpha", value="1"),
        step("get", key="alpha"),
        step("double", x=7),
    ]
    db = tmp_path / "r.db"
    await run_script(proxy_stdio(db, "counter", COUNTER), script)  # recorded plainly
    with Store(db) as store:
        before = Resolver(store, index_dir=None, semantic=False)
        assert before.lookup.effect("counter", "double").effect is Effect.UNKNOWN
        assert _episode(before, "counter", step("double", x=5))[0][0] is Tier.MISS

    command = " ".join(json.dumps(str(part)) for part in COUNTER[1:])
    config = tmp_path / "recorder.toml"
    config.write_text(f"[servers.counter]\ncommand = {json.dumps(PYTHON)}\nargs = [{command}]\n")
    plain = subprocess.run(
        [REPLAY_SIM, "explore", "--config", str(config), "--db", str(db)], capture_output=True, text=True
    )
    assert plain.returncode == 0, plain.stderr  # not a sandbox: says what stays unknown, and how to learn it
    assert "counter: 2 tool(s) of unknown effect (double, put)" in plain.stdout
    assert "declare it `sandbox = true`" in plain.stdout
    config.write_text(config.read_text() + "sandbox = true\n")
    done = subprocess.run(
        [REPLAY_SIM, "explore", "--config", str(config), "--db", str(db)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "counter/double: none: " in done.stdout
    assert "counter/put: changes: get before/after differed" in done.stdout
    assert "of unknown effect (" not in done.stdout  # nothing left unknown: no hint

    with Store(db) as store:
        probes = [r for r in store.recordings() if r.origin == Origin.EXPLORE and r.name in ("double", "put")]
        assert {r.name for r in probes} == {"double", "put"}
        resolver = Resolver(store, index_dir=None, semantic=False)
        assert resolver.lookup.effect("counter", "double").effect is Effect.NONE
        assert resolver.lookup.effect("counter", "put").effect is Effect.CHANGES
        # Every answer is the real server's, and none was (a pure call does not change the state).
        episodes = [
            [step("double", x=5), step("get", key="alpha")],  # a miss before: recorded mid-session
            [step("put", key="alpha", value="1"), step("get", key="alpha")],
            [step("double", x=7), step("put", key="alpha", value="1"), step("get", key="alpha")],
        ]
        for calls in episodes:
            truth = [answer_text(a, None) for a in await run_script(stdio(*COUNTER), calls)]
            replayed = _episode(resolver, "counter", *calls)
            assert [text for _, text in replayed] == truth
            assert all(tier is Tier.EXACT for tier, _ in replayed)


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_state_in_a_file_is_reset_before_each_probe_and_a_server_not_declared_a_sandbox_is_left_alone(
    tmp_path: Path,
) -> None:
    state, seed = tmp_path / "values.json", tmp_path / "seed.json"
    seed.write_text(json.dumps({"alpha": "0"}))
    state.write_bytes(seed.read_bytes())
    server = [*COUNTER, "--state", state]
    script = [
        step("get", key="beta"),
        step("put", key="alpha", value="1"),
        step("get", key="alpha"),
        step("double", x=3),
        step("double", x=4),
    ]
    db = tmp_path / "r.db"
    await run_script(proxy_stdio(db, "counter", server), script)
    # The recording left alpha = 1 in the file: each probe session must start from the seed again.
    spec = UpstreamSpec(command=PYTHON, args=tuple(map(str, server[1:])), reset=f"cp {seed} {state}")
    store = Store(db)
    schemas = RecordedSchemas(store)

    def verdicts(server: str) -> dict[str, Any]:
        return recorded_effects(store, server, schemas)

    assert {verdicts("counter")[t].effect for t in ("put", "double")} == {Effect.UNKNOWN}
    untouched = await probe_effects(store, RecorderConfig({"counter": spec}), verdicts)
    assert (untouched.sessions, untouched.asked) == (0, 0)

    sandbox = dataclasses.replace(spec, sandbox=True)
    report = await probe_effects(store, RecorderConfig({"counter": sandbox}), verdicts)
    assert report.problems == [] and report.sessions <= 2 * OBSERVERS * 2
    effects = verdicts("counter")
    assert effects["put"].effect is Effect.CHANGES
    assert effects["double"].effect is Effect.NONE
    # What was asked belongs to the store: a second run has nothing left to ask.
    again = await probe_effects(store, RecorderConfig({"counter": sandbox}), verdicts)
    assert (again.sessions, again.asked) == (0, 0)
    # The observer sharing a word with the write came first: get "alpha" saw it.
    assert report.effects["counter"]["put"].startswith("changes: get before/after differed")
    # Every probe session started from the seed: get "alpha" always answered 0 before a put.
    probed = [r for r in store.recordings() if r.origin == Origin.EXPLORE and r.arguments == {"key": "alpha"}]
    assert probed and {answer_text(r.result, None) for r in probed if r.seq == 1} <= {
        answer_text(_text("0"), None)
    }

    resolver = Resolver(store, index_dir=None, semantic=False)
    for calls in (
        [step("get", key="alpha")],  # asked from the initial state by the probes
        [step("double", x=4), step("put", key="alpha", value="1"), step("get", key="alpha")],
    ):
        state.write_bytes(seed.read_bytes())
        truth = [answer_text(a, None) for a in await run_script(stdio(*server), calls)]
        replayed = _episode(resolver, "counter", *calls)
        assert [text for _, text in replayed] == truth, replayed
        assert all(tier is Tier.EXACT for tier, _ in replayed)
    store.close()


def _text(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


@pytest.mark.anyio
async def test_a_server_that_does_not_start_is_reported_and_the_store_keeps_what_it_had(
    tmp_path: Path,
) -> None:
    db = tmp_path / "r.db"
    await run_script(proxy_stdio(db, "counter", COUNTER), [step("double", x=2), step("get", key="alpha")])
    gone = UpstreamSpec(command=str(tmp_path / "no-such-server"), sandbox=True)
    with Store(db) as store:
        count = len(store.recordings())
        schemas = RecordedSchemas(store)
        report = await probe_effects(
            store, RecorderConfig({"counter": gone}), lambda s: recorded_effects(store, s, schemas)
        )
        assert len(report.problems) == 1 and report.problems[0].startswith("counter: effect probes stopped: ")
        assert len(store.recordings()) == count


@pytest.mark.anyio
async def test_a_tool_left_unknown_is_not_asked_the_same_sessions_again(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    await run_script(proxy_stdio(db, "counter", COUNTER), [step("double", x=2), step("get", key="alpha")])
    config = RecorderConfig({"counter": UpstreamSpec(command=PYTHON, args=(str(COUNTER[1]),), sandbox=True)})

    def undecided(server: str) -> dict[str, Verdict]:  # whatever the answers say: still unknown
        return {"double": Verdict(Effect.UNKNOWN, "default", "no evidence")}

    with Store(db) as store:
        first = await probe_effects(store, config, undecided)
        assert first.asked > 0 and first.effects["counter"]["double"].startswith("unknown")
        again = await probe_effects(store, config, undecided)
        assert (again.sessions, again.asked) == (0, 0)
        assert again.skipped["asked by an earlier run"] == first.sessions - 1  # the observer alone: kept


def _sandboxed_counter() -> RecorderConfig:
    return RecorderConfig({"counter": UpstreamSpec(command=PYTHON, args=(str(COUNTER[1]),), sandbox=True)})


@pytest.mark.anyio
async def test_a_read_that_fails_before_the_tool_creates_what_it_reads_is_the_observer_that_sees_it(
    tmp_path: Path,
) -> None:
    # `read new` fails from the initial state; `get other` succeeds but names another key.
    db = tmp_path / "r.db"
    script = [step("read", key="new"), step("get", key="other"), step("put", key="new", value="1")]
    await run_script(proxy_stdio(db, "counter", COUNTER), script)
    with Store(db) as store:
        schemas = RecordedSchemas(store)

        def verdicts(server: str) -> dict[str, Any]:
            return recorded_effects(store, server, schemas)

        report = await probe_effects(store, _sandboxed_counter(), verdicts)
        assert verdicts("counter")["put"].effect is Effect.CHANGES
    # Seen by the failing read (it was skipped as an observer, and put learned effect-free).
    assert report.effects["counter"]["put"].startswith("changes: read before/after differed")


@pytest.mark.anyio
async def test_a_tool_with_no_other_call_to_observe_with_is_observed_by_its_own_calls(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    await run_script(proxy_stdio(db, "counter", COUNTER), [step("double", x=2), step("double", x=5)])
    with Store(db) as store:
        schemas = RecordedSchemas(store)

        def verdicts(server: str) -> dict[str, Any]:
            return recorded_effects(store, server, schemas)

        assert verdicts("counter")["double"].effect is Effect.UNKNOWN
        report = await probe_effects(store, _sandboxed_counter(), verdicts)
        assert verdicts("counter")["double"].effect is Effect.NONE, report.lines()
        # Asked A, B, then A again: A's answer unchanged by B.
        probes = [r.arguments for r in store.recordings() if r.origin == Origin.EXPLORE]
    assert {"x": 2} in probes and {"x": 5} in probes


NOTES = [PYTHON, ROOT / "fixtures" / "notes_server.py"]


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_sandbox_learns_the_effect_of_a_sql_tools_select_calls_apart_from_its_writes(
    tmp_path: Path,
) -> None:
    # The real notes server's `query` (no annotations): recorded, a SELECT changed across an INSERT,
    # so the tool changes state; nothing shows whether its SELECTs do, so an unrecorded SELECT
    # made the episode diverge.
    select, insert = "SELECT name, n FROM notes ORDER BY n", "INSERT INTO notes VALUES ('y', 2)"
    count = "SELECT count(*) FROM notes"  # a second SELECT: one call unchanged says little of a kind
    db = tmp_path / "r.db"
    await run_script(
        proxy_stdio(db, "notes", NOTES), [step("query", sql=s) for s in (select, count, insert, select)]
    )
    episode = [step("query", sql=insert), step("query", sql="SELECT n FROM notes"), step("query", sql=select)]
    with Store(db) as store:
        verdict = Resolver(store, index_dir=None, semantic=False).lookup.effect("notes", "query")
        assert verdict.effect is Effect.CHANGES and verdict.of_kind("select").effect is Effect.UNKNOWN
        # `stats` names the kinds blocking answers (which of the two changed the SELECT's answer is
        # not settled yet): the calls recorded after a SELECT, the SELECT after the INSERT.
        found = blockers(store, store_effects(store))
        assert found == [("notes", "query [select]", 3), ("notes", "query [insert]", 1)]
    command = " ".join(json.dumps(str(part)) for part in NOTES[1:])
    config = tmp_path / "recorder.toml"
    config.write_text(
        f"[servers.notes]\ncommand = {json.dumps(PYTHON)}\nargs = [{command}]\nsandbox = true\n"
    )
    done = subprocess.run(
        [REPLAY_SIM, "explore", "--config", str(config), "--db", str(db)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "notes/query [select]: none: " in done.stdout  # its SELECT asked twice in one fresh session
    with Store(db) as store:
        resolver = Resolver(store, index_dir=None, semantic=False)
        verdict = resolver.lookup.effect("notes", "query")
        assert verdict.effect is Effect.CHANGES and verdict.of_kind("select").effect is Effect.NONE
        assert dict(verdict.kinds)["insert"].effect is Effect.CHANGES
        truth = [answer_text(a, None) for a in await run_script(stdio(*NOTES), episode)]
        replayed = _episode(resolver, "notes", *episode)
    # The unrecorded SELECT misses without making the episode diverge; the rest is the server's.
    assert [tier for tier, _ in replayed] == [Tier.EXACT, Tier.MISS, Tier.EXACT]
    assert [replayed[0][1], replayed[2][1]] == [truth[0], truth[2]]
