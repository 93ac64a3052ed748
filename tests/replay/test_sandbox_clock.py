"""Sandboxes on a pinned clock: a real git server's re-played commits hash as they were recorded.

PyPI ``mcp-server-git`` is recorded by the real recorder making a commit (whose hash depends on the
second it was made) and reading the log; the replay is served over real HTTP with ``--miss sandbox``
and the record side's real, confined pool started from the store (so instances run on the
recordings' clock). Episodes that re-play the commit and then do something new are answered.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from recording_helpers import BIN, Script, proxy_stdio, raw_client, raw_request, step
from sandbox_helpers import match, text

import replay_sim
from replay_sim.record.config_file import load_config
from replay_sim.record.instances.building import sandbox_pool
from replay_sim.replay.http.serving import ReplayServer
from replay_sim.store import Origin, Store

pytestmark = pytest.mark.anyio

GIT_SERVER = str(BIN / "mcp-server-git")
_HASH = re.compile(r"hash ([0-9a-f]{40})")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A fresh repo (one commit, untracked ``notes.txt`` and ``todo.txt``), a recorded session
    committing the notes and reading the log, the repo put back as it was; ``(store, repo, config)``."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.name", "Replay Sim")
    _git(repo, "config", "user.email", "replay-sim@example.invalid")
    (repo / "README").write_text("a repo\n")
    _git(repo, "add", "README")
    _git(repo, "commit", "-q", "-m", "first")
    (repo / "notes.txt").write_text("notes\n")
    (repo / "todo.txt").write_text("todo\n")
    pristine = Path(shutil.copytree(repo, tmp_path / "pristine", symlinks=True))
    db = tmp_path / "store" / "replay.db"  # its directory is hidden from instances; the repo is not in it
    db.parent.mkdir()
    script = [
        step("git_add", repo_path=str(repo), files=["notes.txt"]),
        step("git_commit", repo_path=str(repo), message="add notes"),
        step("git_log", repo_path=str(repo), max_count=2),
    ]
    anyio.run(_record, proxy_stdio(db, "git", [GIT_SERVER, "--repository", repo]), script)
    shutil.rmtree(repo)  # the sandboxes start from the state the recording started from
    shutil.copytree(pristine, repo, symlinks=True)
    config = tmp_path / "recorder.toml"
    config.write_text(
        f"[servers.git]\ncommand = {json.dumps(GIT_SERVER)}\n"
        f'args = ["--repository", {json.dumps(str(repo))}]\nsandbox = true\n'  # nothing more
    )
    return db, repo, config


async def _record(target: Any, script: Script) -> None:
    """Run ``script``, its commit sent early in a second of the real clock.

    A re-play sends each call at the time it was sent when recorded; a server stamping whole
    seconds stamps the same one if it reads its clock within the same second after the call
    arrives. Sent early in a second, the recorded commit leaves it most of a second to do so.
    """
    with anyio.fail_after(60):
        async with raw_client(target) as client:
            for method, params in script:
                if params["name"] == "git_commit":
                    with anyio.fail_after(3):
                        while time.time() % 1 > 0.2:
                            await anyio.sleep(0.01)
                await raw_request(client, method, params)


@asynccontextmanager
async def served(db: Path, config: Path, tmp: Path) -> AsyncIterator[ReplayServer]:
    """``db`` served with ``--miss sandbox``; its pool's clocks start from the store, as the CLI's do."""
    pool = sandbox_pool(load_config(config), pool=0, max_instances=4, store=db)
    async with replay_sim.serving(db=db, miss="sandbox", sandboxes=pool, index_dir=tmp / "index") as sim:
        yield sim


async def test_an_episode_re_playing_a_recorded_commit_then_doing_something_new_is_answered(
    recorded: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    db, repo, config = recorded
    with Store(db) as store:
        committed = next(r for r in store.recordings() if r.name == "git_commit")
    recorded_hash = _HASH.findall(json.dumps(committed.result))[0]
    where = {"repo_path": str(repo)}
    async with served(db, config, tmp_path) as sim:
        async with Client(sim.episode("one").url("git")) as client:
            await client.call_tool("git_add", {**where, "files": ["notes.txt"]})
            commit = await client.call_tool("git_commit", {**where, "message": "add notes"})
            assert match(commit)["status"] == "exact" and recorded_hash in text(commit)
            # Never recorded: the episode's instance re-plays the add and the commit (on the
            # recordings' clock: the same hash), then shows HEAD.
            shown = await client.call_tool("git_show", {**where, "revision": "HEAD"})
            assert match(shown)["status"] == "sandbox", text(shown)
            assert match(shown)["sandbox"]["replayed"] == 2
            assert f"commit {recorded_hash}" in text(shown) and "add notes" in text(shown)
            await client.call_tool("git_add", {**where, "files": ["todo.txt"]})
            again = await client.call_tool("git_commit", {**where, "message": "again"})
            assert match(again)["status"] == "sandbox" and _HASH.search(text(again)), text(again)
            new_hash = _HASH.findall(text(again))[0]
            log = await client.call_tool("git_log", {**where, "max_count": 3})
            assert match(log)["status"] == "sandbox"
            assert text(log).index(new_hash) < text(log).index(recorded_hash)

        # A second episode making the same calls and one more: the commit the first episode's
        # instance made is re-played (at the time it was made) and hashes the same.
        async with Client(sim.episode("two").url("git")) as client:
            await client.call_tool("git_add", {**where, "files": ["notes.txt"]})
            await client.call_tool("git_commit", {**where, "message": "add notes"})
            await client.call_tool("git_show", {**where, "revision": "HEAD"})
            await client.call_tool("git_add", {**where, "files": ["todo.txt"]})
            same = await client.call_tool("git_commit", {**where, "message": "again"})
            assert match(same)["status"] == "exact" and new_hash in text(same)
            branches = await client.call_tool("git_log", {**where, "max_count": 1})
            assert match(branches)["status"] == "sandbox", text(branches)
            assert match(branches)["sandbox"]["replayed"] >= 4
            assert new_hash in text(branches)
    with Store(db) as store:
        assert any(r.origin == Origin.SANDBOX and r.name == "git_log" for r in store.recordings())
