"""``replay-sim demo``: the shipped recordings replayed with an exact hit, a semantic hit and a miss."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from replay_sim.cli.demo import DEMO_FIXTURES, import_demo
from replay_sim.replay.core.replay import Replay
from replay_sim.resolve.resolver import Resolver


def test_the_demo_fixtures_hold_a_real_recorded_session(tmp_path: Path) -> None:
    store = import_demo(tmp_path / "demo.db", DEMO_FIXTURES)
    assert [s.name for s in store.servers()] == ["memory"]
    assert "tools/list" in store.listings("memory")
    assert len(store.recordings("memory")) >= 10


def test_the_shipped_demo_starts_without_a_warning(tmp_path: Path) -> None:
    store = import_demo(tmp_path / "demo.db", DEMO_FIXTURES)
    # server-memory advertises resources: what it listed is recorded, so nothing is missing.
    assert Replay(store, resolver=Resolver(store, index_dir=None)).check(False) == []
    assert store.listings("memory")["resources/list"]["resources"][0]["uri"] == "memory://knowledge-graph"


def test_demo_once_shows_an_exact_hit_a_semantic_hit_and_a_diagnosed_miss(tmp_path: Path) -> None:
    command = [str(Path(sys.executable).parent / "replay-sim"), "demo", "--once", "--port", "0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warning" not in done.stderr, done.stderr
    out = done.stdout
    assert 'search_nodes {"query": "Ada Lovelace"} -> exact' in out
    assert 'search_nodes {"query": "ada lovelace"} -> semantic' in out
    assert "differs in query: recorded 'Ada Lovelace', requested 'ada lovelace'" in out
    assert 'search_nodes {"query": "quantum chromodynamics"} -> miss' in out
    assert "Nearest: recording #" in out and "requested 'quantum chromodynamics'" in out
