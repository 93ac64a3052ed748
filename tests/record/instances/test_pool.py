"""The instance pool: exclusive servers one at a time, the cap, crashes, start failures, what it serves."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
from instances_helpers import (
    ECHO,
    HANG,
    MEMORY,
    PYTHON,
    memory,
    sandboxes,
    text,
    thread_niceness,
    tool,
    until,
)
from recording_helpers import echo_http

from replay_sim.errors import ConfigError, InstanceLost, SandboxUnavailable, UpstreamError
from replay_sim.record.config_file import parse_config
from replay_sim.record.instances import Instance, InstancePool
from replay_sim.record.instances.unavailable import why_unavailable
from replay_sim.record.instances.workspace import Workspace
from replay_sim.record.isolation import Isolation
from replay_sim.record.priority import AHEAD, raisable

pytestmark = pytest.mark.anyio


async def test_an_exclusive_server_runs_one_instance_at_a_time_each_after_its_reset(tmp_path: Path) -> None:
    graph = tmp_path / "memory.jsonl"
    config = sandboxes(
        memory={"command": [MEMORY], "env": {"MEMORY_FILE_PATH": str(graph)}, "reset": f"rm -f {graph}"}
    )
    assert config.servers["memory"].isolation is Isolation.EXCLUSIVE  # a reset and nothing else: implied
    with anyio.fail_after(60):
        async with InstancePool(config, pool=0, max_instances=4) as pool:
            first = await pool.acquire("memory", timeout=30)
            await first.call(
                *tool("create_entities", entities=[{"name": "Ada", "entityType": "p", "observations": []}])
            )
            with pytest.raises(SandboxUnavailable, match=r"'exclusive' .* another episode holds it"):
                await pool.acquire("memory", timeout=0.2)
            got: list[Instance] = []

            async def second() -> None:
                got.append(await pool.acquire("memory", timeout=30))

            async with anyio.create_task_group() as tg:
                tg.start_soon(second)
                await until(lambda: pool._waiting["memory"] == 1)
                assert pool.stats()["memory"]["live"] == 1  # the waiter starts nothing meanwhile
                await first.close()
            assert json.loads(text(await got[0].call(*tool("read_graph"))))["entities"] == []  # reset first
            assert pool.stats()["memory"]["live"] == 1


async def test_the_cap_of_live_instances_refuses_within_the_timeout_and_says_what_to_raise(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(60):
        async with InstancePool(sandboxes(memory=memory(tmp_path)), pool=0, max_instances=1) as pool:
            held = await pool.acquire("memory", timeout=30)
            with pytest.raises(SandboxUnavailable) as caught:
                await pool.acquire("memory", timeout=0.2)
            assert "all 1 sandbox instances (max_instances) were busy answering" in str(caught.value)
            assert "--max-sandboxes" in str(caught.value)
            await held.close()
            assert (await pool.acquire("memory", timeout=30)).alive


async def test_at_the_cap_a_warm_instance_of_another_server_is_ended_to_make_room(tmp_path: Path) -> None:
    config = sandboxes(first=memory(tmp_path / "a"), second=memory(tmp_path / "b"))
    with anyio.fail_after(60):
        async with InstancePool(config, pool=1, max_instances=1) as pool:
            await until(lambda: pool.stats()["first"]["warm"] == 1)  # the one place: first's warm instance
            instance = await pool.acquire("second", timeout=30)
            assert instance.server == "second" and instance.alive
            stats = pool.stats()
            assert (
                stats["first"]["ended"] == 1 and stats["first"]["live"] == 0 and stats["second"]["live"] == 1
            )


async def test_at_the_cap_an_idle_instance_its_owner_gives_back_is_ended_instead_of_waiting(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(60):
        async with InstancePool(sandboxes(memory=memory(tmp_path)), pool=0, max_instances=1) as pool:
            held = await pool.acquire("memory", timeout=30)
            asked: list[str | None] = []

            def busy(server: str | None) -> Instance | None:
                asked.append(server)
                return None  # every instance is busy answering: the caller waits, then is told so

            with pytest.raises(SandboxUnavailable, match="busy answering"):
                await pool.acquire("memory", timeout=0.2, reclaim=busy)
            assert asked == [None]

            def idle(server: str | None) -> Instance | None:
                return held  # its owner gives it back

            second = await pool.acquire("memory", timeout=0.5, reclaim=idle)  # no waiting for a close
            assert second.alive and not held.alive
            stats = pool.stats()["memory"]
            assert stats["reclaimed"] == 1 and stats["live"] == 1


async def test_an_instance_given_back_with_what_its_owner_keeps_ends_after_that_and_the_cap_holds(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(60):
        async with InstancePool(sandboxes(memory=memory(tmp_path)), pool=0, max_instances=1) as pool:
            held = await pool.acquire("memory", timeout=30)
            copied, seen, got = anyio.Event(), list[tuple[bool, int]](), list[Instance]()

            async def keep() -> None:  # what its owner does first: a state snapshot's copy, say
                seen.append((held.alive, pool.stats()["memory"]["live"]))
                await copied.wait()

            given: list[tuple[Instance, Any]] = [(held, keep)]

            async def waiting() -> None:
                got.append(
                    await pool.acquire("memory", timeout=30, reclaim=lambda s: given.pop() if given else None)
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiting)
                await until(lambda: bool(seen))
                assert seen == [(True, 1)] and not got  # it runs on, its place held: no second process
                copied.set()
            assert got[0].alive and not held.alive
            stats = pool.stats()["memory"]
            assert stats["reclaimed"] == 1 and stats["live"] == 1


async def test_an_instance_left_without_calls_past_the_idle_timeout_is_ended_and_its_place_freed(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(60):
        async with InstancePool(
            sandboxes(memory=memory(tmp_path)), pool=0, max_instances=1, idle_timeout=0.3
        ) as pool:
            forgotten = await pool.acquire("memory", timeout=30)
            await until(lambda: pool.stats()["memory"]["expired"] == 1)
            with pytest.raises(InstanceLost, match=r"was ended \(no call for \d+s, its idle timeout\)"):
                await forgotten.call(*tool("read_graph"))
            assert (await pool.acquire("memory", timeout=30)).alive  # its place under the cap is free


async def test_an_answer_has_the_forward_shape_redacted_with_its_notifications() -> None:
    config = parse_config(
        {
            "servers": {
                "echo": {"command": ECHO[0], "args": ECHO[1:], "sandbox": True, "env": {"RS_KEY": "k-4242"}}
            },
            "redaction": {"patterns": ["Vio[a-z]+"]},
        }
    )
    with anyio.fail_after(60):
        async with InstancePool(config, pool=0) as pool:
            instance = await pool.acquire("echo", timeout=30)
            secret = await instance.call(*tool("env", name="RS_KEY"))
            assert set(secret) == {"params", "result", "error", "notifications", "latency_ms", "clock"}
            assert text(secret) == "[REDACTED]"
            echoed = await instance.call(*tool("echo", text="Violet says k-4242"))
            assert text(echoed) == "[REDACTED] says [REDACTED]"
            assert echoed["params"] == {"name": "echo", "arguments": {"text": "[REDACTED] says [REDACTED]"}}
            progress = await instance.call(*tool("progress", steps=2))
            methods = [note["method"] for note in progress["notifications"]]
            assert methods.count("notifications/progress") == 2 and "notifications/message" in methods
            assert instance.memory_bytes() is not None and instance.memory_bytes() > 0  # type: ignore[operator]
            await instance.close()
            assert instance.memory_bytes() is None and not instance.alive


async def test_a_killed_instance_is_instance_lost_and_a_killed_warm_instance_is_replaced(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(60):
        async with InstancePool(sandboxes(memory=memory(tmp_path)), pool=1, max_instances=3) as pool:
            held = await pool.acquire("memory", timeout=30)
            assert held.pid is not None
            os.killpg(held.pid, signal.SIGKILL)
            with pytest.raises(
                InstanceLost, match=r"sandbox instance memory-1 of server 'memory' .* before answering"
            ):
                await held.call(*tool("read_graph"))
            assert not held.alive
            stats: dict[str, Any] = {}

            def warm() -> bool:
                stats.update(pool.stats()["memory"])
                return stats["warm"] == 1 and stats["crashed"] >= 1

            await until(warm)
            [(spare, pid)] = stats["pids"].items()
            os.killpg(pid, signal.SIGKILL)
            await until(lambda: warm() and spare not in stats["pids"] and stats["crashed"] == 2)
            replacement = await pool.acquire("memory", timeout=30)
            assert replacement.id != spare and "entities" in text(await replacement.call(*tool("read_graph")))
            await held.close()  # idempotent after a crash


async def test_a_crash_mid_call_is_instance_lost_naming_the_servers_stderr() -> None:
    with anyio.fail_after(60):
        async with InstancePool(sandboxes(echo={"command": ECHO}), pool=0) as pool:
            crashing = await pool.acquire("echo", timeout=30)
            with pytest.raises(InstanceLost, match=r"before answering tools/call.*crashing on request"):
                await crashing.call(*tool("crash"))
            assert not crashing.alive


async def test_a_call_left_unanswered_past_the_timeout_is_an_upstream_error_and_the_instance_lives_on() -> (
    None
):
    with anyio.fail_after(60):
        async with InstancePool(sandboxes(hang={"command": HANG, "timeout": 1.5}), pool=0) as pool:
            instance = await pool.acquire("hang", timeout=30)
            with pytest.raises(
                UpstreamError, match=r"sandbox instance hang-1: .* did not answer tools/call within 1.5s"
            ):
                await instance.call(*tool("hang"))
            assert instance.alive and text(await instance.call(*tool("quick"))) != ""


async def test_a_server_that_fails_to_start_is_unavailable_with_its_stderr_tail_and_not_restarted() -> None:
    failing = [PYTHON, "-c", "import sys; sys.stderr.write('no database at /nowhere\\n'); sys.exit(3)"]
    with anyio.fail_after(60):
        async with InstancePool(sandboxes(broken={"command": failing}), pool=1) as pool:
            with pytest.raises(SandboxUnavailable, match=r"could not be started: .*no database at /nowhere"):
                await pool.acquire("broken", timeout=30)
            stats = pool.stats()["broken"]
            assert stats["failed"] >= 1 and "no database" in stats["last_failure"]
            assert stats["starting"] == 0 and stats["live"] == 0  # no start loop behind the failure


async def test_a_url_sandbox_is_exclusive_and_reset_before_each_instance(tmp_path: Path) -> None:
    resets = tmp_path / "resets"
    async with echo_http() as url:
        config = parse_config(
            {"servers": {"remote": {"url": url, "sandbox": True, "reset": f"echo reset >> {resets}"}}}
        )
        with anyio.fail_after(60):
            async with InstancePool(config, pool=0) as pool:
                first = await pool.acquire("remote", timeout=30)
                assert text(await first.call(*tool("echo", text="hi"))) == "hi"
                assert first.pid is None and first.memory_bytes() is None  # not a process of ours
                with pytest.raises(SandboxUnavailable, match="'exclusive'"):
                    await pool.acquire("remote", timeout=0.2)
                await first.close()
                second = await pool.acquire("remote", timeout=30)
                assert text(await second.call(*tool("echo", text="again"))) == "again"
                assert resets.read_text() == "reset\nreset\n"


async def test_only_sandbox_servers_are_served() -> None:
    config = parse_config(
        {"servers": {"plain": {"command": "srv"}, "box": {"command": "srv", "sandbox": True}}}
    )
    with pytest.raises(ConfigError, match=r"'plain' is not a sandbox .* set sandbox = true"):
        InstancePool(config, servers=["plain"])
    async with InstancePool(config, pool=0) as pool:
        assert pool.servers() == frozenset({"box"})
        with pytest.raises(SandboxUnavailable, match="no sandbox server 'plain'"):
            await pool.acquire("plain", timeout=1)


def test_a_wait_that_ends_after_failed_starts_says_why_they_failed_not_still_starting() -> None:
    failed = "upstream command excel-mcp-server did not initialise; its stderr ends: PermissionError: …/x.log"
    common = {"exclusive_held": False, "at_cap": False, "cap": 8, "startup_timeout": 30.0}
    said = why_unavailable("excel", 30, failed=failed, **common)  # type: ignore[arg-type]
    assert said.startswith("sandbox 'excel': no instance within 30s: its instances could not start")
    assert failed in said and "still starting" not in said and "\n" not in said
    assert "still starting" in why_unavailable("excel", 30, **common)  # type: ignore[arg-type]


async def test_what_was_entered_within_the_pool_exits_after_it_closed_without_a_cancellation_escaping(
    tmp_path: Path,
) -> None:
    """As the sandbox policy enters its answer log after its pool: the pool's close cancels its task
    group, whose scope encloses the log's, so the log's exit raises that cancellation — the pool's."""
    async with contextlib.AsyncExitStack() as stack:
        pool = await stack.enter_async_context(InstancePool(sandboxes(memory=memory(tmp_path)), pool=0))
        inner = await stack.enter_async_context(anyio.create_task_group())
        inner.start_soon(anyio.sleep_forever)
        await pool.aclose()
        inner.cancel_scope.cancel()
    assert pool.stats()["memory"]["live"] == 0


