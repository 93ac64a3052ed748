"""The exceptions replay-sim raises.

Every error names the thing it is about (server, tool, path, recording id) and what to do::

    ReplaySimError
    ├── ConfigError          a config file or option is wrong (names the file and entry)
    ├── StoreError           the SQLite store cannot be read or written (names the database path)
    │   └── StoreLockedError another process held the store's write lock for longer than allowed
    ├── UpstreamError        a real MCP server failed to start or broke mid-call (names the command/URL)
    │   └── InstanceLost     a sandbox instance of a real server died before or during a call (names it)
    ├── SandboxUnavailable   no sandbox instance could be had in time (cap reached, start failed, busy)
    ├── InterchangeError     a JSONL file is malformed (names the file and line)
    ├── VectorIndexError     the vector index is missing, stale, unreadable or unwritable (names the path)
    ├── SnapshotError        a snapshot bundle is missing, tampered or unwritable (names the path)
    ├── EpisodeError         an episode id is malformed, conflicting or unknown, or the episode cap is reached
    │   └── EpisodeLost      the state an episode was served from is gone (its sandbox instance died)
    └── NestingError         JSON a peer sent nests too deeply to be read (also a ValueError)

Tool failures are never exceptions on the wire: the replay server answers them as
``CallToolResult(isError=True)``, the way a real server does.
"""

from __future__ import annotations


class ReplaySimError(Exception):
    """Root of every error replay-sim raises on purpose."""


class ConfigError(ReplaySimError):
    """A configuration file, entry or option is invalid."""


class StoreError(ReplaySimError):
    """The recording store could not be opened, read or written."""


class StoreLockedError(StoreError):
    """Another process held the store's write lock for longer than allowed: retrying later may succeed."""


class UpstreamError(ReplaySimError):
    """A recorded (real) MCP server could not be started or failed while answering."""


class InstanceLost(UpstreamError):
    """A sandbox instance of a real server exited or was killed before or during a call.

    The state it held is gone with it: the episode bound to it cannot go on there.
    """


class SandboxUnavailable(ReplaySimError):
    """No sandbox instance of a server could be had within the time allowed.

    The message says why: the cap of live instances is reached (and which setting to raise), the
    server failed to start (with the tail of its stderr), or an exclusive server is busy.
    """


class InterchangeError(ReplaySimError):
    """A JSONL interchange file is malformed."""


class VectorIndexError(ReplaySimError):
    """The vector index is missing, stale, unreadable or cannot be written."""


class SnapshotError(ReplaySimError):
    """A snapshot bundle is missing, tampered with, inconsistent or cannot be written."""


class EpisodeError(ReplaySimError):
    """An episode cannot be served: its id is malformed or conflicts, it is unknown, or too many are live.

    Attributes:
        status: The HTTP status that says so (400 malformed or conflicting, 404 unknown, 409 taken,
            410 lost, 503 the cap of live episodes reached).
    """

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class EpisodeLost(EpisodeError):
    """The state an episode (or MCP session) was served from is gone: its sandbox instance died.

    Answering on from another state would be a silent lie: every later call of the episode on that
    server gets this error (status 410, JSON-RPC code :data:`~replay_sim.protocol.LOST_CODE`).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, status=410)


class NestingError(ReplaySimError, ValueError):
    """JSON a peer sent nests deeper than :data:`replay_sim.untrusted.MAX_DEPTH` (answered ``-32700``)."""
