"""The dashboard, rendered by headless Chromium against a live replay server."""

from __future__ import annotations

import anyio
import pytest
from recording_helpers import PYTHON, ROOT, proxy_stdio, run_script, step
from replay_helpers import CHROMIUM, call_tools, make_replay, render_dashboard

from replay_sim.listener import serving_in_thread
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.http.app import create_app
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_the_dashboard_shows_tiers_per_tool_and_recent_misses_with_diagnostics(tmp_path_factory) -> None:
    replay = make_replay(tmp_path_factory.mktemp("dash") / "dash.db")
    with serving_in_thread(create_app(replay)) as url:
        call_tools(f"{url}/mcp/demo", [("echo", {"message": "hello"}), ("echo", {"message": "hello world"})])
        assert replay.miss_log.flush()
        done = render_dashboard(url)
    dom = done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'data-ready="1"' in dom, dom[:2000]
    assert '<tr data-tool="echo" data-tier="exact">' in dom
    assert '<tr data-tool="echo" data-tier="miss">' in dom
    assert "<rect" in dom and 'data-tier="exact"' in dom  # the timeline drew bars
    assert '<li class="miss" data-tool="echo">' in dom
    assert '<tr data-tool="increment" data-effect="changes">' in dom  # each tool's effect, with why
    assert "counter before/after differed" in dom
    assert 'message: recorded "hello", requested "hello world"' in dom
    assert '<li class="miss" data-tool="echo" data-backfill="yes">' in dom  # coverage: a kept miss
    assert "backfill: can take it" in dom and "50.0 %" in dom  # echo: one of two answered


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_the_dashboard_shows_a_sql_tools_effect_per_kind_of_statement_with_its_witnesses(tmp_path) -> None:
    db = tmp_path / "r.db"
    sqls = ["SELECT name FROM notes", "SELECT count(*) FROM notes"] * 2 + [
        "INSERT INTO notes VALUES ('y', 2)"
    ]
    script = [step("query", sql=s) for s in [*sqls, "SELECT name FROM notes"]]
    anyio.run(run_script, proxy_stdio(db, "notes", [PYTHON, ROOT / "fixtures" / "notes_server.py"]), script)
    with Store(db) as store:
        replay = Replay(store, resolver=Resolver(store, index_dir=None))
        with serving_in_thread(create_app(replay)) as url:
            done = render_dashboard(url)
    dom = done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    assert '<tr data-tool="query" data-effect="changes">' in dom
    assert '<tr data-tool="query" data-effect="none" data-kind="select">' in dom
    assert '<tr data-tool="query" data-effect="changes" data-kind="insert">' in dom
    assert "query [select]" in dom and "2 reads unchanged" in dom and "witnesses 1/3, 2/4" in dom
