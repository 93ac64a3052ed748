"""The built wheel carries everything the demo needs: it runs outside the repository."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_installed_wheel_runs_the_demo_outside_the_repository(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT)]
    subprocess.run([*build, "-w", str(wheels)], check=True, capture_output=True)
    wheel = next(wheels.glob("replay_sim-*.whl"))

    # A fresh venv that sees the dependencies already installed here (torch alone is GBs), but not the
    # editable checkout: a .pth line adds a folder to sys.path without running that folder's .pth hooks.
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=True)
    python = fresh / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(pip, check=True, capture_output=True)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run(
        [python, "-c", "import replay_sim; print(replay_sim.__file__)"],
        cwd=elsewhere,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert where.startswith(str(fresh)), where
    demo = subprocess.run(
        [fresh / "bin" / "replay-sim", "demo", "--once", "--port", "0"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "-> exact" in demo.stdout
    assert "-> miss" in demo.stdout
    assert not (elsewhere / "cache").exists()  # the demo's store lives in a temporary folder
