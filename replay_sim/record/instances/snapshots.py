"""State snapshots: a confined instance's files at a state, copied to start later instances from.

A confined instance keeps every file it writes in its own copy-on-write layer (:mod:`.confine`: the
overlay's upper directory and its private ``/tmp``, ``/run`` and ``/dev/shm`` on a tmpfs in its
mount namespace) and, for ``state`` and ``mounts`` isolation, in its copies of those directories
(in its workspace). :meth:`StateSnapshots.take` copies all of them while the instance is idle (its
owner holds it between calls, so the files are as its last answer left them), under a key its
owner chooses: the replay keys it by the server's fingerprint and the calls, with their answers,
that brought the instance there. A later instance started from it (``InstancePool.acquire(...,
snapshot=key)``) gets a copy as its own layer and copies, its files given to its own uid, and
starts there instead of at the initial state.

The layer lives in the instance's mount namespace, not the host's: it is read through
``/proc/<pid>/root`` of the instance's ``unshare`` process (which is in that namespace and not
chrooted). Copies are made with ``cp -a`` (modes, owners, extended attributes and the overlay's
whiteouts — character devices — kept).

What a snapshot cannot hold is state in the process (memory): whether a server's state lives in its
files is for the replay to find out (``replay_sim.replay.policies.snapshotting``). Snapshots are
bounded in count and bytes (least recently used evicted first; one being started from is deleted
only once that start is done) and all deleted with the pool. Only confined instances of servers
started by a command (not ``exclusive`` ones) are snapshotted.

An instance reclaimed at the pool's cap is snapshotted while a caller waits for its place
(``take(..., waiting=True)``): its files are counted first, and a layer over
:data:`WAITED_BYTES` or :data:`WAITED_FILES` is not copied (``skipped``) — ``cp -a`` costs about a
millisecond a file and well under a second for those bytes, measured, so the wait stays below a
process start's order.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from replay_sim.errors import ConfigError
from replay_sim.record.config import DEFAULT_SNAPSHOT_AFTER, DEFAULT_SNAPSHOT_MB, DEFAULT_SNAPSHOTS
from replay_sim.record.instances.instance import Instance
from replay_sim.record.instances.workspace import claim

__all__ = [
    "DEFAULT_SNAPSHOTS",
    "DEFAULT_SNAPSHOT_AFTER",
    "DEFAULT_SNAPSHOT_BYTES",
    "WAITED_BYTES",
    "WAITED_FILES",
    "StateSnapshots",
]

DEFAULT_SNAPSHOT_BYTES = DEFAULT_SNAPSHOT_MB << 20
"""Bytes of state snapshots kept at most (``--sandbox-snapshot-mb``)."""

WAITED_BYTES = 64 << 20
"""Bytes of an instance's files copied at most while a caller waits for its place (about 40 ms here)."""

WAITED_FILES = 512
"""Files of an instance copied at most while a caller waits for its place (about half a second here)."""

_LAYER = ("upper", "tmp", "run", "shm", "reveal")  # in an instance's layer: what it wrote (not work dirs)


@dataclass
class _Kept:
    server: str
    path: Path
    size: int
    uid: int
    meta: dict[str, Any]
    pins: int = 0


