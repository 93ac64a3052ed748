"""A stdio server started off the event loop: in a worker thread, its pipes on the loop, its exit
learned from a pidfd — under uvloop (what uvicorn runs) as under asyncio."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from instances_helpers import thread_niceness
from mcp.client.stdio import StdioServerParameters

from replay_sim.record.child import ChildStdio
from replay_sim.record.priority import AHEAD, Priority, raisable
from replay_sim.record.spawn import Spawned, handed, spawn, spawnable

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not spawnable(), reason="no pidfds here: the SDK's spawn is used"),
]

ECHO = Path(__file__).parents[2] / "fixtures" / "echo_server.py"
CLIENT = {"name": "spawn-test", "version": "0"}


@pytest.fixture(params=[pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"), "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


async def test_a_server_is_started_in_a_worker_thread_and_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    started_on: list[int] = []
    popen = subprocess.Popen

    def recorded(*args: Any, **kwargs: Any) -> Any:
        started_on.append(threading.get_ident())
        return popen(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recorded)
    child = ChildStdio(StdioServerParameters(command=sys.executable, args=[str(ECHO)]), sys.stderr)
    async with child.open():
        params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": CLIENT}
        answer = await child.call("init-1", "initialize", params)
        assert answer["serverInfo"]["name"]
        assert isinstance(child.process, Spawned) and os.getpgid(child.process.pid) == child.process.pid
    assert started_on and threading.get_ident() not in started_on  # never on the loop's thread
    assert child.process.returncode is not None  # stopped and reaped


async def test_its_exit_is_seen_without_polling_and_its_output_ends() -> None:
    script = "import sys; sys.stdout.write(sys.stdin.readline().upper()); sys.stdout.flush(); sys.exit(3)"
    process = await spawn(sys.executable, ["-c", script], dict(os.environ), sys.stderr, None)
    await process.stdin.send(b"hello\n")
    assert await process.stdout.receive() == b"HELLO\n"
    with anyio.fail_after(60):
        assert await process.wait() == 3
    with pytest.raises(anyio.EndOfStream):
        await process.stdout.receive()
    with pytest.raises(anyio.BrokenResourceError):
        await process.stdin.send(b"more\n" * 100_000)  # nobody reads it any more
    await process.aclose()


async def test_a_killed_process_is_reaped_and_says_how_it_ended() -> None:
    process = await spawn(sys.executable, ["-c", "import time; time.sleep(600)"], None, sys.stderr, None)
    assert process.returncode is None
    process.kill()
    with anyio.fail_after(60):
        assert await process.wait() == -9
    await process.aclose()


async def test_a_program_that_cannot_be_started_is_an_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await spawn(str(tmp_path / "missing"), [], None, sys.stderr, None)
    with pytest.raises(FileNotFoundError):
        await spawn(sys.executable, [], None, sys.stderr, tmp_path / "no-such-folder")


async def test_closing_the_input_of_a_server_that_does_not_read_it_does_not_wait() -> None:
    """The SDK's stop closes stdin first, then waits a grace period, then kills: never stuck before."""
    process = await spawn(sys.executable, ["-c", "import time; time.sleep(600)"], None, sys.stderr, None)
    process.stdin._stream.write(b"x" * (1 << 20))  # more than the pipe holds: the rest stays buffered
    with anyio.fail_after(60):
        await process.stdin.aclose()
        process.kill()
        assert await process.wait() == -9


async def test_the_loop_is_handed_pipe_ends_it_closes_exactly_once(anyio_backend: Any) -> None:
    """uvloop closes a pipe's descriptor (libuv) and then calls its file object's close() too: a
    second close of a number another thread may hold by then. The object it is handed must not
    close it; asyncio closes only the object, so its object must."""
    uvloop = anyio_backend != "asyncio"
    read, write = os.pipe()
    os.close(write)
    file = open(read, "rb", buffering=0)  # noqa: SIM115  # as Popen makes it
    given = handed(file, asyncio.get_running_loop())
    assert file.closed  # Popen's own object: closed here, once
    fd = given.fileno()
    given.close()
    if uvloop:
        os.fstat(fd)  # still open: libuv closes it, once
        os.close(fd)
    else:
        with pytest.raises(OSError):
            os.fstat(fd)


async def test_spawned_processes_leave_no_descriptor_open() -> None:
    """Started, answered and closed: every pipe end is closed (by the loop), under both loops."""

    async def run_one() -> None:
        process = await spawn(sys.executable, ["-c", "import sys; sys.stdout.write(sys.stdin.read(2))"],
                              None, sys.stderr, None)  # fmt: skip
        await process.stdin.send(b"ok")
        with anyio.fail_after(60):
            assert await process.stdout.receive() == b"ok"
            await process.aclose()

    await run_one()  # the reaper's epoll and the worker threads: made once, kept
    before = set(os.listdir("/proc/self/fd"))
    for _ in range(5):
        await run_one()
    with anyio.fail_after(60):
        while set(os.listdir("/proc/self/fd")) - before:  # the loop closes a pipe on its next turn
            await anyio.sleep(0.01)


@pytest.mark.skipif(not raisable(), reason="a lowered priority can only be raised again with CAP_SYS_NICE")
async def test_a_start_ahead_of_demand_runs_at_a_lower_priority_until_restored() -> None:
    priority = Priority(AHEAD)
    script = "import sys, threading as t; sys.stdin.readline(); t.Thread(target=sys.stdin.readline).start()"
    process = await spawn(sys.executable, ["-c", script], dict(os.environ), sys.stderr, None, priority)
    assert priority.lowered and os.getpriority(os.PRIO_PROCESS, process.pid) == AHEAD
    await process.stdin.send(b"\n")  # a thread started later: at its process's priority
    await until_threads(process.pid, 2)
    assert thread_niceness(process.pid) == {AHEAD}
    priority.restore()
    assert not priority.lowered and thread_niceness(process.pid) == {0}  # every thread of its group
    await process.stdin.send(b"\n")
    with anyio.fail_after(60):
        assert await process.wait() == 0


@pytest.mark.skipif(not raisable(), reason="a lowered priority can only be raised again with CAP_SYS_NICE")
async def test_a_start_restored_before_its_process_exists_is_never_lowered() -> None:
    priority = Priority(AHEAD)
    priority.restore()
    process = await spawn(sys.executable, ["-c", "input()"], dict(os.environ), sys.stderr, None, priority)
    assert os.getpriority(os.PRIO_PROCESS, process.pid) == 0
    await process.stdin.send(b"\n")
    with anyio.fail_after(60):
        assert await process.wait() == 0


async def until_threads(pid: int, count: int) -> None:
    with anyio.fail_after(60):
        while len(os.listdir(f"/proc/{pid}/task")) < count:
            await anyio.sleep(0.01)
