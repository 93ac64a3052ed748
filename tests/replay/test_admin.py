"""The admin API next to the MCP endpoints: health, readiness, stats, misses, recordings, metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from replay_helpers import call_tools, make_replay

from replay_sim.listener import serving_in_thread
from replay_sim.replay.http.app import create_app
from replay_sim.resolve.resolution import Resolution, Tier


@pytest.fixture(scope="module")
def admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    replay = make_replay(tmp_path_factory.mktemp("admin") / "admin.db")
    with serving_in_thread(create_app(replay)) as url:
        call_tools(
            f"{url}/mcp/demo",
            [("echo", {"message": "hello"}), ("echo", {"message": "hello world"}), ("nosuch", {})],
        )
        yield url, replay


def _get(url: str) -> httpx2.Response:
    return httpx2.get(url, timeout=30)


def test_health_and_readiness_answer_once_the_endpoints_run(admin: tuple[str, Any]) -> None:
    assert _get(f"{admin[0]}/api/health").json() == {"status": "ok"}
    ready = _get(f"{admin[0]}/api/ready")
    assert ready.status_code == 200
    assert ready.json()["ready"] is True and ready.json()["servers"] == ["demo", "other"]


def test_stats_count_calls_per_server_tool_and_tier_with_latency_percentiles(admin: tuple[str, Any]) -> None:
    stats = _get(f"{admin[0]}/api/stats").json()
    rows = {(r["server"], r["tool"], r["tier"]): r for r in stats["calls"]}
    assert rows[("demo", "echo", "exact")]["count"] == 1
    assert rows[("demo", "echo", "miss")]["count"] == 1
    assert rows[("demo", "(unknown)", "refused")]["count"] == 1  # a tool nothing recorded
    exact = rows[("demo", "echo", "exact")]
    assert 0 <= exact["p50_ms"] <= exact["p90_ms"] <= exact["p99_ms"]
    assert sum(sum(b["tiers"].values()) for b in stats["timeline"]) == 3
    assert stats["miss_policy"] == "error"


def test_stats_show_each_tools_effect_and_its_evidence(admin: tuple[str, Any]) -> None:
    effects = _get(f"{admin[0]}/api/stats").json()["effects"]["demo"]
    assert effects["increment"]["effect"] == "changes"  # no annotation; the counter read after it changed
    assert effects["increment"]["reason"].startswith("counter before/after differed (recordings ")
    assert effects["echo"] == {**effects["echo"], "effect": "none", "source": "annotation"}


def test_misses_list_recent_misses_with_their_near_misses(admin: tuple[str, Any]) -> None:
    misses = _get(f"{admin[0]}/api/misses").json()
    assert [m["name"] for m in misses] == ["nosuch", "echo"]
    near = misses[1]["candidates"][0]
    assert near["recording"] == 1 and near["differences"][0]["requested"] == "hello world"
    assert _get(f"{admin[0]}/api/misses?server=other").json() == []


def test_recordings_can_be_browsed_filtered_and_opened(admin: tuple[str, Any]) -> None:
    echoes = _get(f"{admin[0]}/api/recordings?server=demo&name=echo").json()
    assert [(r["id"], r["outcome"]) for r in echoes] == [(1, "ok"), (2, "error")]
    page = _get(f"{admin[0]}/api/recordings?limit=2&after_id=2").json()
    assert [r["id"] for r in page] == [3, 4]
    full = _get(f"{admin[0]}/api/recordings/3").json()
    assert full["notifications"][0]["method"] == "notifications/progress"
    assert _get(f"{admin[0]}/api/recordings/999").status_code == 404


def test_prometheus_metrics_are_text_exposition_format(admin: tuple[str, Any]) -> None:
    response = _get(f"{admin[0]}/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    assert "# TYPE replay_sim_calls_total counter" in text
    assert 'replay_sim_calls_total{server="demo",method="tools/call",tool="echo",tier="exact"} 1' in text
    labels = 'server="demo",method="tools/call",tool="echo",tier="exact"'
    assert f'replay_sim_call_seconds_bucket{{{labels},le="+Inf"}} 1' in text


def test_openapi_documents_the_admin_api(admin: tuple[str, Any]) -> None:
    paths = _get(f"{admin[0]}/openapi.json").json()["paths"]
    assert {"/api/health", "/api/ready", "/api/stats", "/api/misses", "/api/recordings"} <= set(paths)
    assert _get(f"{admin[0]}/docs").status_code == 200


def test_an_episode_can_be_listed_and_reset(tmp_path: Path) -> None:
    replay = make_replay(tmp_path / "ep.db")
    replay.resolver.advance(replay.histories.trail("demo", "ep-1"), Resolution(Tier.MISS, 0.0, step="k"))
    with serving_in_thread(create_app(replay)) as url:
        [listed] = _get(f"{url}/api/episodes").json()
        assert listed["id"] == "ep-1" and listed["urls"]["demo"] == f"{url}/episodes/ep-1/mcp/demo"
        ended = httpx2.delete(f"{url}/api/episodes/ep-1").json()
        assert ended["id"] == "ep-1" and ended["ended"] is True
        assert _get(f"{url}/api/episodes").json() == []
        assert httpx2.delete(f"{url}/api/episodes/ep-1").status_code == 404
