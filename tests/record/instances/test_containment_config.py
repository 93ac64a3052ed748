"""A sandbox's containment keys are checked, the refusal to run unconfined is one line, and clocks start
where the recordings began."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from replay_sim.errors import ConfigError, SandboxUnavailable
from replay_sim.record.config_file import parse_config
from replay_sim.record.containment import Clock, Containment, Limits
from replay_sim.record.instances.clock import ClockFile, clock_env, clock_line, recordings_began
from replay_sim.record.instances.workspace import Launcher
from replay_sim.store import Store


def _spec(**entry: Any) -> Any:
    return parse_config({"servers": {"s": {"command": "srv", **entry}}}).servers["s"]


def test_a_sandbox_without_containment_keys_gets_the_defaults() -> None:
    assert _spec(sandbox=True).containment == Containment(False, Clock.RECORDED, Limits())


def test_containment_keys_set_network_clock_and_limits_in_their_units() -> None:
    spec = _spec(sandbox=True, network=True, clock="real", memory_mb=64, processes=16, answer_mb=0.5)
    assert (spec.containment.network, spec.containment.clock) == (True, Clock.REAL)
    limits = spec.containment.limits
    assert (limits.memory_bytes, limits.processes, limits.answer_bytes) == (64 << 20, 16, 1 << 19)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"network": True}, "'network' applies to a sandbox instance: add sandbox = true"),
        ({"sandbox": True, "network": "yes"}, "'network' must be true or false"),
        ({"sandbox": True, "clock": "fake"}, '\'clock\' must be "recorded" or "real"'),
        ({"sandbox": True, "memory_mb": 0}, "'memory_mb' must be a positive number"),
        ({"sandbox": True, "processes": True}, "'processes' must be a positive number"),
    ],
)
def test_a_wrong_containment_key_is_one_line_naming_it(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        _spec(**entry)


def test_where_confinement_is_refused_sandboxes_do_not_start_unless_opted_out() -> None:
    refused = Launcher("setpriv", "unshare", False, confinement_problem="cannot make mount namespaces")
    with pytest.raises(SandboxUnavailable) as caught:
        refused.require()
    said = str(caught.value)
    assert "\n" not in said and "cannot make mount namespaces" in said and "--unconfined-sandboxes" in said
    refused.opted_out(True).require()  # the explicit opt-out: no refusal
    assert not refused.opted_out(True).confined


def test_the_confinement_probe_passes_on_this_machine() -> None:
    assert Launcher.detect().confinement_problem is None  # CI runs as root, with namespaces and cgroups


def test_the_clock_file_holds_the_time_asked_in_seconds_since_the_epoch() -> None:
    assert clock_line(datetime(2025, 12, 31, tzinfo=UTC)) == "1767139200.000000\n"
    assert clock_line(datetime(2026, 1, 1, 0, 1, 0, 250000)) == "1767225660.250000\n"  # naive: UTC


def test_the_clock_follows_its_file_uncached_and_never_from_the_faketime_variable(tmp_path: Path) -> None:
    env = clock_env(tmp_path / "faketime")
    assert env["FAKETIME_TIMESTAMP_FILE"] == str(tmp_path / "faketime") and env["FAKETIME_NO_CACHE"] == "1"
    assert env["FAKETIME_FMT"] == "%s"  # epoch seconds: the same instant in any time zone
    assert "FAKETIME" not in env and env["FAKETIME_DONT_FAKE_MONOTONIC"] == "1"


def test_a_process_reads_each_time_its_clock_file_was_set_to_standing_still_in_any_time_zone(
    tmp_path: Path,
) -> None:
    began = datetime(2020, 1, 1, 0, 0, 0, 250000, tzinfo=UTC)
    clock = ClockFile(tmp_path / "faketime", began)
    # Two reads of the wall clock a monotonic 0.2 s apart (select: an event loop's wait), then one
    # after the file is set anew; Node's and asyncio's timers run on the monotonic clock, still real.
    script = (
        "import select, time; a = time.time(); select.select([], [], [], 0.2); b = time.time();"
        "print(repr(a), repr(b), flush=True); input(); print(repr(time.time()))"
    )
    env = {**os.environ, **clock_env(clock.path), "TZ": "America/New_York"}
    argv = [sys.executable, "-c", script]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True) as child:
        assert child.stdout is not None and child.stdin is not None
        first, still = (float(x) for x in child.stdout.readline().split())
        clock.set(datetime(2024, 6, 1, 12, 0, 0, 500000, tzinfo=UTC))  # read at its next clock read
        child.stdin.write("\n")
        child.stdin.close()
        second = float(child.stdout.readline())
    assert first == still == pytest.approx(began.timestamp(), abs=1e-6)  # it stood during the wait
    assert second == pytest.approx(datetime(2024, 6, 1, 12, 0, 0, 500000, tzinfo=UTC).timestamp(), abs=1e-6)
    assert clock.now() == datetime(2024, 6, 1, 12, 0, 0, 500000, tzinfo=UTC)


def test_recordings_began_is_the_first_recorded_call_of_a_session_or_a_server(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        for session, at in (("a", "2024-03-01T10:00:05+00:00"), ("b", "2024-02-01T09:00:00+00:00")):
            store.start_session("git", session, at)
            for second in ("05", "09"):
                store.record_call(
                    "git", "tools/call", {"name": "git_log", "arguments": {}}, result={"content": []},
                    session=session, recorded_at=at[:17] + second + "+00:00",
                )  # fmt: skip
        assert recordings_began(store, session="b") == datetime(2024, 2, 1, 9, 0, 5, tzinfo=UTC)
        assert recordings_began(store, server="git") == datetime(2024, 3, 1, 10, 0, 5, tzinfo=UTC)
        assert recordings_began(store, server="none") is None


def test_a_directory_the_command_line_names_is_given_whole_but_not_a_system_or_huge_one(
    tmp_path: Path,
) -> None:
    from replay_sim.record.instances import planning

    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    (repo / "sub" / "file").write_text("x")
    huge = tmp_path / "huge"
    huge.mkdir()
    for n in range(planning._GIVEN_ENTRIES + 1):
        (huge / str(n)).touch()
    named = ["/usr/bin/git", "--repository", str(repo), str(huge), "/usr/share", "/srv", "relative"]
    assert planning._given(named) == [str(repo)]
