"""Helpers for the sandbox instance tests: recorder configs of real servers as sandboxes, answers as text."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from recording_helpers import NODE_BIN, PYTHON, ROOT

from replay_sim.record.config import RecorderConfig
from replay_sim.record.config_file import parse_config

COUNTER = [PYTHON, str(ROOT / "fixtures" / "counter_server.py")]
ECHO = [PYTHON, str(ROOT / "fixtures" / "echo_server.py")]
HANG = [PYTHON, str(ROOT / "fixtures" / "hang_server.py")]
MEMORY = str(NODE_BIN / "mcp-server-memory")
FILESYSTEM = str(NODE_BIN / "mcp-server-filesystem")


def sandboxes(**servers: dict[str, Any]) -> RecorderConfig:
    """A recorder config whose servers (``name={"command": [...], ...}``) are all sandboxes."""
    table = {}
    for name, entry in servers.items():
        command, *args = entry.pop("command")
        table[name] = {"command": command, "args": args, "sandbox": True, **entry}
    return parse_config({"servers": table})


def memory(pristine: Path, **entry: Any) -> dict[str, Any]:
    """A ``sandboxes`` entry: server-memory, its graph in a copy of ``pristine`` (made if missing)."""
    pristine.mkdir(parents=True, exist_ok=True)
    return {
        "command": [MEMORY],
        "env": {"MEMORY_FILE_PATH": "{state}/memory.jsonl"},
        "state": str(pristine),
        **entry,
    }


def text(answer: dict[str, Any]) -> str:
    """The text of a tool call's answer (an instance's forward dict)."""
    assert answer["error"] is None, answer
    return "".join(part.get("text", "") for part in answer["result"]["content"])


def tool(name: str, /, **arguments: Any) -> tuple[str, dict[str, Any]]:
    """``(method, params)`` of a ``tools/call``."""
    return "tools/call", {"name": name, "arguments": arguments}


async def until(condition: Callable[[], bool], timeout: float = 30) -> None:
    """Wait until ``condition()`` holds, checking it every 50 ms; fail after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.05)


def thread_niceness(pid: int) -> set[int]:
    """The ``nice`` values of process ``pid``'s threads (``/proc/PID/task/TID/stat``, field 19)."""
    tasks = Path(f"/proc/{pid}/task")
    return {
        int((tasks / tid / "stat").read_text().rpartition(")")[2].split()[16]) for tid in os.listdir(tasks)
    }
