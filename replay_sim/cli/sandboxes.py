"""Building the sandbox instance pool that ``serve --miss sandbox`` injects into the replay.

The replay side declares what it needs (``SandboxPool``); the record side implements it
(:class:`~replay_sim.record.instances.InstancePool`); this is where the two meet, as
:class:`~replay_sim.record.forward.Forwarder` meets the ``live`` policy.
"""

from __future__ import annotations

import difflib
import os
import shutil
from collections.abc import Iterable
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
from replay_sim.record.instances.snapshots import StateSnapshots
from replay_sim.record.isolation import STATE_PLACEHOLDER
from replay_sim.store import Store

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

    Each served sandbox server's command exists, its ``state`` directory exists, and it was
    recorded under that name (a recorded server named otherwise — the name ``record`` derived from
    the command, a near spelling — is offered as a hint).

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
