"""What a replay server can be told, and its defaults: read by ``replay-sim serve``'s options.

Nothing here imports the MCP SDK or the resolver: a ``serve --stdio`` start declares its options
(and may answer its first requests, :mod:`replay_sim.replay.stdio.start`) before they are loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "DEFAULT_EPISODE_BURST",
    "DEFAULT_EPISODE_IDLE_TIMEOUT",
    "DEFAULT_EPISODE_RATE",
    "DEFAULT_MAX_EPISODES",
    "DEFAULT_SANDBOX_CALL_LIMIT",
    "DEFAULT_SANDBOX_IDLE",
    "Limits",
    "MissDetail",
    "MissPolicyName",
]

DEFAULT_MAX_EPISODES = 100_000
"""Live episodes at most (``serve --max-episodes``); one more is refused, none is evicted."""
DEFAULT_EPISODE_IDLE_TIMEOUT = 600.0
"""Seconds after which an episode that made no request expires (``serve --episode-idle-timeout``)."""
DEFAULT_EPISODE_RATE = 1_000.0
"""New episodes a second, sustained (``serve --episode-rate``): past it, and past the burst, refused."""
DEFAULT_EPISODE_BURST = 10_000
"""New episodes created at once before :data:`DEFAULT_EPISODE_RATE` applies (a batch of rollouts)."""
DEFAULT_SANDBOX_IDLE = 5.0
"""Seconds an episode's sandbox instance stays bound without a call before it is given back
(``serve --sandbox-idle``); the episode's next call rebuilds it."""
DEFAULT_SANDBOX_CALL_LIMIT = 120.0
"""Seconds one call to a sandbox instance may take at most, progress or not
(``serve --sandbox-call-limit``)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """How much the replay server takes on at once.

    Attributes:
        session_idle_timeout: Seconds after which a session that made no request ends (None: never).
            Long enough for a rollout's slowest model turn, short enough that abandoned sessions go.
        max_sessions: Open sessions per recorded server (None: unbounded); one more gets ``503``.
        max_concurrent: MCP requests in flight, over every server, from which a request that would
            open a session waits for one to finish; requests of open sessions are still served.
        admission_wait: Seconds a request that would open a session waits for its turn while
            ``max_concurrent`` requests are in flight; then ``503`` (0: refused at once).
        body_timeout: Seconds a client has to send a request's body after its headers (None: no limit).
        retry_after: Seconds a refused client is told to wait (``Retry-After``).
        max_episodes: Live named episodes; a new one past it is refused (``503``), none evicted.
        episode_idle_timeout: Seconds after which an episode that made no request expires (None: never).
        episode_rate: New episodes a second, sustained, once ``episode_burst`` is spent (past it: ``503``).
        episode_burst: New episodes that may be created at once (a batch of rollouts starting).
        episode_client_share: The part of ``episode_rate`` and ``episode_burst`` one client (one
            address) may take, so that one flooding client leaves the rest to the others (1: any
            client may take all of it).
    """

    session_idle_timeout: float | None = 600.0
    max_sessions: int | None = 10_000
    max_concurrent: int = 512
    admission_wait: float = 10.0
    body_timeout: float | None = 30.0
    retry_after: int = 1
    max_episodes: int = DEFAULT_MAX_EPISODES
    episode_idle_timeout: float | None = DEFAULT_EPISODE_IDLE_TIMEOUT
    episode_rate: float = DEFAULT_EPISODE_RATE
    episode_burst: int = DEFAULT_EPISODE_BURST
    episode_client_share: float = 0.5


class MissPolicyName(StrEnum):
    """The miss policies a replay server can run with."""

    ERROR = "error"
    """Answer with an error naming the nearest candidates and the fields that differ (default)."""
    NEAREST = "nearest"
    """Serve the closest candidate recording, marked ``nearest`` in the provenance."""
    LIVE = "live"
    """Forward the call to the real server from the recorder config, record the answer and serve it."""
    SANDBOX = "sandbox"
    """Answer from the episode's own instance of the real server, brought to the episode's state by
    re-playing its state-changing calls; record the answer (:mod:`~replay_sim.replay.policies.sandbox`)."""
    SYNTHESIZE = "synthesize"
    """Ask an LLM at an OpenAI-compatible URL for a plausible answer; stored with origin ``synthetic``."""


class MissDetail(StrEnum):
    """How much a miss tells the client (its text and ``_meta`` candidates)."""

    FULL = "full"
    """The reason, and the nearest recordings with the arguments in which they differ (debugging)."""
    REASON = "reason"
    """The reason, and the nearest recordings' ids and scores with the names of the fields that
    differ, but none of their values: nothing a policy in training can copy arguments from."""
    NONE = "none"
    """Only that no recording matches: no reason, no candidates."""
