"""LangChain's MCP adapters (``langchain-mcp-adapters``): load an episode's tools, invoke them.

The adapters require the MCP SDK 1.x (``mcp<2``) and the project pins 2.x, so they cannot share
its environment: the test builds their own venv, ``tests/clients/.venv``, from the fully pinned
``requirements-langchain.txt`` (once; rebuilt when the list changes) and runs
``langchain_rollouts.py`` there as a subprocess against the replay served here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from clients_helpers import ANSWERS, STEPS, answered_alone

from replay_sim import ReplayServer

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv"  # git-ignored
REQUIREMENTS = HERE / "requirements-langchain.txt"


def langchain_python() -> Path:
    """The Python of the LangChain venv, (re)built when ``requirements-langchain.txt`` changed."""
    stamp = VENV / "requirements.sha256"
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if not (stamp.exists() and stamp.read_text() == wanted):
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(VENV / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "--no-deps", "-r", str(REQUIREMENTS)], check=True, timeout=900)
        stamp.write_text(wanted)
    return VENV / "bin" / "python"


@pytest.mark.slow
def test_langchain_tools_on_two_episode_urls_each_get_their_own_history(sim: ReplayServer) -> None:
    python = langchain_python()
    a, b = sim.episode(), sim.episode()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    ran = subprocess.run(
        [str(python), str(HERE / "langchain_rollouts.py"), a.url("demo"), b.url("demo"), json.dumps(STEPS)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    said = json.loads(ran.stdout.strip().splitlines()[-1])
    assert {"counter", "increment", "echo"} <= set(said["tools"])
    assert said["answers"] == ANSWERS
    assert answered_alone(a, b)
