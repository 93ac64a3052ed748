"""The built wheel installs and starts with only its declared dependencies, outside the repository.

The venv is isolated: no system site packages, nothing of the dev venv, no ``PYTHONPATH``. Its
dependencies are installed by pip from the wheel's metadata, as a user's ``pip install`` does (torch
2.13.0 first, as ``make install`` does, so pip takes the CPU build), once for this module; pip's
cache keeps a rerun cheap, and ``--no-compile`` skips writing bytecode for torch's many files.
``tests/test_dependencies.py`` catches an undeclared import in seconds; this proves the install.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"
INSTALL_TIMEOUT = 1200  # seconds: torch and the model stack, from pip's cache or an index

pytestmark = [pytest.mark.slow, pytest.mark.timeout(INSTALL_TIMEOUT + 600)]  # the install is in setup


def _isolated_env() -> dict[str, str]:
    """The environment without what would show the fresh venv this checkout or the dev venv."""
    hidden = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PYTHONUSERBASE"}
    return {k: v for k, v in os.environ.items() if k not in hidden} | {"PYTHONNOUSERSITE": "1"}


def _run(command: list[str | Path], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=cwd, env=_isolated_env(), capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv holding the built wheel and the dependencies its metadata declares, nothing else."""
    folder = tmp_path_factory.mktemp("wheel")
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT)]
    subprocess.run([*build, "-w", str(folder / "dist")], check=True, capture_output=True)
    (wheel,) = (folder / "dist").glob("replay_sim-*.whl")
    fresh = folder / "venv"
    venv.create(fresh, with_pip=True, system_site_packages=False)
    python = fresh / "bin" / "python"
    pip = [python, "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check"]
    for target in (TORCH, str(wheel)):
        done = _run([*pip, target], folder, INSTALL_TIMEOUT)
        assert done.returncode == 0, f"pip install {target}:\n{done.stderr[-3000:]}"
    yield fresh


def test_the_installed_wheel_imports_from_its_own_venv_with_only_declared_dependencies(
    installed: Path, tmp_path: Path
) -> None:
    python = installed / "bin" / "python"
    probe = (
        "import json, sys, replay_sim, replay_sim.cli, replay_sim.replay.http.app, "
        "replay_sim.record.recorder; "
        "print(json.dumps([replay_sim.__file__, [p for p in sys.path "
        "if p and not p.startswith(sys.base_prefix) and not p.startswith(sys.prefix)]]))"
    )
    done = _run([python, "-c", probe], tmp_path, 240)
    assert done.returncode == 0, done.stderr[-3000:]  # e.g. ModuleNotFoundError: No module named 'sniffio'
    where, elsewhere = json.loads(done.stdout)
    assert where.startswith(str(installed)), where
    assert elsewhere == []  # nothing of another environment or this checkout on its path
    listed = _run([python, "-m", "pip", "list", "--format=freeze"], tmp_path, 120).stdout
    assert "openai" not in listed.lower()  # what brought sniffio to the dev venv is not here
    # The package data it reads at run time came with it: the confidence model's population.
    rows = "from replay_sim.resolve.confidence.population import rows; print(len(rows()))"
    done = _run([python, "-c", rows], tmp_path, 120)
    assert done.returncode == 0 and int(done.stdout) > 0, done.stdout + done.stderr[-3000:]


def test_the_installed_wheel_runs_the_demo_outside_the_repository(installed: Path, tmp_path: Path) -> None:
    demo = _run([installed / "bin" / "replay-sim", "demo", "--once", "--port", "0"], tmp_path, 300)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "-> exact" in demo.stdout
    assert "-> miss" in demo.stdout
    assert not (tmp_path / "cache").exists()  # the demo's store lives in a temporary folder
