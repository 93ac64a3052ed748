"""Helpers for the sandbox tests: real recordings of real fixture servers, a recorder config
declaring them sandboxes, and the record side's real instance pool."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from recording_helpers import PYTHON, ROOT, Script, proxy_stdio, run_script

import replay_sim
from replay_sim.record.config_file import load_config
from replay_sim.record.instances.building import sandbox_pool
from replay_sim.replay.http.serving import ReplayServer

COUNTER_SERVER = ROOT / "fixtures" / "counter_server.py"
ECHO_SERVER = ROOT / "fixtures" / "echo_server.py"
DOCUMENT_SERVER = ROOT / "fixtures" / "document_server.py"
HANG_SERVER = ROOT / "fixtures" / "hang_server.py"
SERVERS = {"counter": COUNTER_SERVER, "echo": ECHO_SERVER, "hang": HANG_SERVER}
FIXTURES = {**SERVERS, "document": DOCUMENT_SERVER}
"""Every fixture server :func:`record` can record (``write_config`` declares ``SERVERS`` by default)."""


def text(result: Any) -> str:
    """The first text content of a ``CallToolResult``."""
    return str(result.content[0].text)


def match(result: Any) -> dict[str, Any]:
    """The ``_meta["replay-sim/match"]`` record of a ``CallToolResult``."""
    return dict((result.meta or {})[replay_sim.MATCH_META_KEY])


async def record(db: Path, server: str, script: Script, env: dict[str, str] | None = None) -> None:
    """Record one session of a fixture server through the real recorder CLI (``env``: the server's)."""
    options = [f"--env={name}={value}" for name, value in (env or {}).items()]
    target = proxy_stdio(db, server, [PYTHON, FIXTURES[server]], *options)
    target.env = dict(
        os.environ
    )  # this checkout's replay_sim (PYTHONPATH), not only the SDK's safe variables
    await run_script(target, script)


def write_config(
    path: Path,
    env: dict[str, dict[str, str]] | None = None,
    own_miss: tuple[str, ...] = (),
    servers: tuple[str, ...] = tuple(SERVERS),
) -> Path:
    """A recorder config declaring fixture servers sandboxes (in-process state: a fresh process).

    ``own_miss``: the servers whose table says ``miss = "sandbox"``; ``servers``: which (default:
    the counter and echo servers).
    """
    lines = []
    for name, script in ((n, FIXTURES[n]) for n in servers):
        lines += [
            f"[servers.{name}]",
            f"command = {json.dumps(PYTHON)}",
            f"args = [{json.dumps(str(script))}]",
        ]
        if env and name in env:
            pairs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env[name].items())
            lines.append(f"env = {{ {pairs} }}")
        lines += ["sandbox = true", *(['miss = "sandbox"'] if name in own_miss else []), ""]
    path.write_text("\n".join(lines))
    return path


@asynccontextmanager
async def sandboxed(db: Path, config: Path, tmp: Path, **options: Any) -> AsyncIterator[ReplayServer]:
    """Serve ``db`` over HTTP with ``--miss sandbox`` and the record side's pool (no warm instances)."""
    pool = sandbox_pool(load_config(config), pool=0, max_instances=options.pop("max_instances", 8))
    if "snapshot" not in options:  # a snapshot is served with its own index, and no other
        options["index_dir"] = tmp / "index"
    async with replay_sim.serving(db=db, miss="sandbox", sandboxes=pool, **options) as sim:
        yield sim


async def until(condition: Any, timeout: float = 30) -> None:
    """Wait until ``condition()`` holds, with a deadline (polled: the pool has no event to wait on)."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)


def live_instances(sim: ReplayServer, server: str) -> int:
    """Instances of ``server`` the pool holds live now."""
    stats = sim.replay.policy.stats()["pool"]  # type: ignore[attr-defined]
    return int(stats.get(server, {}).get("live", 0))
