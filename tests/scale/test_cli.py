"""``replay-sim serve --ray``'s refusals (before Ray starts), and plain ``serve`` staying free of Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay_sim.cli import cli
from replay_sim.replay.options import Limits

REPLAY_SIM = str(Path(sys.executable).parent / "replay-sim")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([REPLAY_SIM, *args], capture_output=True, text=True, timeout=120)


def test_serve_ray_needs_a_snapshot_and_consistent_autoscaling_bounds(tmp_path: Path) -> None:
    no_snapshot = _run("serve", "--ray")
    assert no_snapshot.returncode == 2 and "--ray serves a frozen snapshot" in no_snapshot.stderr
    bounds = _run(
        "serve", "--ray", "--snapshot", str(tmp_path), "--replicas", "2", "--autoscale-min", "3",
        "--autoscale-max", "4",
    )  # fmt: skip
    assert bounds.returncode != 0
    assert bounds.stderr.strip().splitlines()[-1].endswith("got 3 <= 2 <= 4")
    assert "Traceback" not in bounds.stderr


def test_plain_serve_never_imports_ray() -> None:
    probe = "import sys, replay_sim, replay_sim.cli, replay_sim.cli.serve; print('ray' in sys.modules)"
    answer = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert answer.stdout.strip() == "False", answer.stderr


def test_serve_ray_gives_each_replica_every_limit_of_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replay_sim.scale import deploy

    given: list[deploy.ScaleSettings] = []
    monkeypatch.setattr(deploy, "run", lambda settings, **_: given.append(settings))  # Ray itself not run
    limits = [
        "--max-episodes", "7", "--episode-idle-timeout", "9", "--episode-rate", "3", "--episode-burst", "4",
        "--max-concurrent", "5", "--admission-wait", "2", "--max-sessions", "6",
    ]  # fmt: skip
    result = CliRunner().invoke(cli, ["serve", "--ray", "--snapshot", str(tmp_path), *limits])
    assert result.exit_code == 0, result.output
    (settings,) = given
    assert settings.limits == Limits(
        max_episodes=7, episode_idle_timeout=9, episode_rate=3, episode_burst=4, max_concurrent=5,
        admission_wait=2, max_sessions=6,
    )  # fmt: skip
