"""Schemathesis against the admin API's own OpenAPI spec: no generated request gets a 5xx.

The replay is served in-process on 127.0.0.1 (the admin API checks the Host header, so every
request goes to the loopback URL the server was bound to).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from replay_helpers import call_tools, make_replay

from replay_sim.listener import serving_in_thread
from replay_sim.replay.http.app import create_app


@pytest.fixture(scope="module")
def admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    replay = make_replay(tmp_path_factory.mktemp("fuzz") / "fuzz.db")
    with serving_in_thread(create_app(replay)) as url:
        # Some traffic first, so stats, misses and episodes have rows to page through.
        call_tools(f"{url}/mcp/demo", [("echo", {"message": "hello"}), ("nosuch", {})])
        yield url


def test_no_admin_operation_answers_5xx(admin_url: str) -> None:
    # The schemathesis pytest plugin (from_fixture) does not run under this pytest, so each
    # operation's hypothesis strategy is driven directly: same generation, same check.
    schema = schemathesis.openapi.from_url(f"{admin_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    sent: list[int] = []
    for operation in operations:

        @settings(
            max_examples=30,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        )
        @given(operation.as_strategy())
        def fuzz(case: Any) -> None:
            response = case.call(base_url=admin_url, timeout=30)
            sent.append(response.status_code)
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}"
            )

        fuzz()
    assert len(sent) >= 2 * len(operations)  # requests really went out for every operation
