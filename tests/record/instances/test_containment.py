"""A hostile server run as a sandbox with the default containment: every attempt is contained.

Each test starts the real pool with two sandboxes — ``fixtures/hostile_server.py`` (small limits
set in its config, so the tests stay bounded) and the echo server as its neighbour — lets the hostile
instance try one thing, checks what it got and what the host kept, and then that the neighbouring
instance still answers.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from instances_helpers import ECHO, text, tool, until
from recording_helpers import PYTHON, ROOT

from replay_sim.errors import InstanceLost, UpstreamError
from replay_sim.record.config_file import parse_config
from replay_sim.record.instances import Instance, InstancePool

pytestmark = pytest.mark.anyio

HOSTILE = [PYTHON, str(ROOT / "fixtures" / "hostile_server.py")]
LIMITS = {
    "memory_mb": 64, "processes": 32, "cpu_seconds": 1, "layer_mb": 16, "answer_mb": 1, "stderr_mb": 1,
    "timeout": 3,
}  # fmt: skip


@asynccontextmanager
async def hostile(
    tmp_path: Path, secrets: Path | None = None, **options: Any
) -> AsyncIterator[tuple[InstancePool, Instance]]:
    """The pool (hostile and echo sandboxes; store directory and config, in ``secrets`` or
    ``tmp_path``, hidden), a hostile instance."""
    secrets = secrets or tmp_path
    command, *args = HOSTILE
    entry = {"command": command, "args": args, "sandbox": True, **LIMITS, **options.pop("entry", {})}
    echo_command, *echo_args = ECHO
    echo = {"command": echo_command, "args": echo_args, "sandbox": True}
    config = parse_config({"servers": {"hostile": entry, "echo": echo}})
    (secrets / "served").mkdir(parents=True)
    (secrets / "served" / "store.db").write_text("recordings")
    (secrets / "replay.toml").write_text("admin_token = 'secret'")
    hidden = [secrets / "served", secrets / "replay.toml"]
    with anyio.fail_after(90):
        async with InstancePool(
            config, pool=0, base=tmp_path / "instances", hidden=hidden, **options
        ) as pool:
            yield pool, await pool.acquire("hostile", timeout=30)
            neighbour = await pool.acquire("echo", timeout=30)
            assert text(await neighbour.call(*tool("echo", text="still here"))) == "still here"


async def attempt(instance: Instance, name: str, /, **arguments: Any) -> str:
    """What one hostile attempt got (its answer's text)."""
    return text(await instance.call(*tool(name, **arguments)))


async def test_it_runs_as_an_unprivileged_uid_of_its_own_without_capabilities(tmp_path: Path) -> None:
    async with hostile(tmp_path) as (_, instance):
        who = json.loads((await attempt(instance, "whoami")).removeprefix("ok "))
        assert who["Uid"] == who["Gid"] == str(instance.placement.uid) != "0"
        assert who["Groups"] == ""
        sets = ("CapInh", "CapEff", "CapPrm", "CapBnd", "CapAmb")
        assert [who[s] for s in sets] == ["0000000000000000"] * len(sets)
        assert who["NoNewPrivs"] == "1"


async def test_writes_to_etc_are_refused_and_to_home_stay_in_its_layer(tmp_path: Path) -> None:
    home = Path(os.environ.get("HOME", "/root")) / "replay-sim-hostile-was-here"
    async with hostile(tmp_path) as (_, instance):
        assert (await attempt(instance, "write", path="/etc/replay-sim-hostile")).startswith("refused")
        assert (await attempt(instance, "write", path=str(home))).startswith("ok")
        assert (await attempt(instance, "read", path=str(home))).startswith("ok")  # its own copy
    assert not Path("/etc/replay-sim-hostile").exists() and not home.exists()


async def test_its_dev_holds_the_harmless_nodes_only(tmp_path: Path) -> None:
    async with hostile(tmp_path) as (_, instance):
        assert await attempt(instance, "write", path="/dev/null") == "ok wrote /dev/null"
        assert await attempt(instance, "read", path="/dev/null") == "ok read 0 bytes"
        for device in ("/dev/kmsg", "/dev/mem", "/dev/loop0", "/dev/kvm", "/dev/console"):
            assert (await attempt(instance, "read", path=device)).startswith("refused: FileNotFoundError")


async def test_a_fixed_path_write_is_private_to_its_instance(tmp_path: Path) -> None:
    spot = str(Path(os.environ.get("HOME", "/root")) / "replay-sim-fixed-state")
    async with hostile(tmp_path) as (pool, first):
        second = await pool.acquire("hostile", timeout=30)
        assert (await attempt(first, "write", path=spot, text="first")).startswith("ok")
        assert "FileNotFoundError" in await attempt(second, "read", path=spot)


@pytest.fixture(params=["under /tmp", "elsewhere, a space in its path"])
def secrets(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """Where the replay's store and config are: under /tmp (an instance's /tmp is its own anyway),
    or in a directory it would see but for the covering mounts, named with a space."""
    if request.param == "under /tmp":
        yield tmp_path
        return
    outside = Path(tempfile.mkdtemp(prefix="replay sim secrets ", dir="/var/tmp"))
    outside.chmod(0o755)  # readable by anyone: only the covering mounts keep it from an instance
    try:
        yield outside
    finally:
        shutil.rmtree(outside, ignore_errors=True)


async def test_the_store_directory_and_the_config_are_not_visible(tmp_path: Path, secrets: Path) -> None:
    async with hostile(tmp_path, secrets) as (_, instance):
        store = await attempt(instance, "read", path=str(secrets / "served" / "store.db"))
        config = await attempt(instance, "read", path=str(secrets / "replay.toml"))
        assert store.startswith("refused"), store
        assert config.startswith("refused") or config == "ok read 0 bytes", config  # /dev/null over it
        overwritten = await attempt(instance, "write", path=str(secrets / "served" / "store.db"))
        assert overwritten.startswith("refused"), overwritten
    assert (secrets / "served" / "store.db").read_text() == "recordings"


async def test_the_host_process_table_is_not_visible_and_the_replay_cannot_be_signalled_or_traced(
    tmp_path: Path,
) -> None:
    async with hostile(tmp_path) as (_, instance):
        seen = (await attempt(instance, "cmdlines")).removeprefix("ok ").splitlines()
        assert seen and all("pytest" not in line for line in seen)
        assert all(int(line.split(":")[0]) < 100 for line in seen)  # its own PID namespace
        for name in ("signal", "ptrace"):
            assert (await attempt(instance, name, pid=os.getpid())).startswith("refused")


async def test_it_has_no_network_unless_its_config_says_so(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        async with hostile(tmp_path) as (_, instance):
            assert "ConnectionRefused" in await attempt(instance, "connect", port=port)
        async with hostile(tmp_path / "net", entry={"network": True}) as (_, instance):
            assert await attempt(instance, "connect", port=port) == "ok connected"


@pytest.mark.parametrize(
    ("name", "arguments", "why"),
    [
        ("allocate", {"mb": 256}, "before answering"),  # memory_mb = 64: the kernel ends it
        ("spin", {}, "before answering"),  # cpu_seconds = 1 per call (the call's timeout raised)
        ("flood", {"mb": 4}, "a line of more than 1048576 bytes"),  # answer_mb = 1
        ("huge", {"mb": 4}, "a line of more than 1048576 bytes"),
    ],
)
async def test_going_over_a_limit_ends_the_instance_and_its_episode_is_lost(
    tmp_path: Path, name: str, arguments: dict[str, Any], why: str
) -> None:
    async with hostile(tmp_path, entry={"timeout": 60}) as (_, instance):
        with pytest.raises(InstanceLost, match=why):
            await instance.call(*tool(name, **arguments))
        assert not instance.alive


async def test_forks_past_the_process_limit_are_refused(tmp_path: Path) -> None:
    async with hostile(tmp_path) as (_, instance):
        got = await attempt(instance, "fork", count=300)
        assert got.startswith("refused after") and int(got.split()[2].rstrip(":")) < 32


async def test_writes_past_the_layer_and_file_limits_are_refused_and_reach_nothing(tmp_path: Path) -> None:
    async with hostile(tmp_path) as (_, instance):
        layer = await attempt(instance, "write_big", path="/var/tmp/big", mb=64)  # layer_mb = 16
        assert layer.startswith("refused") and ("No space left" in layer or "too large" in layer)
        assert (await attempt(instance, "stderr", mb=4)).startswith("refused")  # stderr_mb = 1
        assert (await attempt(instance, "whoami")).startswith("ok")  # it lives on
    assert not Path("/var/tmp/big").exists()


async def test_an_unanswered_or_malformed_answer_times_out_and_the_instance_lives_on(tmp_path: Path) -> None:
    async with hostile(tmp_path) as (_, instance):
        for name in ("never", "malformed"):
            with pytest.raises(UpstreamError, match="did not answer"):
                await instance.call(*tool(name))
        assert (await attempt(instance, "whoami")).startswith("ok")


async def test_a_child_that_outlives_its_parent_ends_with_the_instance(tmp_path: Path) -> None:
    async with hostile(tmp_path) as (_, instance):
        assert await attempt(instance, "orphan") == "ok orphan left"
        uid = instance.placement.uid
        assert _processes_of(uid)
        await instance.close()
        await until(lambda: not _processes_of(uid), timeout=10)


async def test_its_clock_starts_when_its_recordings_began_unless_its_config_says_real(tmp_path: Path) -> None:
    began = datetime(2021, 5, 1, 12, 0, tzinfo=UTC)
    launched = time.time()
    async with hostile(tmp_path, clocks={"hostile": began}) as (_, instance):
        read = float((await attempt(instance, "now")).split()[1])
        # Pinned at launch, then advancing as real time does: never more than the time that passed.
        assert 0 <= read - began.timestamp() <= time.time() - launched + 1
    async with hostile(tmp_path / "real", clocks={"hostile": began}, entry={"clock": "real"}) as (
        _,
        instance,
    ):
        read = float((await attempt(instance, "now")).split()[1])
        assert abs(read - datetime.now(UTC).timestamp()) < 60


async def test_its_clock_reads_each_calls_time_set_from_outside_its_read_only_view(tmp_path: Path) -> None:
    began = datetime(2021, 5, 1, 12, 0, tzinfo=UTC)
    async with hostile(tmp_path, clocks={"hostile": began}) as (_, instance):
        for at in (datetime(2023, 3, 4, 5, 6, 7, tzinfo=UTC), datetime(2019, 1, 1, tzinfo=UTC)):
            answer = await instance.call(*tool("now"), at=at)
            read = float(text(answer).split()[1])
            assert 0 <= read - at.timestamp() < 30  # set when sent, then advancing in real time
            assert answer["clock"] == at.isoformat()
        assert instance.directory is not None
        clock = instance.directory / "clock" / "faketime"
        # Its clock file is where its config's server cannot change it.
        assert (await attempt(instance, "write", path=str(clock))).startswith("refused")
        assert (await attempt(instance, "read", path=str(clock))).startswith("ok")


def _processes_of(uid: int) -> list[int]:
    """The host's processes running as ``uid``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
        except (OSError, ValueError):
            continue
        if any(line.split()[1:2] == [str(uid)] for line in status.splitlines() if line.startswith("Uid:")):
            found.append(int(entry.name))
    return found
