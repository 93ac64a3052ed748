"""The miss-policy extension point: what the core hands a policy, and what it gets back.

A call no recording answers with certainty is a :class:`Miss`; a :class:`MissPolicy` turns it into
the :class:`~replay_sim.resolve.resolution.Resolution` served. The core answers with
:class:`ErrorPolicy` (the miss itself, rendered as a diagnosable error) unless another is handed in;
the others live in :mod:`replay_sim.replay.policies`, by name in its registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from replay_sim.replay.core.episodes import History
from replay_sim.resolve.lineage import Trail
from replay_sim.resolve.resolution import Resolution

__all__ = ["ErrorPolicy", "Miss", "MissPolicy"]


@dataclass(frozen=True, slots=True)
class Miss:
    """A call the resolver could not answer with certainty."""

    server: str
    method: str
    params: dict[str, Any]
    resolution: Resolution
    tool: dict[str, Any] | None = None
    """The tool's (or prompt's) entry from the recorded listing, when there is one."""
    trail: Trail | None = None
    """The history of the episode (or MCP session) asking, on this server; None for a request with
    none. The ``sandbox`` policy binds its instance to it."""
    owner: History | None = None
    """The episode or connection history ``trail`` belongs to (what the ``sandbox`` policy counts in)."""


class MissPolicy(Protocol):
    """Decides the answer to a call no recording answers with certainty."""

    async def answer(self, miss: Miss) -> Resolution:
        """Return the resolution to serve: the miss itself, or one carrying a recording."""
        ...


class ErrorPolicy:
    """Serve the miss as an error (the replay server renders its candidates and diffs)."""

    async def answer(self, miss: Miss) -> Resolution:
        """Return the miss unchanged."""
        return miss.resolution
