"""No instance process outlives the replay that started it, even when that replay is killed outright."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import pytest
from instances_helpers import MEMORY, until
from recording_helpers import PYTHON, spawn

from replay_sim.record.config_file import parse_config
from replay_sim.record.instances import InstancePool
from replay_sim.record.instances.workspace import Launcher

pytestmark = pytest.mark.anyio

# A replay stand-in: a pool of two warm memory instances, each of whose servers has started a
# child of its own (a `sleep`), reports their process groups and waits to be killed.
HOLDER = """
import sys, anyio
from replay_sim.record.config_file import parse_config
from replay_sim.record.instances import InstancePool

server = {"command": "sh", "args": ["-c", 'sleep 1000 & exec "$0"', sys.argv[1]], "sandbox": True,
          "env": {"MEMORY_FILE_PATH": "{state}/m.jsonl"}, "state": sys.argv[2]}

async def main():
    async with InstancePool(parse_config({"servers": {"memory": server}}), pool=2, base=sys.argv[3]) as pool:
        while pool.stats()["memory"]["warm"] < 2:
            await anyio.sleep(0.05)
        print("groups", *pool.stats()["memory"]["pids"].values(), flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


def _running(groups: set[int]) -> list[str]:
    """The processes (not yet reaped zombies excepted) in any of ``groups``: ``pid command``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if entry.name.isdigit() and int(fields[2]) in groups and fields[0] != b"Z":
            found.append(f"{entry.name} {stat[: stat.rfind(b')') + 1].decode()}")
    return found


@pytest.mark.skipif(
    sys.platform != "linux" or not Launcher.detect().parent_death, reason="needs setpriv (Linux)"
)
async def test_a_killed_pool_holder_leaves_no_instance_process_or_child_and_its_state_is_swept_later(
    tmp_path: Path,
) -> None:
    (tmp_path / "pristine").mkdir()
    base = tmp_path / "instances"
    with anyio.fail_after(90):
        async with spawn(PYTHON, "-c", HOLDER, MEMORY, str(tmp_path / "pristine"), str(base)) as holder:
            groups = {int(g) for g in (await holder.wait_for(r"^groups (.*)", timeout=60)).group(1).split()}
            assert len(groups) == 2
            assert len(_running(groups)) >= 4  # each: its launcher, the server, the server's own child
            os.kill(holder.process.pid, signal.SIGKILL)
            await until(lambda: not _running(groups), timeout=30)
    assert len(list(base.iterdir())) == 2  # the instances' copies: a killed replay could not delete them
    async with InstancePool(parse_config({"servers": {"other": {"command": "true"}}}), pool=0, base=base):
        assert list(base.iterdir()) == []  # the next pool there deletes what a dead replay left
