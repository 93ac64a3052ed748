"""Misses become recordings: a replay keeps each miss with the state it was missed in, and backfill
asks the real server (fixtures/counter_server.py, over real stdio) from that state.

The counter server keeps its values in its process: each backfill session is a fresh process,
which is its initial state, so ``reset = "true"`` is an honest reset for it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from recording_helpers import PYTHON, ROOT, proxy_stdio, run_script, step

from replay_sim.cli.coverage import store_answers
from replay_sim.record.backfill import backfill
from replay_sim.record.config import RecorderConfig, UpstreamSpec
from replay_sim.replay.core.replay import Replay
from replay_sim.resolve.resolution import Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Origin, Store
from replay_sim.store.misses import read_misses, side_file
from replay_sim.store.misslog import MissLog

COUNTER = [PYTHON, ROOT / "fixtures" / "counter_server.py"]
pytestmark = pytest.mark.anyio


def _spec(reset: str | None = None, command: str = PYTHON) -> UpstreamSpec:
    return UpstreamSpec(command=command, args=(str(COUNTER[1]),), reset=reset)


def _read_only(server: str, tool: str) -> bool:
    return tool == "get"  # annotated read-only, and it is


async def _recorded(tmp_path: Path) -> Path:
    """A plain recording of the counter: ``get a``, ``put a=1``, ``get a``."""
    db = tmp_path / "r.db"
    script = [step("get", key="a"), step("put", key="a", value="1"), step("get", key="a")]
    await run_script(proxy_stdio(db, "counter", COUNTER), script)
    return db


async def _episode(replay: Replay, *calls: tuple[str, dict[str, Any]]) -> list[Tier]:
    """Replay calls as one episode; the tier of each answer."""
    trail = replay.resolver.lookup.trail([])
    tiers = []
    for method, params in calls:
        answer = await replay.resolve("counter", method, params, trail)
        replay.resolver.advance(trail, answer.resolution)
        tiers.append(answer.resolution.tier)
    return tiers


def _replay(store: Store) -> Replay:
    return Replay(store, resolver=Resolver(store, index_dir=None, semantic=False))


@pytest.mark.slow
async def test_a_replay_keeps_each_miss_with_the_params_of_the_state_changing_calls_before_it(
    tmp_path: Path,
) -> None:
    store = Store(await _recorded(tmp_path))
    replay = _replay(store)
    # put a=1 is recorded; put b=2 is not (the episode diverges); get c after both is a miss.
    tiers = await _episode(
        replay, step("put", key="a", value="1"), step("put", key="b", value="2"), step("get", key="c")
    )
    assert tiers == [Tier.EXACT, Tier.MISS, Tier.MISS]
    await _episode(replay, step("get", key="c"))  # the same call at the initial state: another miss
    await _episode(replay, step("get", key="c"))  # and again: counted, not repeated
    assert replay.miss_log is not None and replay.miss_log.flush()
    kept = {(m.name, len(m.prefix or [])): m for m in read_misses(store)}
    assert set(kept) == {("put", 1), ("get", 2), ("get", 0)}
    assert [(s["method"], s["params"]) for s in kept[("get", 2)].prefix or []] == [
        ("tools/call", {"name": "put", "arguments": {"key": "a", "value": "1"}}),
        ("tools/call", {"name": "put", "arguments": {"key": "b", "value": "2"}}),
    ]
    assert kept[("get", 0)].count == 2 and kept[("get", 0)].initial
    store.close()


@pytest.mark.slow
async def test_backfill_asks_each_miss_from_its_state_and_the_replay_then_answers_it_exactly(
    tmp_path: Path,
) -> None:
    store = Store(await _recorded(tmp_path))
    replay = _replay(store)
    after_put = (step("put", key="a", value="1"), step("get", key="b"))
    assert await _episode(replay, *after_put) == [Tier.EXACT, Tier.MISS]
    assert await _episode(replay, step("get", key="a"), step("get", key="z")) == [Tier.EXACT, Tier.MISS]
    assert replay.miss_log is not None and replay.miss_log.flush()
    misses = read_misses(store)

    # Without a reset only the read at the initial state is asked (a fresh process, a read-only
    # tool, a canary answered as recorded); the miss after a write is reported, not guessed.
    plain = RecorderConfig({"counter": _spec()})
    report = await backfill(store, misses, plain, _read_only, answers=store_answers(store))
    assert (report.recorded, report.answered_after) == (1, 1)
    assert report.skipped == {
        "missed after state-changing calls; upstream 'counter' needs a reset command": 1
    }
    assert report.asked == 2  # the canary and the call

    # With a reset, the write is asked again first, and both calls are recorded as one session.
    resetting = RecorderConfig({"counter": _spec(reset="true")})
    report = await backfill(store, misses, resetting, _read_only, answers=store_answers(store))
    assert (report.answered_before, report.recorded, report.answered_after, report.resets) == (1, 1, 2, 1)
    backfilled = [r for r in store.recordings() if r.origin == Origin.BACKFILL]
    assert [(r.name, r.arguments, r.result["content"][0]["text"]) for r in backfilled] == [  # type: ignore[index]
        ("get", {"key": "z"}, "(unset)"),
        ("put", {"key": "a", "value": "1"}, "ok"),
        ("get", {"key": "b"}, "(unset)"),
    ]
    assert backfilled[1].session == backfilled[2].session != backfilled[0].session
    replay = _replay(store)
    assert await _episode(replay, *after_put) == [Tier.EXACT, Tier.EXACT]
    assert await _episode(replay, step("get", key="b")) == [Tier.MISS]  # at the initial state: not asked
    store.close()


@pytest.mark.slow
async def test_a_failing_reset_and_a_gone_upstream_are_reported_and_nothing_is_recorded(
    tmp_path: Path,
) -> None:
    store = Store(await _recorded(tmp_path))
    replay = _replay(store)
    await _episode(replay, step("put", key="a", value="1"), step("get", key="b"))
    await _episode(replay, step("put", key="a", value="1"), step("get", key="c"))
    assert replay.miss_log is not None and replay.miss_log.flush()
    misses = read_misses(store)
    before = len(store.recordings())

    failing = RecorderConfig({"counter": _spec(reset="echo restoring; exit 3")})
    report = await backfill(store, misses, failing, _read_only)
    assert report.recorded == 0 and report.resets == 1
    assert report.problems == [
        "counter: reset command of upstream 'counter' (echo restoring; exit 3) failed with exit status 3: "
        "restoring"
    ]
    assert report.skipped == {"upstream 'counter' failed earlier in this run": 2}

    gone = RecorderConfig({"counter": _spec(reset="true", command=str(tmp_path / "no-such-server"))})
    report = await backfill(store, misses, gone, _read_only)
    assert report.recorded == 0 and len(report.problems) == 1
    assert "no-such-server" in report.problems[0] and "cannot be started" in report.problems[0]
    assert len(store.recordings()) == before
    store.close()


@pytest.mark.slow
async def test_a_read_only_store_keeps_its_misses_beside_it_and_an_older_one_has_none(tmp_path: Path) -> None:
    db = await _recorded(tmp_path)
    older = tmp_path / "older.db"
    with sqlite3.connect(db) as conn:  # a store from before the miss log: no misses table
        conn.execute("VACUUM INTO ?", (str(older),))
    with sqlite3.connect(older) as conn:
        conn.execute("DROP TABLE misses")
    store = Store(older, readonly=True)
    assert read_misses(store) == []  # nothing to backfill, no error
    replay = _replay(store)
    await _episode(replay, step("get", key="q"))
    assert replay.miss_log is not None and replay.miss_log.flush()
    assert replay.miss_log.path == side_file(older) and side_file(older).is_file()
    with Store(side_file(older), readonly=True) as side:
        assert [m.params for m in read_misses(side)] == [{"name": "get", "arguments": {"key": "q"}}]
    assert read_misses(store) == []  # the read-only store itself is untouched
    store.close()
    # Opened for writing, the older store gets the table (no schema version change).
    with Store(older) as upgraded:
        assert read_misses(upgraded) == []
        log = MissLog(upgraded)
        log.add("counter", "tools/call", "get", {"key": "r"}, prefix=[], status="miss", reason="none")
        assert log.flush()
        assert [m.name for m in read_misses(upgraded)] == ["get"]
        log.close()
