"""What the ``sandbox`` policy needs of the record side's instances: the extension point it is handed.

The record side implements both protocols (``replay_sim.record.instances``); the replay side declares
them here and never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

__all__ = ["Reclaim", "SandboxInstance", "SandboxPool", "SnapshotStore"]


class SandboxInstance(Protocol):
    """One running instance of a real server, owned by one episode until closed."""

    server: str
    """The recorded server name it runs."""
    id: str
    """Unique, e.g. ``git-3``."""

    @property
    def alive(self) -> bool:
        """False once its process has exited or crashed."""
        ...

    async def call(self, method: str, params: dict[str, Any], at: datetime | None = None) -> dict[str, Any]:
        """Send one MCP request; return ``{"params", "result", "error", "latency_ms", "notifications"}``.

        Params, result and error are MCP wire JSON, redacted as the recorder would. With a pinned
        clock, ``clock`` too: what it read when the call was sent (ISO 8601).

        Args:
            method: The MCP method.
            params: Its params.
            at: What its pinned clock reads when the call is sent (a re-played call's recorded
                time); None: it goes on as it was. Ignored by an instance on the host's clock.

        Raises:
            InstanceLost: The instance died before or during the call.
            UpstreamError: The call timed out.
        """
        ...

    def clock_ahead(self, at: datetime) -> None:
        """Set its pinned clock to when its next call will be sent, off the answer path (nothing on
        the host's clock)."""
        ...

    def memory_bytes(self) -> int | None:
        """Resident memory of its process tree, None if unknown."""
        ...

    async def close(self) -> None:
        """End its process group and delete its state; idempotent."""
        ...


Reclaim = Callable[[str | None], Any]
"""``reclaim(server)``: an idle instance (a :class:`SandboxInstance`) its owner gives back to make room
— of ``server``, or of any server when None — or None when every instance is busy answering. Or the
instance and ``keep`` (``Callable[[], Awaitable[None]]``): the pool awaits ``keep()`` before it ends
the instance (its owner takes a state snapshot of it), the place held until it has ended."""


class SandboxPool(Protocol):
    """Where instances come from: started (or warm) at the initial state, capped in number."""

    def servers(self) -> frozenset[str]:
        """The recorded server names declared sandboxes."""
        ...

    async def acquire(
        self, server: str, *, timeout: float, reclaim: Reclaim | None = None, snapshot: str | None = None
    ) -> SandboxInstance:
        """A fresh instance at the initial state, owned by the caller until ``close()``.

        At the cap the pool asks ``reclaim`` for an idle instance to end instead of waiting; a
        caller waits only while every instance is busy answering. With ``snapshot``: a new instance
        started from that state snapshot (:class:`SnapshotStore`), at the state it holds.

        Raises:
            SandboxUnavailable: None could be had within ``timeout`` (the message says why).
        """
        ...

    def fingerprint(self, server: str) -> tuple[str, dict[str, Any]]:
        """The fingerprint of ``server``'s sandbox config and code, and what it was taken over.

        Every session an instance records is marked with it (``replay-sim forget --fingerprint``).
        """
        ...

    def wake(self) -> None:
        """An owner's instance turned idle: callers waiting for a place look again (and may reclaim it)."""
        ...

    def stats(self) -> dict[str, Any]:
        """Per server: live, warm, started, crashed, ended, memory per live instance, isolation kind."""
        ...

    async def aclose(self) -> None:
        """End every instance (server shutdown)."""
        ...


class SnapshotStore(Protocol):
    """A pool's state snapshots (its ``snapshots`` attribute, where it keeps any): an idle instance's
    files at a state, kept under a key its owner chooses, to start later instances from."""

    after: int
    """State-changing calls a state holds at least before it is snapshotted or started from."""

    def enabled(self, server: str) -> bool:
        """Whether ``server``'s instances can be snapshotted here (confined ones, snapshots not off)."""
        ...

    def kept(self, key: str) -> bool:
        """Whether a snapshot is kept under ``key``."""
        ...

    def worth(self, server: str, saved: float) -> bool:
        """Whether a start from a snapshot beats a re-play taking about ``saved`` seconds (a warm
        instance at hand re-plays a short prefix faster than a process starts)."""
        ...

    def find(self, server: str, keys: list[str]) -> tuple[int, dict[str, Any]] | None:
        """The longest prefix of ``keys`` (``keys[i]``: after ``i + 1`` calls) with a snapshot: how many
        calls it covers and what was kept with it; None when none is kept."""
        ...

    async def take(self, instance: Any, key: str, meta: dict[str, Any], *, waiting: bool = False) -> bool:
        """Copy an idle instance's files as snapshot ``key`` (``meta`` kept with it); whether it is kept.

        ``waiting``: a caller waits for the instance's place (it is reclaimed at the cap): files too
        many or too large to copy at once are not copied."""
        ...

    def stats(self) -> dict[str, Any]:
        """Snapshots kept, their bytes and bounds, and what was taken, refused, skipped, evicted, started."""
        ...