@dataclass
class StateSnapshots:
    """The state snapshots of one pool's instances: bounded, least recently used evicted first.

    Attributes:
        count: Snapshots kept at most (0: snapshots are off).
        max_bytes: Their bytes at most (a larger one is not kept).
        after: State-changing calls a state holds at least before the replay snapshots it or starts
            from a snapshot of it (fewer are cheaper re-played on a warm instance).
        base: Where their directory is made (None: the system's temporary directory).
        servers: The servers whose instances may be snapshotted (the pool sets it: confined ones).
        counts: ``taken``, ``refused`` (too large, or the copy failed), ``skipped`` (too large to
            copy while a caller waits), ``evicted``, ``started``.
    """

    count: int = DEFAULT_SNAPSHOTS
    max_bytes: int = DEFAULT_SNAPSHOT_BYTES
    after: int = DEFAULT_SNAPSHOT_AFTER
    base: Path | None = None
    servers: frozenset[str] = frozenset()
    counts: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.count < 0 or self.max_bytes < 1 or self.after < 1:
            raise ConfigError(
                "sandbox snapshots: count must be ≥ 0, bytes ≥ 1 and calls ≥ 1 "
                f"(got {self.count}, {self.max_bytes}, {self.after})"
            )
        self._kept: OrderedDict[str, _Kept] = OrderedDict()  # least recently used first
        self._doomed: dict[Path, _Kept] = {}  # evicted while a start copies from them
        self._root: Path | None = None
        self._names = itertools.count(1)
        self._start_s: dict[str, float] = {}  # how long the server's last instance took to start
        self._warm: dict[str, int] = {}  # warm instances of it ready when last looked

    def started(self, server: str, seconds: float | None, warm: int) -> None:
        """The pool's news: an instance of ``server`` started in ``seconds`` (None: one was handed
        out), and ``warm`` started instances of it are ready now."""
        if seconds is not None:
            self._start_s[server] = seconds
        self._warm[server] = warm

    def worth(self, server: str, saved: float) -> bool:
        """Whether starting from a snapshot beats re-play that takes about ``saved`` seconds: a
        process start is due anyway (no warm instance ready), or it took less than ``saved`` last time."""
        return not self._warm.get(server) or self._start_s.get(server, 0.0) < saved

    def enabled(self, server: str) -> bool:
        """Whether ``server``'s instances are snapshotted (confined, started by a command, not off)."""
        return self.count > 0 and server in self.servers

    def kept(self, key: str) -> bool:
        """Whether a snapshot is kept under ``key``."""
        return key in self._kept

    @property
    def bytes(self) -> int:
        """Bytes of the snapshots kept."""
        return sum(kept.size for kept in self._kept.values())

    def find(self, server: str, keys: list[str]) -> tuple[int, dict[str, Any]] | None:
        """The longest prefix of ``keys`` (``keys[i]``: the state after ``i + 1`` calls) with a snapshot.

        Returns:
            How many calls it covers and what its taker kept with it, or None. It counts as used.
        """
        for n in range(len(keys), 0, -1):
            kept = self._kept.get(keys[n - 1])
            if kept is not None and kept.server == server:
                self._kept.move_to_end(keys[n - 1])
                return n, kept.meta
        return None

    async def take(
        self, instance: Instance, key: str, meta: dict[str, Any], *, waiting: bool = False
    ) -> bool:
        """Copy an idle instance's files as the snapshot ``key`` (``meta`` kept with it); whether it is kept.

        The caller holds the instance between calls for the copy's length. A snapshot larger than
        :attr:`max_bytes`, or one that cannot be copied, is not kept; older ones are evicted to make
        room. ``waiting``: a caller waits for the instance's place: files over :data:`WAITED_BYTES`
        or :data:`WAITED_FILES` are not copied.
        """
        if not self.enabled(instance.server) or instance.pid is None or instance.directory is None:
            return False
        if key in self._kept:
            self._kept.move_to_end(key)
            return True
        if self._root is None:
            try:
                self._root = Path(tempfile.mkdtemp(prefix="replay-sim-snapshots-", dir=self.base))
                claim(self._root)  # deleted by a later pool's sweep if this replay is killed outright
            except OSError:
                self.counts["refused"] += 1
                return False
        if waiting and not await anyio.to_thread.run_sync(_within, instance.pid, instance.directory):
            self.counts["skipped"] += 1
            return False
        target = self._root / str(next(self._names))
        copied = await anyio.to_thread.run_sync(_copy_state, instance.pid, instance.directory, target)
        if copied is None or copied > self.max_bytes or not instance.alive:
            await anyio.to_thread.run_sync(shutil.rmtree, target, True)
            self.counts["refused"] += 1
            return False
        self._kept[key] = _Kept(instance.server, target, copied, instance.placement.uid, dict(meta))
        self.counts["taken"] += 1
        evicted = []
        while len(self._kept) > self.count or self.bytes > self.max_bytes:
            _, oldest = self._kept.popitem(last=False)
            self.counts["evicted"] += 1
            if oldest.pins:
                self._doomed[oldest.path] = oldest
            else:
                evicted.append(oldest.path)
        for path in evicted:  # off the event loop: a layer may hold hundreds of megabytes
            await anyio.to_thread.run_sync(shutil.rmtree, path, True)
        return key in self._kept

    def pin(self, key: str) -> tuple[Path, int] | None:
        """Hold snapshot ``key`` for a start (not deleted until :meth:`unpin`): its path and taker's uid."""
        kept = self._kept.get(key)
        if kept is None:
            return None
        kept.pins += 1
        return kept.path, kept.uid

    def unpin(self, key: str, path: Path) -> None:
        """A start from snapshot ``key`` (at ``path``) is done: delete it if it was evicted meanwhile."""
        kept = self._kept.get(key)
        if kept is not None and kept.path == path:
            kept.pins -= 1
        elif (doomed := self._doomed.get(path)) is not None:
            doomed.pins -= 1
            if not doomed.pins:  # evicted meanwhile, and no start copies from it any more
                del self._doomed[path]
                shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        """Delete every snapshot (the pool closes)."""
        self._kept.clear()
        self._doomed.clear()
        root, self._root = self._root, None
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    def stats(self) -> dict[str, Any]:
        """Snapshots kept and their bytes, the bounds, and how many were taken, refused, skipped, evicted."""
        counted = {what: self.counts[what] for what in ("taken", "refused", "skipped", "evicted", "started")}
        bounds = {"max": self.count, "max_bytes": self.max_bytes, "after": self.after}
        return {"kept": len(self._kept), "bytes": self.bytes, **bounds, **counted}


