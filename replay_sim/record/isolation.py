"""How a sandbox's concurrent instances are kept apart: the isolation a recorder config declares, checked.

A server declared ``sandbox = true`` may be given ``isolation`` (one of :class:`Isolation`), a
pristine ``state`` directory (named ``{state}`` in its command, args, env values or cwd) or
``mounts`` (absolute paths); :func:`isolation_problem` says in one line what does not fit, and
:meth:`Isolation.implied` what a sandbox that names none gets. The instances themselves are
started by :mod:`replay_sim.record.instances`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Protocol

from replay_sim.errors import ConfigError

__all__ = [
    "STATE_PLACEHOLDER",
    "Isolated",
    "Isolation",
    "check_recordable",
    "isolation_note",
    "isolation_problem",
    "state_placeholder_fields",
]

STATE_PLACEHOLDER = "{state}"
"""Replaced by a sandbox instance's own copy of the ``state`` directory in command, args, env and cwd."""


class Isolation(StrEnum):
    """How concurrent sandbox instances of one server are kept from seeing each other's state."""

    PROCESS = "process"
    """The state lives in the process: a fresh process is a fresh state."""
    STATE = "state"
    """The state lives in a directory the server is told (``{state}``): each instance gets a copy."""
    MOUNT = "mount"
    """The server's calls carry absolute paths: each instance sees its own copy of each path in ``mounts``
    (a private mount namespace)."""
    EXCLUSIVE = "exclusive"
    """None of these: one live instance at a time, each after the server's ``reset`` command."""

    @classmethod
    def implied(cls, *, url: bool, state: bool, mounts: bool, reset: bool) -> Isolation:
        """The isolation a sandbox gets when its config names none: the safe one for what it declares."""
        if url:
            return cls.EXCLUSIVE  # one long-lived server: nothing but its reset makes a fresh state
        if state:
            return cls.STATE
        if mounts:
            return cls.MOUNT
        return cls.EXCLUSIVE if reset else cls.PROCESS  # a reset says the state outlives the process


class Isolated(Protocol):
    """The keys of a server's config entry its isolation is checked from (a recorder config's
    :class:`~replay_sim.record.config.UpstreamSpec`)."""

    @property
    def sandbox(self) -> bool: ...

    @property
    def isolation(self) -> Isolation | None: ...

    @property
    def state(self) -> str | None: ...

    @property
    def mounts(self) -> Sequence[str]: ...

    @property
    def url(self) -> str | None: ...

    @property
    def reset(self) -> str | None: ...

    @property
    def command(self) -> str | None: ...

    @property
    def args(self) -> Sequence[str]: ...

    @property
    def env(self) -> Mapping[str, str]: ...

    @property
    def cwd(self) -> str | None: ...


def isolation_problem(spec: Isolated) -> str | None:
    """What is wrong with a spec's sandbox isolation settings (one line naming the key), or None."""
    kind, placeholder = spec.isolation, state_placeholder_fields(spec)
    if not spec.sandbox:
        given = [k for k, v in (("isolation", kind), ("state", spec.state), ("mounts", spec.mounts)) if v]
        if given:
            return f"{given[0]!r} applies to a sandbox: add sandbox = true"
    if spec.state is None and placeholder:
        return f"{placeholder[0]!r} uses {{state}} but no 'state' directory is given"
    if spec.state is not None:
        if not os.path.isabs(spec.state):
            return f"'state' must be an absolute path (the pristine state directory), got {spec.state!r}"
        if kind not in (None, Isolation.STATE):
            return f"'state' needs isolation = \"state\", not {kind.value!r}"
        if not placeholder:
            return "'state' is copied per instance but no command, args, env or cwd uses {state}"
    if spec.mounts:
        if kind not in (None, Isolation.MOUNT):
            return f"'mounts' needs isolation = \"mount\", not {kind.value!r}"
        for path in spec.mounts:
            if not os.path.isabs(path) or os.path.normpath(path) == "/":
                return f"'mounts' entries must be absolute paths below /, got {path!r}"
        if len(set(spec.mounts)) != len(spec.mounts):
            return "'mounts' lists a path twice"
    if kind is Isolation.STATE and spec.state is None:
        return "isolation = \"state\" needs a 'state' directory"
    if kind is Isolation.MOUNT and not spec.mounts:
        return "isolation = \"mount\" needs 'mounts', the absolute paths each instance gets a copy of"
    if kind is not None and kind is not Isolation.EXCLUSIVE and spec.url is not None:
        return f'isolation = {kind.value!r} needs a command: a url upstream can only be "exclusive"'
    if kind is Isolation.EXCLUSIVE and spec.reset is None:
        return "isolation = \"exclusive\" needs a 'reset' command (run before each instance)"
    return None


def isolation_note(spec: Isolated) -> str | None:
    """What a sandbox's isolation keys do now that instances are confined (one line), or None.

    Every confined instance sees the host through a copy-on-write layer of its own, so a state at a
    fixed path is already private: ``mounts`` is not needed (kept, each path is still copied per
    instance and bound in its view), and ``process`` isolation is as safe as ``state``.
    """
    if spec.sandbox and spec.mounts:
        return (
            "'mounts' is not needed: each confined instance writes to its own copy-on-write view of "
            "the host (kept, each path is copied per instance); it matters only with --unconfined-sandboxes"
        )
    return None


def state_placeholder_fields(spec: Isolated) -> list[str]:
    """The fields whose values use ``{state}``."""
    fields = [("command", [spec.command or ""]), ("args", spec.args), ("env", spec.env.values())]
    fields.append(("cwd", [spec.cwd or ""]))
    return [name for name, values in fields if any(STATE_PLACEHOLDER in v for v in values)]


def check_recordable(name: str, spec: Isolated) -> None:
    """Refuse to record a server whose config holds ``{state}`` placeholders the recorder cannot fill.

    Only a sandbox instance fills ``{state}`` (with its own copy of ``state``); a recorder would
    start the server with the literal text, and its recordings would not start from that state.

    Raises:
        ConfigError: Naming the server, the fields and what to do.
    """
    fields = state_placeholder_fields(spec)
    if fields:
        raise ConfigError(
            f"[servers.{name}] uses {STATE_PLACEHOLDER} in {', '.join(fields)}, which only a sandbox "
            "instance fills (with a copy of 'state'); `record` cannot fill it: record with a config "
            f"naming a real path instead (a copy of {spec.state}), then serve with this one"
        )
