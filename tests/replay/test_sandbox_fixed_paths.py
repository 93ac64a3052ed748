"""A sandbox whose state is a path only its recorded calls name, under ``/tmp``: no config beyond its command.

PyPI ``mcp-server-git`` is started with no ``--repository``: each call names the repository by
``repo_path``, a fixed path under ``/tmp``. Confined instances get a fresh ``/tmp``, so the
repository is shown to each copy-on-write because the recordings name it, and handed to the
instance's uid so that it can stage files there as the recorded server did.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import pytest
from mcp import Client
from recording_helpers import BIN, proxy_stdio, raw_client, raw_request, step
from sandbox_helpers import match, text

import replay_sim
from replay_sim.record.config import RecorderConfig, UpstreamSpec
from replay_sim.record.instances.building import sandbox_pool

pytestmark = pytest.mark.anyio

GIT_SERVER = str(BIN / "mcp-server-git")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


async def _record(db: Path, repo: Path) -> None:
    calls = [
        step("git_status", repo_path=str(repo)),
        step("git_add", repo_path=str(repo), files=["notes.txt"]),
    ]
    with anyio.fail_after(60):
        async with raw_client(proxy_stdio(db, "git", [GIT_SERVER])) as client:
            for method, params in calls:
                await raw_request(client, method, params)


async def test_a_repository_named_only_by_recorded_calls_is_each_instances_own(tmp_path: Path) -> None:
    repo = tmp_path / "repo"  # under /tmp: private to every confined instance
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(
        repo,
        "-c",
        "user.name=R",
        "-c",
        "user.email=r@example.invalid",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "0",
    )
    (repo / "notes.txt").write_text("notes\n")
    db = tmp_path / "store" / "replay.db"
    db.parent.mkdir()
    await _record(db, repo)
    _git(repo, "reset", "-q")  # back to the state the recording started from
    config = RecorderConfig({"git": UpstreamSpec(command=GIT_SERVER, sandbox=True)})  # nothing more
    where = {"repo_path": str(repo)}
    pool = sandbox_pool(config, pool=0, store=db)
    with anyio.fail_after(120):
        async with (
            replay_sim.serving(db=db, miss="sandbox", sandboxes=pool, index_dir=tmp_path / "index") as sim,
            Client(sim.episode("one").url("git")) as client,
        ):
            added = await client.call_tool("git_add", {**where, "files": ["notes.txt"]})
            assert match(added)["status"] == "exact"
            staged = await client.call_tool("git_diff_staged", where)  # never recorded
            assert match(staged)["status"] == "sandbox", text(staged)
            assert match(staged)["sandbox"]["replayed"] == 1
            assert "+notes" in text(staged) and "notes.txt" in text(staged)
    assert _git(repo, "diff", "--staged") == ""  # the host's repository never saw the instance's add
