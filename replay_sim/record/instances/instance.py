"""One sandbox instance: a real server started for one owner, in a state of its own, ended with its state.

An :class:`Instance` is what the replay's ``sandbox`` miss policy calls a ``SandboxInstance``: it
starts the server of a recorder config entry in its :class:`~replay_sim.record.instances.workspace.Workspace`
(fresh process, own copy of its state or of its mounted paths; after the server's ``reset`` for
isolation ``exclusive``), speaks MCP to it over stdio as the recorder does
(:class:`~replay_sim.record.upstream.Upstream`: handshake, raw pass-through, timeouts), and returns
each answer in the shape of the ``live`` policy's forward, redacted by the config's rules. When its
process exits unasked (a crash, a kill) it is no longer :attr:`~Instance.alive` and every call raises
:class:`~replay_sim.errors.InstanceLost`. :meth:`Instance.close` ends its process group and deletes
its workspace.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import mcp_types as types
from mcp.shared.exceptions import MCPError

from replay_sim.errors import InstanceLost, UpstreamError
from replay_sim.record.config import UpstreamSpec
from replay_sim.record.instances.confine import Placement
from replay_sim.record.instances.procfs import CpuBudget, group_rss
from replay_sim.record.instances.workspace import Launcher, Workspace, prepare
from replay_sim.record.isolation import Isolation
from replay_sim.record.priority import AHEAD, Priority
from replay_sim.record.rerun import reset
from replay_sim.record.upstream import Upstream
from replay_sim.redaction import Redactor

__all__ = ["Instance"]

_KEPT_NOTIFICATIONS = ("notifications/progress", "notifications/message")


class Instance:
    """A real server's instance owned by one caller (a ``SandboxInstance``).

    Run it in a task group with :meth:`run` (the pool does); it is usable once ``on_started`` was
    called, until :meth:`close` or its process's end.

    Args:
        server: The recorded server name it runs.
        id: A unique id (``"memory-3"``).
        spec: The server's recorder config entry (a sandbox).
        redactor: The recorder config's rules (the spec's env and header values are added).
        launcher: How its process is launched here.
        capabilities: Client capabilities declared to the server at ``initialize`` (wire JSON).
        base: Where its workspace directory is made (None: the system's temporary directory).
        placement: Its uid, the paths it must not see and its clock, when confined.
        ahead: Started ahead of demand: its start runs at a lower CPU priority until :meth:`hurry`.
    """

    def __init__(
        self,
        server: str,
        id: str,
        spec: UpstreamSpec,
        *,
        redactor: Redactor,
        launcher: Launcher,
        capabilities: Mapping[str, Any] | None = None,
        base: Path | None = None,
        placement: Placement | None = None,
        ahead: bool = False,
    ) -> None:
        self.server = server
        self.id = id
        self.spec = spec
        self.crashed = False
        """Whether its process ended unasked (a crash or a kill), not by :meth:`close`."""
        self.ended_because: str | None = None
        """Why it was ended when not by its owner (``no call for 300s, its idle timeout``)."""
        self.idle_since: float | None = anyio.current_time()
        """Since when (``anyio.current_time()``) no call has been in flight; None during a call."""
        self._redactor = redactor.with_secrets(spec.secrets())
        self._launcher = launcher
        self._capabilities = dict(capabilities or {})
        self._base = base
        self.placement = placement or Placement()
        self.priority = Priority(AHEAD if ahead else 0)
        """Its CPU priority: lowered (when it was started ahead of demand) until :meth:`hurry`."""
        self._upstream: Upstream | None = None
        self._pending: Upstream | None = None  # the connection being started
        self._workspace: Workspace | None = None
        self._process: Any = None
        self._cpu: CpuBudget | None = None  # a confined one's CPU time per call
        self._notes: list[dict[str, Any]] = []
        self._tail = ""
        self._starting: anyio.CancelScope | None = None
        self._calling = anyio.Lock()
        self._clock_set = False  # whether a call has set its pinned clock yet
        self._closing = anyio.Event()
        self._done = anyio.Event()

    # -- lifecycle --------------------------------------------------------------------------

    async def run(self, on_started: Callable[[], None] = lambda: None) -> None:
        """Start the instance, call ``on_started``, hold it until :meth:`close` or its process ends.

        Its workspace is deleted when this returns (also when cancelled).

        Raises:
            UpstreamError: It could not be started (reset failed, state not copied, the server did
                not start or initialise: names the server, its command and its stderr tail).
        """
        failure: UpstreamError | None = None
        try:
            async with anyio.create_task_group() as tg:
                with anyio.CancelScope() as self._starting:
                    if self._closing.is_set():  # closed before it ran
                        self._starting.cancel()
                    try:
                        upstream = await self._start(tg)
                    except UpstreamError as exc:  # raised below, not wrapped in the task group's group
                        failure = exc
                    else:
                        self._upstream = upstream
                self._starting = None
                if self._upstream is not None:
                    await self._hold(tg, self._upstream, on_started)
                tg.cancel_scope.cancel()  # (a failed or cancelled start leaves nothing to hold)
        finally:
            self._closing.set()
            workspace, self._workspace = self._workspace, None
            if self._cpu is not None:
                self._cpu.close()
            try:
                if workspace is not None:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(workspace.remove)
            finally:  # whatever ended the removal: a close() waiting for it would wait forever
                self._done.set()
        if failure is not None:
            raise failure

    async def _hold(
        self, tg: anyio.abc.TaskGroup, upstream: Upstream, on_started: Callable[[], None]
    ) -> None:
        """Watch its process, report it started, and end its process group once closed (or crashed)."""
        if upstream.child is not None:
            self._process = upstream.child.process
            if self._workspace is not None and self._workspace.confined:
                self._cpu = CpuBudget(self._process.pid, self.spec.containment.limits.cpu_seconds)
            tg.start_soon(self._watch, self._process)
        on_started()
        await self._closing.wait()
        _kill(upstream)
        await upstream.close()

    async def _start(self, tg: anyio.abc.TaskGroup) -> Upstream:
        """Reset (exclusive), make the workspace, start the server in ``tg``; its initialised connection."""
        if self.spec.isolation is Isolation.EXCLUSIVE:
            await reset(self.server, self.spec)
        self._workspace = await anyio.to_thread.run_sync(
            prepare, self.server, self.id, self.spec, self._launcher, self._base, self.placement
        )
        max_line = self.spec.containment.limits.answer_bytes if self._workspace.confined else None
        upstream = Upstream(
            self._workspace.spec, self._collect, self._capabilities, max_line=max_line, priority=self.priority
        )
        self._pending = upstream
        await tg.start(upstream.run)
        return upstream

    async def _watch(self, process: anyio.abc.Process) -> None:
        """Notice the process's end: unasked, it crashed (and the instance closes itself).

        (``wait()`` also waits for the end of its output, which a child the server left behind could
        hold open: in its own PID namespace none is left; without one :attr:`alive` still reads the
        exit status itself, so calls see the crash at once, and only the refill waits.)
        """
        await process.wait()
        if not self._closing.is_set():
            self.crashed = True
            if self._upstream is not None:
                self._tail = self._upstream.stderr_tail()  # read before the connection closes it
            self._closing.set()

    async def close(self, because: str | None = None) -> None:
        """End its process group and delete its state; idempotent (one still starting is stopped).

        Args:
            because: Why, when it is not its owner's doing (said by a later call's :class:`InstanceLost`).
        """
        if because is not None and not self._closing.is_set():
            self.ended_because = because
        self._closing.set()
        if self._starting is not None:
            if self._pending is not None:
                _kill(self._pending)  # spawned and initialising: no use waiting for it
            self._starting.cancel()
        await self._done.wait()

    def hurry(self) -> None:
        """Somebody needs it now: run it (its start too) at the normal CPU priority from now on."""
        self.priority.restore()

    @property
    def alive(self) -> bool:
        """Whether it can still answer: started, not closed, its process running."""
        upstream = self._upstream
        if upstream is None or self._closing.is_set() or not upstream.alive:
            return False
        return self._process is None or self._process.returncode is None

    @property
    def directory(self) -> Path | None:
        """Its workspace: the directory holding its copies of state or mounted paths (None once deleted)."""
        return None if self._workspace is None else self._workspace.root

    @property
    def pid(self) -> int | None:
        """Its process's id, also its process group's (None for a URL server)."""
        return None if self._process is None else int(self._process.pid)

    def memory_bytes(self) -> int | None:
        """Resident memory of its process tree (its process group), None when unknown or ended."""
        pid = self.pid
        if pid is None or not self.alive:
            return None
        return group_rss([pid]).get(pid)

    # -- calls ------------------------------------------------------------------------------

    async def call(self, method: str, params: dict[str, Any], at: datetime | None = None) -> dict[str, Any]:
        """Send one MCP request and return its answer as the ``live`` policy's forward does.

        Calls to one instance are sent one at a time, so the notifications that arrive while one is
        in flight belong to it.

        Args:
            method: The MCP method.
            params: Its params (wire JSON).
            at: What its pinned clock reads when the call is sent (it advances in real time during
                the call): a re-played call's recorded time. None: its clock goes on as it was
                (for its first call: it reads its start, when its recordings began).
                Ignored on the host's clock (``clock = "real"``, or nothing recorded to start from).

        Returns:
            ``{"params", "result", "error", "notifications", "latency_ms", "clock"}``: wire JSON,
            redacted; ``clock`` is what its clock read when the call was sent (ISO 8601), None on
            the host's clock.

        Raises:
            InstanceLost: The instance had ended (crashed, killed, closed) or its connection broke
                during the call.
            UpstreamError: The server neither answered nor reported progress within its timeout.
        """
        async with self._calling:
            upstream = self._upstream
            if upstream is None or not self.alive:
                raise self._lost(method)
            self.idle_since = None
            self._notes = []
            if self._cpu is not None:
                self._cpu.arm()  # CPU time per call
            clock = None if self._workspace is None else self._workspace.clock
            if clock is not None and at is None and not self._clock_set:
                at = self.placement.clock_start  # its first call: when its recordings began
            if clock is not None and at is not None:
                clock.set(at)  # a few bytes renamed into place: at once, so it reads `at` when sent
                self._clock_set = True
            sent = None if clock is None else at or clock.now()
            request_id = upstream.next_request_id()
            out = {**params, "_meta": {"progressToken": request_id}}
            try:
                answer = await upstream.exchange(method, out, request_id=request_id)
            except MCPError as exc:  # timed out
                raise UpstreamError(f"sandbox instance {self.id}: {exc.error.message}") from exc
            finally:
                self.idle_since = anyio.current_time()
            if answer.error is not None and answer.error["code"] == types.CONNECTION_CLOSED:
                raise self._lost(method)
            redact = self._redactor.redact
            return {
                "params": redact(params),
                "result": redact(answer.result),
                "error": redact(answer.error),
                "notifications": redact(list(self._notes)),
                "latency_ms": round(answer.latency_ms, 3),
                "clock": None if sent is None else sent.isoformat(),
            }

    def clock_ahead(self, at: datetime) -> None:
        """Set its pinned clock now to when its next call will be sent (``at``), off the answer path:
        the file is written in a worker thread while the answer goes out, and that call finds it
        set. Between calls its clock reads ``at`` already; nothing on the host's clock."""
        clock = None if self._workspace is None else self._workspace.clock
        if clock is not None and self._clock_set:
            clock.set_ahead(at)

    def _lost(self, method: str) -> InstanceLost:
        child = None if self._upstream is None else self._upstream.child
        limits = self.spec.containment.limits
        if child is not None and child.overflow:
            how = (
                f"was ended: it wrote a line of more than {limits.answer_bytes} bytes on stdout "
                "(raise answer_mb in its [servers] table)"
            )
        elif self.crashed:
            how = f"exited unasked (exit status {self._process.returncode})"
        elif self._closing.is_set():
            how = f"was ended ({self.ended_because})" if self.ended_because else "was closed"
        else:
            how = "closed its connection"
        tail = self._tail or (self._upstream.stderr_tail() if self._upstream is not None else "")
        detail = f"; its stderr ends: {' | '.join(tail.splitlines()[-5:])}" if tail else ""
        return InstanceLost(
            f"sandbox instance {self.id} of server {self.server!r} {how} before answering {method}: "
            f"its state is gone, so its episode cannot go on there{detail}"
        )

    async def _collect(self, method: str, params: dict[str, Any]) -> None:
        if method in _KEPT_NOTIFICATIONS:
            self._notes.append(
                {"method": method, "params": {k: v for k, v in params.items() if k != "progressToken"}}
            )


def _kill(upstream: Upstream) -> None:
    """End a server's process group at once: its state is thrown away, so no grace period is owed."""
    process = None if upstream.child is None else upstream.child.process
    if process is not None and process.returncode is None:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # its own group (the SDK's spawn): children too
