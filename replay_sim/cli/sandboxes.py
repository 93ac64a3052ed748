"""The checks ``serve --miss sandbox`` makes before it starts instances (the pool itself:
:func:`replay_sim.record.instances.building.sandbox_pool`)."""

from __future__ import annotations

import difflib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from replay_sim.errors import ConfigError
from replay_sim.record.config import RecorderConfig, UpstreamSpec
from replay_sim.record.instances.building import recorded_paths
from replay_sim.record.isolation import STATE_PLACEHOLDER
from replay_sim.store import Store

__all__ = ["check_sandboxes"]


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
        if gone := _gone(recorded_paths(store, name)):
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
