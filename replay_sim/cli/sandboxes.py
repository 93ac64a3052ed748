"""Building the sandbox instance pool that ``serve --miss sandbox`` injects into the replay.

The replay side declares what it needs (``SandboxPool``); the record side implements it
(:class:`~replay_sim.record.instances.InstancePool`); this is where the two meet, as
:class:`~replay_sim.record.forward.Forwarder` meets the ``live`` policy.
"""

from __future__ import annotations

import difflib
import os
import shutil
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path

from replay_sim.errors import ConfigError, StoreError
from replay_sim.record.config import (
    DEFAULT_SNAPSHOT_AFTER,
    DEFAULT_SNAPSHOT_MB,
    DEFAULT_SNAPSHOTS,
    RecorderConfig,
    UpstreamSpec,
)
from replay_sim.record.instances import DEFAULT_MAX_INSTANCES, DEFAULT_POOL, InstancePool
from replay_sim.record.instances.clock import recordings_began
from replay_sim.record.instances.confine import private
from replay_sim.record.instances.snapshots import StateSnapshots
from replay_sim.record.isolation import STATE_PLACEHOLDER
from replay_sim.store import Store
from replay_sim.store.records import EPISODE_ORIGINS

__all__ = ["check_sandboxes", "sandbox_pool"]


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
            found = {name: _server_paths(opened, name) for name, s in config.servers.items() if s.sandbox}
    except StoreError:
        return {}  # the replay reports an unreadable store itself
    return {name: paths for name, paths in found.items() if paths}


def _server_paths(store: Store, server: str) -> tuple[str, ...]:
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
    if isinstance(value, dict):
        for item in value.values():
            yield from _paths_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from _paths_in(item)
    elif isinstance(value, str) and len(value) < 4096 and "\n" not in value:
        path = os.path.normpath(value.removeprefix("file://")) if value.startswith(("/", "file:///")) else ""
        if path and private(path):
            yield path


def _gone(paths: Iterable[str]) -> list[str]:
    """The folders of the private paths the recordings name, when not one of them (nor a path) exists.

    Instances are shown what is there; with nothing there, a server whose recordings offer no
    canary would answer from an empty state (``File not found``) as if it were the recorded one.
    """
    paths = list(paths)
    folders = sorted({os.path.dirname(p) for p in paths})
    return [] if any(os.path.exists(p) for p in [*paths, *folders]) else folders


def _command_problem(spec: UpstreamSpec) -> str | None:
    """Why a sandbox's command cannot be started, or None (a command using ``{state}`` is not checked)."""
    command = spec.command
    if command is None or STATE_PLACEHOLDER in command:
        return None
    if os.sep in command:
        path = Path(command) if Path(command).is_absolute() or spec.cwd is None else Path(spec.cwd, command)
        if not path.is_file():
            return f"its command {command!r} does not exist"
        if not os.access(path, os.X_OK):
            return f"its command {command!r} is not executable"
        return None
    found = shutil.which(command, path=spec.env.get("PATH") or os.environ.get("PATH"))
    return None if found is not None else f"its command {command!r} is not on PATH"


def check_sandboxes(config: RecorderConfig, servers: Iterable[str], store: Store) -> None:
    """Refuse to serve sandboxes that cannot answer faithfully, naming every problem at once.

    Each served sandbox server's command exists, its ``state`` directory exists, some folder
    under ``/tmp`` its recordings name exists, and it was recorded under that name (a recorded
    server named otherwise — the name ``record`` derived from the command, a near spelling — is
    offered as a hint).

    Args:
        config: The recorder config.
        servers: The sandbox servers to serve.
        store: The served store (the server names it holds recordings or listings of).

    Raises:
        ConfigError: One line per problem.
    """
    known = sorted({s.name for s in store.servers()} | {server for server, _, _ in store.names()})
    problems = []
    for name in sorted(servers):
        spec = config.servers[name]
        found = _command_problem(spec)
        if found is not None:
            problems.append(f"sandbox {name!r}: {found}")
        if spec.state is not None and not Path(spec.state).is_dir():
            problems.append(f"sandbox {name!r}: its state directory {spec.state} does not exist")
        if gone := _gone(_server_paths(store, name)):
            problems.append(
                f"sandbox {name!r}: its recordings name paths in {', '.join(gone[:3])}, none of which "
                "exists here; restore the state it was recorded with there"
            )
        if name not in known:
            near = [n for n in [spec.default_name()] if n in known] or difflib.get_close_matches(
                name, known, 1
            )
            hint = f"; recorded as {near[0]!r}? name its table [servers.{near[0]}]" if near else ""
            problems.append(
                f"sandbox {name!r} was never recorded (recorded: {', '.join(known) or 'nothing'}){hint}"
            )
    if problems:
        raise ConfigError("--miss sandbox cannot start: " + "; ".join(problems))