async def test_an_instance_whose_state_could_not_be_deleted_still_ends_and_is_counted_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever ends its state's removal, a close() waiting on the instance returns."""

    def failing(self: Workspace) -> None:
        raise OSError("the disk went away")

    monkeypatch.setattr(Workspace, "remove", failing)
    with anyio.fail_after(60):
        async with InstancePool(sandboxes(memory=memory(tmp_path)), pool=0) as pool:
            instance = await pool.acquire("memory", timeout=30)
            await instance.close()
            await until(lambda: pool.stats()["memory"]["live"] == 0)
            assert pool.stats()["memory"]["failed"] == 1 and "the disk went away" in str(pool.stats())


@pytest.mark.skipif(not raisable(), reason="a lowered priority can only be raised again with CAP_SYS_NICE")
async def test_a_warm_instance_is_started_at_a_lower_priority_and_raised_when_taken(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with InstancePool(sandboxes(memory=memory(tmp_path)), pool=1, max_instances=3) as pool:
            await until(lambda: pool.stats()["memory"]["warm"] == 1)
            [warm] = pool.stats()["memory"]["pids"].values()
            assert group_niceness(warm) == {AHEAD}  # started ahead of demand, every process and thread
            taken = await pool.acquire("memory", timeout=30)
            assert taken.pid == warm and group_niceness(warm) == {0}
            assert "entities" in text(await taken.call(*tool("read_graph")))


def group_niceness(group: int) -> set[int]:
    """The ``nice`` values of every thread of process group ``group`` (``/proc/PID/task/TID/stat``)."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if os.getpgid(int(pid)) == group:
                found |= thread_niceness(int(pid))
    return found
