"""Conformance through replay: the official MCP suite, run through the recorder and then against the replay.

One module-scoped run (``fixtures/conformance_replay.py``): the fixture server on 127.0.0.1, the
real ``replay-sim record --http`` CLI in front of it while the whole suite runs against the proxy,
then the real ``replay-sim serve`` over the recorded store while the suite runs again. Each test
states one promise about that run against ``fixtures/conformance-baseline.json`` (what passes
live).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
SUITE = FIXTURES / "node_modules" / "@modelcontextprotocol" / "conformance"
LIVE_PASSING = set(json.loads((FIXTURES / "conformance-baseline.json").read_text())["passing"])

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not SUITE.is_dir() or shutil.which("npx") is None,
        reason="conformance suite not installed (npm ci --prefix fixtures)",
    ),
]


@pytest.fixture(scope="module")
def conformance() -> Iterator[Any]:
    """The ``fixtures/conformance_replay`` module (it imports its sibling ``conformance_baseline``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(FIXTURES))
        import conformance_replay

        yield conformance_replay


@pytest.fixture(scope="module")
def report(conformance: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The suite's checks through the proxy and against the replay (the suite runs twice, ~10 s)."""
    return conformance.record_and_replay(tmp_path_factory.mktemp("conformance"))


def test_every_baseline_scenario_passes_through_the_recording_proxy(report: Any) -> None:
    assert report.passing("proxy") == LIVE_PASSING


def test_every_baseline_scenario_passes_against_the_replay(report: Any) -> None:
    assert report.passing("replay") == LIVE_PASSING


def test_logging_and_progress_notifications_survive_recording_and_replay(report: Any) -> None:
    for phase in ("proxy", "replay"):
        assert {"tools-call-with-logging", "tools-call-with-progress"} <= report.passing(phase), phase


def test_server_to_client_requests_are_forwarded_and_asked_again(report: Any) -> None:
    asking = {
        "tools-call-sampling",
        "tools-call-elicitation",
        "elicitation-sep1034-defaults",
        "elicitation-sep1330-enums",
    }
    for phase in ("proxy", "replay"):
        assert asking <= report.passing(phase), phase


def test_the_replay_gives_the_suite_the_same_checks_as_the_proxy(report: Any, conformance: Any) -> None:
    assert set(report.replay) == set(report.proxy) >= LIVE_PASSING
    for scenario, checks in report.proxy.items():
        assert conformance.verdicts(report.replay[scenario]) == conformance.verdicts(checks), scenario


def test_every_replayed_answer_is_an_exact_hit(report: Any) -> None:
    tiers = {(c["method"], c["tool"]): c["tier"] for c in report.replayed_calls}
    assert ("tools/call", "test_tool_with_progress") in tiers
    assert set(tiers.values()) == {"exact"}


def test_the_run_meets_every_promise_of_the_replay_script(report: Any, conformance: Any) -> None:
    assert conformance.mismatches(report) == []