def _sources(pid: int, workspace: Path) -> tuple[Path, list[Path]]:
    """Instance ``pid``'s layer (read in its mount namespace), and what of it and its workspace is copied."""
    layer = Path(f"/proc/{pid}/root") / workspace.relative_to("/") / "layer"
    sources = [layer / name for name in _LAYER if (layer / name).exists()]
    sources += [workspace / name for name in ("state", "mounts") if (workspace / name).exists()]
    return layer, sources


def _within(pid: int, workspace: Path) -> bool:
    """Whether instance ``pid``'s files are few and small enough to copy while a caller waits
    (:data:`WAITED_FILES`, :data:`WAITED_BYTES`); counting stops at the first bound passed."""
    files = size = 0
    for source in _sources(pid, workspace)[1]:
        walked = os.walk(source) if source.is_dir() else [(str(source.parent), [], [source.name])]
        for directory, _, names in walked:
            for name in names:
                files += 1
                try:
                    size += os.lstat(os.path.join(directory, name)).st_size
                except OSError:
                    return False  # the instance ended meanwhile
                if files > WAITED_FILES or size > WAITED_BYTES:
                    return False
    return True


def _copy_state(pid: int, workspace: Path, target: Path) -> int | None:
    """Copy instance ``pid``'s layer (from its mount namespace) and state copies into ``target``.

    Returns:
        The bytes copied, or None when the copy failed (the instance ended meanwhile).
    """
    layer, sources = _sources(pid, workspace)
    try:
        (target / "layer").mkdir(parents=True)
        for source in sources:
            into = target / "layer" if source.parent == layer else target
            subprocess.run(["cp", "-a", str(source), str(into)], check=True, capture_output=True, timeout=600)
    except (OSError, subprocess.SubprocessError):
        return None
    for work in (target / "layer" / "reveal").glob("*/w"):  # overlay work dirs: made afresh
        shutil.rmtree(work, ignore_errors=True)
    size = 0
    for directory, _, files in os.walk(target):
        size += sum(os.lstat(os.path.join(directory, name)).st_size for name in files)
    return size
