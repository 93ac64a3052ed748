"""The sandbox instance pool as serving builds it from the served store (``serve --miss sandbox``).

The replay side declares what it needs (``SandboxPool``); :class:`InstancePool` implements it; this
builds one for a store: the store's directory hidden from every instance, each server's instances
on the clock its recordings began at, and shown the paths under ``/tmp`` its recorded calls name.
``serve``, ``serving()`` and each Ray replica build their pools here and inject them into the replay.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path

from replay_sim.errors import ConfigError, StoreError
from replay_sim.record.config import (
    DEFAULT_SNAPSHOT_AFTER,
    DEFAULT_SNAPSHOT_MB,
    DEFAULT_SNAPSHOTS,
    RecorderConfig,
)
from replay_sim.record.effect_probes import leaves
from replay_sim.record.instances.clock import recordings_began
from replay_sim.record.instances.confine import private
from replay_sim.record.instances.pool import DEFAULT_MAX_INSTANCES, DEFAULT_POOL, InstancePool
from replay_sim.record.instances.snapshots import StateSnapshots
from replay_sim.store import Store
from replay_sim.store.records import EPISODE_ORIGINS

__all__ = ["recorded_paths", "sandbox_pool"]


def sandbox_pool(
    config: RecorderConfig,
    *,
    pool: int = DEFAULT_POOL,
    max_instances: int = DEFAULT_MAX_INSTANCES,
    idle_timeout: float | None = None,
    servers: Iterable[str] | None = None,
    store: str | Path | None = None,
    hidden: Iterable[str | Path] = (),
    unconfined: bool = False,
    snapshots: int = DEFAULT_SNAPSHOTS,
    snapshot_mb: int = DEFAULT_SNAPSHOT_MB,
    snapshot_after: int = DEFAULT_SNAPSHOT_AFTER,
) -> InstancePool:
    """The pool of instances of ``config``'s sandbox servers (enter it with ``async with`` while serving).

    Args:
        config: The recorder config (``sandbox = true`` servers, their isolation, redaction rules).
        pool: Warm instances kept ready per server (``--sandbox-pool N``).
        max_instances: Live instances at most across servers (``--max-sandboxes N``).
        idle_timeout: Seconds a handed-out instance may go without a call before it is ended
            (a safety net behind the episodes' own idle expiry; None: never).
        servers: Only these sandbox servers (default: all of them).
        store: The served store: its directory is hidden from every instance, and each server's
            instances start their clock when its recordings began.
        hidden: More paths no instance may see (the index directory, the recorder config file).
        unconfined: Run instances unconfined (``--unconfined-sandboxes``): no state snapshots then.
        snapshots: State snapshots kept at most (``--sandbox-snapshots N``; 0: none).
        snapshot_mb: Their megabytes at most (``--sandbox-snapshot-mb``).
        snapshot_after: State-changing calls a state holds at least before it is snapshotted.

    Raises:
        ConfigError: The config declares no sandbox, a named server is not one, or a count is out of range.
    """
    if not any(spec.sandbox for spec in config.servers.values()):
        raise ConfigError(
            "--miss sandbox needs a recorder config with at least one server declared `sandbox = true` "
            f"(its servers: {', '.join(sorted(config.servers))})"
        )
    paths = [*hidden, *([os.path.dirname(os.path.abspath(store))] if store is not None else [])]
    return InstancePool(
        config, pool=pool, max_instances=max_instances, idle_timeout=idle_timeout, servers=servers,
        hidden=paths, clocks=_clocks(store, config) if store is not None else None, unconfined=unconfined,
        recorded=_recorded_paths(store, config) if store is not None else None,
        snapshots=StateSnapshots(snapshots, snapshot_mb << 20, snapshot_after),
    )  # fmt: skip


def _clocks(store: str | Path, config: RecorderConfig) -> dict[str, datetime]:
    """When each sandbox server's recordings in ``store`` began (servers with none are left out)."""
    try:
        with Store(store, readonly=True, create=False) as opened:
            found = {
                name: recordings_began(opened, server=name) for name, s in config.servers.items() if s.sandbox
            }
    except StoreError:
        return {}  # the replay reports an unreadable store itself
    return {name: when for name, when in found.items() if when is not None}


def _recorded_paths(store: str | Path, config: RecorderConfig) -> dict[str, tuple[str, ...]]:
    """Per sandbox server, the paths under a private directory (``/tmp``) its recorded calls name.

    A confined instance gets a fresh ``/tmp``; the state its server was recorded using there (a
    repository or files its calls name by path) is shown to it copy-on-write. Only the real server's
    recordings count: a path an episode's call named (a sandbox's answer) reveals nothing.
    """
    try:
        with Store(store, readonly=True, create=False) as opened:
            found = {name: recorded_paths(opened, name) for name, s in config.servers.items() if s.sandbox}
    except StoreError:
        return {}  # the replay reports an unreadable store itself
    return {name: paths for name, paths in found.items() if paths}


def recorded_paths(store: Store, server: str) -> tuple[str, ...]:
    """The private paths ``server``'s first recordings (not an episode's) name, in recorded order."""
    paths: dict[str, None] = {}
    after, scanned = 0, 0
    while len(paths) < _RECORDED_PATHS and scanned < _SCANNED:
        page = store.recordings(server, after_id=after, limit=_PAGE)
        if not page:
            break
        after, scanned = page[-1].id, scanned + len(page)
        for recording in page:
            if recording.origin not in EPISODE_ORIGINS:
                paths |= dict.fromkeys(_paths_in(recording.params))
    return tuple(paths)[:_RECORDED_PATHS]


_RECORDED_PATHS = 256  # paths per server at most: each is looked at when an instance starts
_SCANNED = 20_000  # recordings looked at per server, at most: the first (a store's own come first)
_PAGE = 500


def _paths_in(value: object) -> Iterator[str]:
    """Absolute paths (or ``file://`` URIs) under a private directory among a JSON value's strings."""
    for text in leaves(value):
        if len(text) < 4096 and "\n" not in text and text.startswith(("/", "file:///")):
            path = os.path.normpath(text.removeprefix("file://"))
            if private(path):
                yield path
