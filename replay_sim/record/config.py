"""What to record: upstreams and redaction rules, and the recorder config file (TOML) naming them.

An :class:`UpstreamSpec` says how to reach one real server; a :class:`RecorderConfig` holds the
upstreams by recorded server name and the redaction rules.

Example (``server/record.example.toml`` is the annotated version)::

    [redaction]
    keys = ["*access*token", "*secret*", "*password*", "authorization", "*api*key"]
    patterns = ["ghp_[A-Za-z0-9]{36}"]
    replacement = "[REDACTED]"

    [servers.git]
    command = "mcp-server-git"
    args = ["--repository", "."]
    env = { GIT_TOKEN = "${GIT_TOKEN}" }
    explore = true         # learn which argument differences its read-only tools ignore
    reset = "git checkout -- . && git clean -fdq"   # back to the state its recordings start from
    sandbox = true         # its state can be thrown away: `replay-sim explore` may repeat any call

    [servers.memory]
    command = "mcp-server-memory"
    env = { MEMORY_FILE_PATH = "{state}/memory.jsonl" }
    sandbox = true
    state = "/srv/memory-pristine"   # copied per sandbox instance; {state} is the copy's path
    # isolation = "state"            # implied by `state` (see Isolation)

    [servers.remote]
    url = "http://127.0.0.1:9000/mcp"
    headers = { Authorization = "Bearer ${REMOTE_TOKEN}" }
    timeout = 300          # seconds per request (default 60, restarted by progress; 0: no limit)

``${NAME}`` in ``env``/``headers`` values is read from the recorder's environment, so secrets need
not live in the file. Reading and checking the file is :mod:`replay_sim.record.config_file`'s: every
mistake raises :class:`ConfigError` naming the file, the entry and what is wrong.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from replay_sim.record.containment import Containment
from replay_sim.record.isolation import Isolation, isolation_problem
from replay_sim.redaction import Redactor

__all__ = [
    "DEFAULT_MAX_INSTANCES",
    "DEFAULT_POOL",
    "DEFAULT_SNAPSHOTS",
    "DEFAULT_SNAPSHOT_AFTER",
    "DEFAULT_SNAPSHOT_MB",
    "DEFAULT_TIMEOUT",
    "RecorderConfig",
    "UpstreamSpec",
]

DEFAULT_TIMEOUT = 60.0
"""Seconds an upstream may take to answer one request (or to report progress on it) by default:
the request timeout of the TypeScript MCP SDK's clients, so a proxied client gets an answer before
most would give up on their own."""

DEFAULT_POOL = 1
"""Warm instances kept ready per sandbox server by default."""
DEFAULT_MAX_INSTANCES = 32
"""Live instances across servers by default (warm ones included)."""
DEFAULT_SNAPSHOTS = 64
"""State snapshots of sandbox instances kept at most by default (``--sandbox-snapshots``; 0: none)."""
DEFAULT_SNAPSHOT_MB = 1024
"""Megabytes of state snapshots kept at most by default (``--sandbox-snapshot-mb``)."""
DEFAULT_SNAPSHOT_AFTER = 4
"""State-changing calls a state holds at least before it is snapshotted or started from (fewer are
cheaper re-played on a warm instance)."""


@dataclass(frozen=True)
class UpstreamSpec:
    """How to reach one real MCP server: a command (stdio) or a URL (streamable HTTP).

    Attributes:
        command: Executable to launch (stdio); exclusive with ``url``.
        args: Arguments of ``command``.
        env: Extra environment for ``command`` (merged over the SDK's safe default set); the values
            are redacted from recordings.
        cwd: Working directory for ``command``.
        url: Streamable HTTP endpoint; exclusive with ``command``.
        headers: HTTP headers sent to ``url``; the values are redacted from recordings.
        timeout: Seconds to wait for one answer, restarted by each progress notification the
            server sends about it (None: no limit). A request that times out is answered with a
            ``REQUEST_TIMEOUT`` error naming the server and is not recorded.
        startup_timeout: Seconds to wait for the server to answer ``initialize``.
        explore: While recording, ask the server which argument differences its read-only tools
            ignore (:mod:`replay_sim.record.explore`).
        reset: A shell command that puts the server's state back to the one its recordings start
            from (restores a data folder, a database, a repository), run before each session
            ``replay-sim backfill`` and ``replay-sim explore`` open; in the ``cwd`` when given.
        sandbox: The server's state can be thrown away: ``replay-sim explore`` may repeat any
            recorded call, each time in a fresh session from the initial state, to learn which
            tools change state (:mod:`replay_sim.record.sandbox`). A fresh session is a fresh
            process for a command; a state that outlives it (files, a database) needs ``reset``,
            and a ``url`` upstream always does.
        isolation: For a sandbox, how its concurrent instances are kept apart (:class:`Isolation`);
            None when not a sandbox. Left out, it is implied by ``state``, ``mounts``, ``reset``
            and ``url`` (:meth:`Isolation.implied`).
        state: A pristine state directory, copied for each sandbox instance; ``{state}`` in command,
            args, env values and cwd is replaced by the copy's path (isolation ``state``).
        mounts: Absolute paths each sandbox instance sees its own copy of, at the same path
            (isolation ``mount``).
        miss: ``"sandbox"``: ``replay-sim serve --config`` answers this server's misses from its
            sandbox instances whatever ``--miss`` says for the others; None: ``--miss`` decides.
        containment: A sandbox instance's network, clock and limits (:mod:`replay_sim.record.containment`).
    """

    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = DEFAULT_TIMEOUT
    startup_timeout: float = 30.0
    explore: bool = False
    reset: str | None = None
    sandbox: bool = False
    isolation: Isolation | None = None
    state: str | None = None
    mounts: tuple[str, ...] = ()
    miss: str | None = None
    containment: Containment = field(default_factory=Containment)

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError("an upstream needs exactly one of command or url")
        if self.sandbox and self.url is not None and self.reset is None:
            raise ValueError(
                "a url upstream is a sandbox only with a reset command (its state outlives a session)"
            )
        if problem := isolation_problem(self):
            raise ValueError(problem)
        if self.sandbox and self.isolation is None:
            implied = Isolation.implied(
                url=self.url is not None, state=self.state is not None, mounts=bool(self.mounts),
                reset=self.reset is not None,
            )  # fmt: skip
            object.__setattr__(self, "isolation", implied)

    def describe(self) -> str:
        """The command line or URL, for messages."""
        if self.url is not None:
            return self.url
        return shlex.join([self.command or "", *self.args])

    def secrets(self) -> list[str]:
        """Values handed to the server that must never be recorded (env values, header values)."""
        found = list(self.env.values())
        for value in self.headers.values():
            found.append(value)
            scheme, _, credential = value.partition(" ")
            if credential and scheme.isalpha():  # "Bearer abc" -> also the bare credential
                found.append(credential.strip())
                if scheme.lower() == "basic":  # base64 of "user:password": both decoded forms too
                    found += _basic_credentials(credential.strip())
        return found

    def default_name(self) -> str:
        """A server name derived from the command or URL (``mcp-server-git``, ``echo_server``)."""
        if self.url is not None:
            parts = [p for p in re.split(r"[/:?#]+", self.url.split("//", 1)[-1]) if p]
            base = parts[-1] if len(parts) > 1 and parts[-1] != "mcp" else parts[0]
        else:
            words = [self.command or "", *self.args]
            interpreters = {"python", "python3", "node", "npx", "uv", "uvx", "deno", "bun", "pipx"}
            base = Path(words[0]).name
            if base in interpreters:
                base = next((Path(w).stem for w in words[1:] if not w.startswith("-")), base)
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-") or "server"


def _basic_credentials(credential: str) -> list[str]:
    """``user:password`` and ``password`` of a Basic credential (none when it is not base64 text)."""
    try:
        decoded = base64.b64decode(credential, validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return []
    _, colon, password = decoded.partition(":")
    return [decoded, password] if colon and password else [decoded]


@dataclass(frozen=True)
class RecorderConfig:
    """A parsed recorder config: upstreams by server name, and the redaction rules."""

    servers: dict[str, UpstreamSpec]
    redactor: Redactor = field(default_factory=Redactor)

    def recorded_redactor(self) -> Redactor:
        """The redaction rules with every upstream's secret values: what the recorder applied."""
        return self.redactor.with_secrets(
            secret for spec in self.servers.values() for secret in spec.secrets()
        )
