"""The coverage view (``/api/coverage``): recorded calls and hit rates per tool, and the kept misses
with their nearest recordings and whether backfill can take them (a live replay server over HTTP)."""

from __future__ import annotations

from pathlib import Path

import httpx2
from replay_helpers import call_tools, make_replay

from replay_sim.listener import serving_in_thread
from replay_sim.replay.http.app import create_app


def test_coverage_shows_each_tools_hit_rate_and_the_most_missed_calls_with_what_backfill_needs(
    tmp_path: Path,
) -> None:
    replay = make_replay(tmp_path / "cov.db")
    with serving_in_thread(create_app(replay)) as url:
        call_tools(f"{url}/mcp/demo", [("echo", {"message": "hello"}), ("echo", {"message": "bye"})])
        call_tools(f"{url}/mcp/demo", [("echo", {"message": "bye"})])
        call_tools(f"{url}/mcp/demo", [("increment", {}), ("echo", {"message": "after"})])
        assert replay.miss_log.flush()
        view = httpx2.get(f"{url}/api/coverage", timeout=30).json()
    echo = next(t for t in view["tools"] if (t["server"], t["tool"]) == ("demo", "echo"))
    assert echo["tiers"] == {"exact": 1, "miss": 3} and echo["hit_rate"] == 0.25
    assert echo["recorded"] >= 1 and echo["kept_misses"] == 3
    missed = {m["params"]["arguments"]["message"]: m for m in view["misses"]}
    assert missed["bye"]["count"] == 2 and view["misses"][0] is not None
    assert view["misses"][0]["params"]["arguments"]["message"] == "bye"  # most missed first
    assert missed["bye"]["backfill"] == {"can": True, "needs": None}  # at the initial state
    assert missed["bye"]["candidates"][0]["recording"] is not None  # its nearest recording
    assert missed["after"]["prefix"] == 1
    assert missed["after"]["backfill"] == {
        "can": True,
        "needs": "the upstream's reset command (1 state-changing call first)",
    }
    assert view["miss_log"] == str(tmp_path / "cov.db")
