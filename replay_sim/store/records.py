"""What the store holds, as Python values: recorded servers and calls, and where an answer came from."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

__all__ = ["Origin", "Recording", "ServerRecord", "utc_now"]


class Origin(StrEnum):
    """Where a recorded answer came from."""

    LIVE = "live"
    """Recorded from a real server through the recording proxy (or the `live` miss policy)."""
    IMPORT = "import"
    """Read from a JSONL interchange file that did not say otherwise."""
    SYNTHETIC = "synthetic"
    """Made up by an LLM under the `synthesize` miss policy; never a real server's answer."""
    EXPLORE = "explore"
    """Asked by the recorder itself (``explore``): a variant of a client's read-only call."""
    SANDBOX = "sandbox"
    """Answered by an episode's own instance of a real server (the `sandbox` miss policy), in a session
    holding the episode's re-played state-changing calls before it."""
    BACKFILL = "backfill"
    """Asked by ``replay-sim backfill``: a call a replay missed, asked from the state it was missed in."""


EPISODE_ORIGINS = frozenset({Origin.SANDBOX, Origin.BACKFILL, Origin.SYNTHETIC})
"""Origins of answers made for a replayed episode's calls: their arguments are that episode's."""


def utc_now() -> str:
    """Return the current UTC time as an ISO-8601 string with a ``Z`` suffix (microseconds).

    Every recorded call is stamped while its client waits: the seconds are formatted once each.
    """
    seconds, nanoseconds = divmod(time.time_ns(), 1_000_000_000)
    return f"{_second(seconds)}.{nanoseconds // 1000:06d}Z"


@functools.lru_cache(maxsize=2)
def _second(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


@dataclass(frozen=True, slots=True)
class ServerRecord:
    """A recorded server: what it said about itself at initialisation."""

    name: str
    info: dict[str, Any]
    capabilities: dict[str, Any]
    protocol_version: str | None = None
    instructions: str | None = None


@dataclass(frozen=True, slots=True)
class Recording:
    """One recorded request and the real server's answer (a result or a JSON-RPC error)."""

    id: int
    server: str
    method: str
    name: str
    arguments: dict[str, Any]
    params: dict[str, Any]
    key: str
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    session: str | None
    seq: int | None
    latency_ms: float | None
    recorded_at: str
    origin: str
    notifications: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failure(self) -> Literal["error", "isError"] | None:
        """How the call failed: a JSON-RPC ``error``, an ``isError`` result, or ``None`` when it did not."""
        if self.error is not None:
            return "error"
        return "isError" if (self.result or {}).get("isError") else None

    @property
    def failed(self) -> bool:
        """True when the real server refused or failed the call (a failed call changes nothing)."""
        return self.failure is not None
