"""The README's walkthrough, step 1, run as written: the recorder started in the background, waited
for by its ``listening on`` line (issue 20, item 8), then called, stopped and its session listed."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSPECTOR = ROOT / "fixtures/node_modules/.bin/mcp-inspector"


def _step_one() -> str:
    """The walkthrough's shell lines from "# 1. Record" to the blank line before step 2."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Five-minute walkthrough", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block is not None
    lines = block.group(1).split("# 1. Record", 1)[1].split("\n\n", 1)[0]
    return "# 1. Record" + lines


@pytest.mark.slow
@pytest.mark.skipif(
    not INSPECTOR.exists()
    or shutil.which("node") is None
    or not (Path(sys.executable).parent / "mcp-server-time").exists(),
    reason="MCP Inspector or mcp-server-time not installed (make install)",
)
def test_the_walkthroughs_recording_step_waits_for_the_recorder_and_records_the_call(tmp_path: Path) -> None:
    with socket.socket() as sock:  # the walkthrough's port may be taken on a shared machine
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    script = "set -e\n" + f'INSPECT="{INSPECTOR} --cli"\n' + _step_one().replace("8766", port)
    (tmp_path / "cache").mkdir()
    env = os.environ | {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "NO_COLOR": "1",
    }
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=280
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert '\\"timezone\\": \\"Asia/Tokyo\\"' in done.stdout  # the real server's answer, through the recorder
    assert re.search(
        r"^listening on http://127\.0\.0\.1:" + port + "$", (tmp_path / "rec.out").read_text(), re.M
    )
    assert (
        "convert_time" in done.stdout.split("}\n", 1)[-1]
    )  # `replay-sim sessions` and `stats` list the call
